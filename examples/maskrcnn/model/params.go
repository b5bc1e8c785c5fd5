package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"gorgonia.org/tensor"
)

// Params holds the model's state on the host: its learnable tensors and
// the running statistics of its BatchNorm layers, by name. Every graph
// Build makes (training and inference alike) binds its nodes to these very
// tensors, so an optimiser that updates them in place, or a checkpoint that
// is loaded into them, changes every graph at once.
//
// Tensors are created, and initialised from the seed, the first time a
// graph asks for them, in the order the builder asks: the same config and
// seed give the same initial model.
type Params struct {
	rng    *rand.Rand
	names  []string
	values map[string]*tensor.Dense
	decay  map[string]bool
	bns    []string
	stats  map[string][2]*tensor.Dense
}

// NewParams returns an empty parameter store whose tensors will be
// initialised from seed.
func NewParams(seed uint64) *Params {
	return &Params{
		rng:    rand.New(rand.NewPCG(seed, 0x9a7a)),
		values: map[string]*tensor.Dense{},
		decay:  map[string]bool{},
		stats:  map[string][2]*tensor.Dense{},
	}
}

// Names lists the learnable tensors in creation order.
func (p *Params) Names() []string { return slices.Clone(p.names) }

// Value is the named learnable tensor, nil if there is none.
func (p *Params) Value(name string) *tensor.Dense { return p.values[name] }

// Decays reports whether weight decay applies to the named tensor:
// convolution and fully connected weights, not biases or BatchNorm's scale
// and shift.
func (p *Params) Decays(name string) bool { return p.decay[name] }

// BatchNorms lists the BatchNorm layers in creation order.
func (p *Params) BatchNorms() []string { return slices.Clone(p.bns) }

// RunningStats returns the named BatchNorm layer's running mean and
// variance.
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
	p.bns = append(p.bns, name)
	p.stats[name] = [2]*tensor.Dense{mean, variance}
	return mean, variance, nil
}
