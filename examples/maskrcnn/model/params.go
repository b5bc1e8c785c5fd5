package model

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// Params holds the model's state: its learnable tensors and the running
// statistics of its BatchNorm layers, by name, in host memory or on one GPU
// (NewParams's device). Every graph Build makes (training and inference
// alike) binds its nodes to these very tensors, so an optimiser that
// updates them in place, or a checkpoint that is loaded into them, changes
// every graph at once.
//
// Tensors are created, and initialised from the seed, the first time a
// graph asks for them, in the order the builder asks: the same config and
// seed give the same initial model on either device. On a GPU they are
// initialised on the host and copied there, and stay there for the run;
// HostValue, HostRunningStats, SetValue and SetRunningStats read and write
// them through the host (checkpoints).
type Params struct {
	dev    *backend.Device // nil: the host
	rng    *rand.Rand
	names  []string
	values map[string]*tensor.Dense
	decay  map[string]bool
	bns    []string
	stats  map[string][2]*tensor.Dense
}

// NewParams returns an empty parameter store whose tensors will be
// initialised from seed and live on dev (nil: the host). Graphs that use it
// must be built for the same device.
func NewParams(seed uint64, dev *backend.Device) *Params {
	return &Params{
		dev:    dev,
		rng:    rand.New(rand.NewPCG(seed, 0x9a7a)),
		values: map[string]*tensor.Dense{},
		decay:  map[string]bool{},
		stats:  map[string][2]*tensor.Dense{},
	}
}

// Device is where the tensors live (nil: the host).
func (p *Params) Device() *backend.Device { return p.dev }

// Names lists the learnable tensors in creation order.
func (p *Params) Names() []string { return slices.Clone(p.names) }

// Value is the named learnable tensor, where it lives (nil if there is
// none). A device tensor's memory cannot be read from the host: use
// HostValue.
func (p *Params) Value(name string) *tensor.Dense { return p.values[name] }

// Decays reports whether weight decay applies to the named tensor:
// convolution and fully connected weights, not biases or BatchNorm's scale
// and shift.
func (p *Params) Decays(name string) bool { return p.decay[name] }

// BatchNorms lists the BatchNorm layers in creation order.
func (p *Params) BatchNorms() []string { return slices.Clone(p.bns) }

// RunningStats returns the named BatchNorm layer's running mean and
// variance, where they live (see Value).
func (p *Params) RunningStats(name string) (mean, variance *tensor.Dense) {
	s := p.stats[name]
	return s[0], s[1]
}

// Size is the number of learnable scalars.
func (p *Params) Size() int {
	n := 0
	for _, v := range p.values {
		n += v.Shape().TotalSize()
	}
	return n
}

// initializer names how a tensor starts.
type initializer struct {
	kind  int // initZeros, initConst, initNormal
	value float64
}

const (
	initZeros = iota
	initConst
	initNormal // value is the standard deviation
)

func zeros() initializer             { return initializer{kind: initZeros} }
func constant(v float64) initializer { return initializer{kind: initConst, value: v} }
func normal(std float64) initializer { return initializer{kind: initNormal, value: std} }

// kaiming is He initialisation for a ReLU layer: normal with variance
// 2/fan (torchvision initialises its ResNets and mask head with fan_out).
func kaiming(fan int) initializer { return normal(math.Sqrt(2 / float64(fan))) }

// tensorFor returns the named tensor, creating and initialising it on first
// use; later calls must ask for the same shape.
func (p *Params) tensorFor(name string, shape []int, in initializer, decay bool) (*tensor.Dense, error) {
	if t, ok := p.values[name]; ok {
		if !t.Shape().Eq(tensor.Shape(shape)) {
			return nil, fmt.Errorf("model: parameter %s has shape %v, the graph asks for %v", name, t.Shape(), shape)
		}
		return t, nil
	}
	t := tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(shape...))
	d := t.Float32s()
	switch in.kind {
	case initConst:
		for i := range d {
			d[i] = float32(in.value)
		}
	case initNormal:
		for i := range d {
			d[i] = float32(p.rng.NormFloat64() * in.value)
		}
	}
	t, err := p.place(t)
	if err != nil {
		return nil, fmt.Errorf("model: parameter %s: %w", name, err)
	}
	p.names = append(p.names, name)
	p.values[name] = t
	p.decay[name] = decay
	return t, nil
}

