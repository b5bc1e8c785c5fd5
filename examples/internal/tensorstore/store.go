package tensorstore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// Store holds named tensors of one dtype where they live: in host memory
// or on one GPU.
type Store struct {
	dev         *backend.Device // nil: the host
	dt          tensor.Dtype
	rng         *rand.Rand
	names       []string
	values      map[string]*tensor.Dense
	frozenNames []string
	frozen      map[string]*tensor.Dense
	bns         []string
	stats       map[string][2]*tensor.Dense
}

// New returns an empty store of dtype dt (tensor.Float32 or
// tensor.Float64) whose tensors are initialised from rng and live on dev
// (nil: the host).
func New(dt tensor.Dtype, rng *rand.Rand, dev *backend.Device) (*Store, error) {
	if dt != tensor.Float32 && dt != tensor.Float64 {
		return nil, fmt.Errorf("tensorstore: dtype must be float32 or float64, got %v", dt)
	}
	return &Store{
		dev:    dev,
		dt:     dt,
		rng:    rng,
		values: map[string]*tensor.Dense{},
		frozen: map[string]*tensor.Dense{},
		stats:  map[string][2]*tensor.Dense{},
	}, nil
}

// Device is where the tensors live (nil: the host).
func (s *Store) Device() *backend.Device { return s.dev }

// Dtype is the dtype of every tensor.
func (s *Store) Dtype() tensor.Dtype { return s.dt }

// Names lists the learnable tensors in creation order.
func (s *Store) Names() []string { return slices.Clone(s.names) }

// Value is the named learnable tensor, where it lives (nil if there is
// none). A device tensor's memory cannot be read from the host: use
// HostValue.
func (s *Store) Value(name string) *tensor.Dense { return s.values[name] }

// Frozen lists the tensors that are not learnable (no gradient, no
// optimiser), in creation order. They are initialised from the same
// random stream as the learnable ones; HostValue and SetValue reach them
// by name too.
func (s *Store) Frozen() []string { return slices.Clone(s.frozenNames) }

// BatchNorms lists the BatchNorm layers in creation order.
func (s *Store) BatchNorms() []string { return slices.Clone(s.bns) }

// RunningStats returns the named BatchNorm layer's running mean and
// variance, where they live (see Value).
func (s *Store) RunningStats(name string) (mean, variance *tensor.Dense) {
	st := s.stats[name]
	return st[0], st[1]
}

// Size is the number of learnable scalars.
func (s *Store) Size() int {
	n := 0
	for _, v := range s.values {
		n += v.Shape().TotalSize()
	}
	return n
}

// lookup finds a learnable or frozen tensor by name.
func (s *Store) lookup(name string) (*tensor.Dense, bool) {
	if t, ok := s.values[name]; ok {
		return t, true
	}
	t, ok := s.frozen[name]
	return t, ok
}

// TensorFor returns the named learnable tensor, creating it from in on
// first use (created reports that); later calls must ask for the same
// shape.
func (s *Store) TensorFor(name string, shape []int, in Init) (t *tensor.Dense, created bool, err error) {
	if _, ok := s.frozen[name]; ok {
		return nil, false, fmt.Errorf("tensorstore: %s is a frozen tensor, the graph asks for a learnable one", name)
	}
	if t, ok := s.values[name]; ok {
		if !t.Shape().Eq(tensor.Shape(shape)) {
			return nil, false, fmt.Errorf("tensorstore: parameter %s has shape %v, the graph asks for %v", name, t.Shape(), shape)
		}
		return t, false, nil
	}
	n := tensor.Shape(shape).TotalSize()
	if t, err = s.place(DenseOf(s.dt, in(s.rng, n), shape...)); err != nil {
		return nil, false, fmt.Errorf("tensorstore: parameter %s: %w", name, err)
	}
	s.names = append(s.names, name)
	s.values[name] = t
	return t, true, nil
}

// FrozenFor is TensorFor of a tensor that is not learnable.
func (s *Store) FrozenFor(name string, shape []int, in Init) (*tensor.Dense, error) {
	if _, ok := s.values[name]; ok {
		return nil, fmt.Errorf("tensorstore: %s is a learnable parameter, the graph asks for a frozen one", name)
	}
	if t, ok := s.frozen[name]; ok {
		if !t.Shape().Eq(tensor.Shape(shape)) {
			return nil, fmt.Errorf("tensorstore: frozen tensor %s has shape %v, the graph asks for %v", name, t.Shape(), shape)
		}
		return t, nil
	}
	n := tensor.Shape(shape).TotalSize()
	t, err := s.place(DenseOf(s.dt, in(s.rng, n), shape...))
	if err != nil {
		return nil, fmt.Errorf("tensorstore: frozen tensor %s: %w", name, err)
	}
	s.frozenNames = append(s.frozenNames, name)
	s.frozen[name] = t
	return t, nil
}

