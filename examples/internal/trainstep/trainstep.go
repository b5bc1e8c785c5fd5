package trainstep

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/ops"
)

// Begin opens a run of a graph: on a device (dev not nil), a
// backend.Scope for the run's memory. end closes the scope, then calls
// reset (the machine's Reset) whatever the scope's error.
func Begin(dev *backend.Device, reset func()) (end func() error, err error) {
	if dev == nil {
		return func() error { reset(); return nil }, nil
	}
	scope, err := dev.BeginScope()
	if err != nil {
		return nil, fmt.Errorf("trainstep: %w", err)
	}
	return func() error {
		err := scope.End()
		reset()
		return err
	}, nil
}

// State returns opt's step count and, by parameter name (names[i] is
// params[i]'s), its moments in host memory: copies of them if they live
// on dev. It is what a checkpoint keeps.
func State(opt *ops.AdamW, dev *backend.Device, names []string, params []G.ValueGrad) (steps int, moments map[string][2]*tensor.Dense, err error) {
	moments = map[string][2]*tensor.Dense{}
	for i, p := range params {
		m, v, err := opt.Moments(p)
		if err != nil {
			return 0, nil, fmt.Errorf("trainstep: %w", err)
		}
		if dev != nil && backend.IsDevice(m) {
			if m, err = dev.ToHost(m); err == nil {
				v, err = dev.ToHost(v)
			}
			if err != nil {
				return 0, nil, fmt.Errorf("trainstep: reading the optimiser's state: %w", err)
			}
		}
		moments[names[i]] = [2]*tensor.Dense{m, v}
	}
	return opt.Steps(), moments, nil
}

// SetState restores opt from State's values (a checkpoint's), which must
// hold every one of params (names[i] is params[i]'s).
func SetState(opt *ops.AdamW, names []string, params []G.ValueGrad, steps int, moments map[string][2]*tensor.Dense) error {
	state := map[G.ValueGrad][2]*tensor.Dense{}
	for i, p := range params {
		mv, ok := moments[names[i]]
		if !ok {
			return fmt.Errorf("trainstep: the optimiser's state has no moments for %s", names[i])
		}
		state[p] = mv
	}
	if err := opt.SetState(steps, state); err != nil {
		return fmt.Errorf("trainstep: %w", err)
	}
	return nil
}