// statsFor returns the named BatchNorm layer's running statistics, creating
// them (mean 0, variance 1, as PyTorch) on first use.
func (p *Params) statsFor(name string, channels int) (mean, variance *tensor.Dense, err error) {
	if s, ok := p.stats[name]; ok {
		if s[0].Shape()[0] != channels {
			return nil, nil, fmt.Errorf("model: BatchNorm %s has %d channels, the graph asks for %d", name, s[0].Shape()[0], channels)
		}
		return s[0], s[1], nil
	}
	mean = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(channels))
	variance = tensor.New(tensor.Of(tensor.Float32), tensor.WithShape(channels))
	for i := range variance.Float32s() {
		variance.Float32s()[i] = 1
	}
	if mean, err = p.place(mean); err == nil {
		variance, err = p.place(variance)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("model: BatchNorm %s: %w", name, err)
	}
	p.bns = append(p.bns, name)
	p.stats[name] = [2]*tensor.Dense{mean, variance}
	return mean, variance, nil
}

// place moves a new host tensor where the store keeps its tensors. It must
// not run inside a backend.Scope, which would free it at the scope's end:
// Build runs outside the steps' scopes.
func (p *Params) place(t *tensor.Dense) (*tensor.Dense, error) {
	if p.dev == nil {
		return t, nil
	}
	if p.dev.OpenScope() != nil {
		return nil, fmt.Errorf("created inside a backend.Scope: build the graphs before the steps")
	}
	return p.dev.ToDevice(t)
}

// hostCopy returns t's values in host memory: t itself on the host, a copy
// from the device (which waits for the GPU's queued work).
func (p *Params) hostCopy(t *tensor.Dense) (*tensor.Dense, error) {
	if p.dev == nil || !backend.IsDevice(t) {
		return t, nil
	}
	return p.dev.ToHost(t)
}

// load copies src into t, where t lives.
func (p *Params) load(t *tensor.Dense, src []float32) error {
	if len(src) != t.Shape().TotalSize() {
		return fmt.Errorf("%d values for a tensor of shape %v", len(src), t.Shape())
	}
	if p.dev == nil || !backend.IsDevice(t) {
		copy(t.Float32s(), src)
		return nil
	}
	return p.dev.Engine().Memcpy(t, tensor.New(tensor.WithShape(len(src)), tensor.WithBacking(src)))
}

// HostValue returns the named learnable tensor's values in host memory:
// the tensor itself on the host, a copy of it on a GPU.
func (p *Params) HostValue(name string) (*tensor.Dense, error) {
	t, ok := p.values[name]
	if !ok {
		return nil, fmt.Errorf("model: no parameter %s", name)
	}
	return p.hostCopy(t)
}

// SetValue copies values (as many as the tensor has) into the named
// learnable tensor, where it lives.
func (p *Params) SetValue(name string, values []float32) error {
	t, ok := p.values[name]
	if !ok {
		return fmt.Errorf("model: no parameter %s", name)
	}
	if err := p.load(t, values); err != nil {
		return fmt.Errorf("model: parameter %s: %w", name, err)
	}
	return nil
}

// HostRunningStats returns the named BatchNorm layer's running mean and
// variance in host memory (copies of them on a GPU).
func (p *Params) HostRunningStats(name string) (mean, variance *tensor.Dense, err error) {
	s, ok := p.stats[name]
	if !ok {
		return nil, nil, fmt.Errorf("model: no BatchNorm %s", name)
	}
	if mean, err = p.hostCopy(s[0]); err != nil {
		return nil, nil, err
	}
	variance, err = p.hostCopy(s[1])
	return mean, variance, err
}

// SetRunningStats copies a BatchNorm layer's running mean and variance
// into its tensors, where they live.
func (p *Params) SetRunningStats(name string, mean, variance []float32) error {
	s, ok := p.stats[name]
	if !ok {
		return fmt.Errorf("model: no BatchNorm %s", name)
	}
	for i, src := range [2][]float32{mean, variance} {
		if err := p.load(s[i], src); err != nil {
			return fmt.Errorf("model: BatchNorm %s's running %s: %w", name, [2]string{"mean", "variance"}[i], err)
		}
	}
	return nil
}

// Free gives the device memory of the tensors back (nothing on the host).
// The store and the graphs bound to it cannot be used afterwards.
func (p *Params) Free() error {
	if p.dev == nil {
		return nil
	}
	var errs []error
	for _, name := range p.names {
		errs = append(errs, p.dev.FreeDense(p.values[name]))
	}
	for _, name := range p.bns {
		errs = append(errs, p.dev.FreeDense(p.stats[name][0]), p.dev.FreeDense(p.stats[name][1]))
	}
	p.values, p.stats, p.names, p.bns = map[string]*tensor.Dense{}, map[string][2]*tensor.Dense{}, nil, nil
	return errors.Join(errs...)
}