// StatsFor returns the named BatchNorm layer's running statistics,
// creating them (mean 0, variance 1, as PyTorch) on first use.
func (s *Store) StatsFor(name string, channels int) (mean, variance *tensor.Dense, err error) {
	if st, ok := s.stats[name]; ok {
		if st[0].Shape()[0] != channels {
			return nil, nil, fmt.Errorf("tensorstore: BatchNorm %s has %d channels, the graph asks for %d", name, st[0].Shape()[0], channels)
		}
		return st[0], st[1], nil
	}
	mean = DenseOf(s.dt, make([]float64, channels), channels)
	variance = DenseOf(s.dt, Constant(1)(nil, channels), channels)
	if mean, err = s.place(mean); err == nil {
		variance, err = s.place(variance)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("tensorstore: BatchNorm %s: %w", name, err)
	}
	s.bns = append(s.bns, name)
	s.stats[name] = [2]*tensor.Dense{mean, variance}
	return mean, variance, nil
}

// place moves a new host tensor where the store keeps its tensors. It must
// not run inside a backend.Scope, which would free it at the scope's end:
// the graphs are built outside the steps' scopes.
func (s *Store) place(t *tensor.Dense) (*tensor.Dense, error) {
	if s.dev == nil {
		return t, nil
	}
	if s.dev.OpenScope() != nil {
		return nil, fmt.Errorf("created inside a backend.Scope: build the graphs before the steps")
	}
	return s.dev.ToDevice(t)
}

// hostCopy returns t's values in host memory: t itself on the host, a copy
// from the device (which waits for the GPU's queued work).
func (s *Store) hostCopy(t *tensor.Dense) (*tensor.Dense, error) {
	if s.dev == nil || !backend.IsDevice(t) {
		return t, nil
	}
	return s.dev.ToHost(t)
}

// load copies src into t, where t lives.
func (s *Store) load(t *tensor.Dense, src []float32) error {
	if len(src) != t.Shape().TotalSize() {
		return fmt.Errorf("%d values for a tensor of shape %v", len(src), t.Shape())
	}
	if s.dev == nil || !backend.IsDevice(t) {
		switch d := t.Data().(type) {
		case []float32:
			copy(d, src)
		case []float64:
			for i, v := range src {
				d[i] = float64(v)
			}
		}
		return nil
	}
	h := tensor.New(tensor.WithShape(t.Shape()...), tensor.WithBacking(src))
	if s.dt != tensor.Float32 {
		h = tensor.New(tensor.WithShape(t.Shape()...), tensor.Of(s.dt))
		if err := s.load(h, src); err != nil {
			return err
		}
	}
	return s.dev.Engine().Memcpy(t, h)
}

// HostValue returns the named tensor's values (learnable or frozen) in
// host memory: the tensor itself on the host, a copy of it on a GPU.
func (s *Store) HostValue(name string) (*tensor.Dense, error) {
	t, ok := s.lookup(name)
	if !ok {
		return nil, fmt.Errorf("tensorstore: no parameter %s", name)
	}
	return s.hostCopy(t)
}

// SetValue copies values (as many as the tensor has) into the named
// tensor (learnable or frozen), where it lives.
func (s *Store) SetValue(name string, values []float32) error {
	t, ok := s.lookup(name)
	if !ok {
		return fmt.Errorf("tensorstore: no parameter %s", name)
	}
	if err := s.load(t, values); err != nil {
		return fmt.Errorf("tensorstore: parameter %s: %w", name, err)
	}
	return nil
}

// HostRunningStats returns the named BatchNorm layer's running mean and
// variance in host memory (copies of them on a GPU).
func (s *Store) HostRunningStats(name string) (mean, variance *tensor.Dense, err error) {
	st, ok := s.stats[name]
	if !ok {
		return nil, nil, fmt.Errorf("tensorstore: no BatchNorm %s", name)
	}
	if mean, err = s.hostCopy(st[0]); err != nil {
		return nil, nil, err
	}
	variance, err = s.hostCopy(st[1])
	return mean, variance, err
}

// SetRunningStats copies a BatchNorm layer's running mean and variance
// into its tensors, where they live.
func (s *Store) SetRunningStats(name string, mean, variance []float32) error {
	st, ok := s.stats[name]
	if !ok {
		return fmt.Errorf("tensorstore: no BatchNorm %s", name)
	}
	for i, src := range [2][]float32{mean, variance} {
		if err := s.load(st[i], src); err != nil {
			return fmt.Errorf("tensorstore: BatchNorm %s's running %s: %w", name, [2]string{"mean", "variance"}[i], err)
		}
	}
	return nil
}

// Free gives the device memory of the tensors back (nothing on the host).
// The store and the graphs bound to it cannot be used afterwards.
func (s *Store) Free() error {
	if s.dev == nil {
		return nil
	}
	var errs []error
	for _, name := range s.names {
		errs = append(errs, s.dev.FreeDense(s.values[name]))
	}
	for _, name := range s.frozenNames {
		errs = append(errs, s.dev.FreeDense(s.frozen[name]))
	}
	for _, name := range s.bns {
		errs = append(errs, s.dev.FreeDense(s.stats[name][0]), s.dev.FreeDense(s.stats[name][1]))
	}
	s.values, s.stats, s.names, s.bns = map[string]*tensor.Dense{}, map[string][2]*tensor.Dense{}, nil, nil
	s.frozen, s.frozenNames = map[string]*tensor.Dense{}, nil
	return errors.Join(errs...)
}
