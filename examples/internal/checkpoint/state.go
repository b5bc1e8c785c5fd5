package checkpoint

import (
	"fmt"
	"math"

	"gorgonia.org/tensor"
)

// Store is a model's parameter store as a checkpoint sees it: named
// learnable tensors and BatchNorm layers, wherever they live, read and
// written through the host.
type Store interface {
	// Names lists the learnable tensors; Value is one of them, where it
	// lives (for its shape).
	Names() []string
	Value(name string) *tensor.Dense
	HostValue(name string) (*tensor.Dense, error)
	SetValue(name string, values []float32) error
	// BatchNorms lists the BatchNorm layers; RunningStats are one's
	// statistics, where they live (for their shape).
	BatchNorms() []string
	RunningStats(name string) (mean, variance *tensor.Dense)
	HostRunningStats(name string) (mean, variance *tensor.Dense, err error)
	SetRunningStats(name string, mean, variance []float32) error
}

// Optimizer is a training graph's optimiser as a checkpoint sees it: its
// step count and, by parameter name, its moments in host memory.
type Optimizer interface {
	OptimizerState() (steps int, moments map[string][2]*tensor.Dense, err error)
	SetOptimizerState(steps int, moments map[string][2]*tensor.Dense) error
}

// AdamState is AdamW's step count and moments.
type AdamState struct {
	Step int
	M, V []NamedTensor
}

// State is what a checkpoint keeps of a model and its optimiser: the
// weights, the BatchNorm statistics ("<layer>.mean" and "<layer>.var") and
// AdamW's state. The examples' checkpoints hold these three as fields of
// the same names.
type State struct {
	Params  []NamedTensor
	BNStats []NamedTensor
	Adam    AdamState
}

// NotFiniteError is Snapshot's refusal of weights that are not finite
// numbers: such a run is lost, and the previous checkpoint is worth more.
type NotFiniteError struct {
	Name  string  // the tensor
	Value float32 // its first value that is not finite
}

func (e *NotFiniteError) Error() string {
	return fmt.Sprintf("checkpoint: the weights of %s are not finite (%v)", e.Name, e.Value)
}

// Snapshot copies the tensors of s, and the state of opt (nil: none),
// through the host. Weights that are not finite numbers give a
// *NotFiniteError.
func Snapshot(s Store, opt Optimizer) (State, error) {
	var st State
	var moments map[string][2]*tensor.Dense
	if opt != nil {
		var err error
		if st.Adam.Step, moments, err = opt.OptimizerState(); err != nil {
			return State{}, err
		}
	}
	for _, name := range s.Names() {
		t, err := s.HostValue(name)
		if err != nil {
			return State{}, err
		}
		for _, v := range t.Float32s() {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return State{}, &NotFiniteError{Name: name, Value: v}
			}
		}
		st.Params = append(st.Params, Named(name, t))
		if mv, ok := moments[name]; ok {
			st.Adam.M = append(st.Adam.M, Named(name, mv[0]))
			st.Adam.V = append(st.Adam.V, Named(name, mv[1]))
		}
	}
	for _, name := range s.BatchNorms() {
		mean, variance, err := s.HostRunningStats(name)
		if err != nil {
			return State{}, err
		}
		st.BNStats = append(st.BNStats, Named(name+".mean", mean), Named(name+".var", variance))
	}
	return st, nil
}

// Restore copies st's weights and statistics into s, wherever its tensors
// live, and its optimiser state into opt (nil: none). Every tensor of s
// must be in st with its shape.
func (st State) Restore(s Store, opt Optimizer) error {
	byName := map[string]NamedTensor{}
	for _, t := range append(append([]NamedTensor{}, st.Params...), st.BNStats...) {
		byName[t.Name] = t
	}
	find := func(name string, shape tensor.Shape) ([]float32, error) {
		t, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("checkpoint: no tensor %s", name)
		}
		return t.Values(shape)
	}
	for _, name := range s.Names() {
		d, err := find(name, s.Value(name).Shape())
		if err == nil {
			err = s.SetValue(name, d)
		}
		if err != nil {
			return err
		}
	}
	for _, name := range s.BatchNorms() {
		mean, _ := s.RunningStats(name)
		m, err := find(name+".mean", mean.Shape())
		if err != nil {
			return err
		}
		v, err := find(name+".var", mean.Shape())
		if err != nil {
			return err
		}
		if err := s.SetRunningStats(name, m, v); err != nil {
			return err
		}
	}
	if opt == nil {
		return nil
	}
	moments := map[string][2]*tensor.Dense{}
	if len(st.Adam.M) != len(st.Adam.V) {
		return fmt.Errorf("checkpoint: %d first and %d second moments", len(st.Adam.M), len(st.Adam.V))
	}
	for i, m := range st.Adam.M {
		v := st.Adam.V[i]
		if v.Name != m.Name {
			return fmt.Errorf("checkpoint: moments %d are of %s and %s", i, m.Name, v.Name)
		}
		moments[m.Name] = [2]*tensor.Dense{m.Dense(), v.Dense()}
	}
	if st.Adam.Step == 0 && len(moments) == 0 {
		return nil // saved before any step: the optimiser is as new
	}
	return opt.SetOptimizerState(st.Adam.Step, moments)
}
