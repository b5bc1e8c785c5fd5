package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"gorgonia.org/tensor"
)

// Group is the optimiser group a learnable tensor belongs to: the
// reference trains the backbone and the linear projections that make
// sampling locations (every deformable attention's sampling offsets, and
// the decoder's reference points) at a tenth of the learning rate.
type Group int

const (
	// GroupTransformer: everything else, at the base learning rate
	// (the reference's lr 2e-4).
	GroupTransformer Group = iota
	// GroupBackbone: the backbone's convolutions and BatchNorms, at
	// BackboneLRMult times the base rate (the reference's lr_backbone
	// 2e-5). The input projections are not part of it.
	GroupBackbone
	// GroupLinearProj: sampling offsets and reference points, at
	// LinearProjLRMult times the base rate (lr_linear_proj_mult).
	GroupLinearProj
)

// The reference's learning-rate multipliers of the groups.
const (
	BackboneLRMult   = 0.1
	LinearProjLRMult = 0.1
)

func (g Group) String() string {
	switch g {
	case GroupTransformer:
		return "transformer"
	case GroupBackbone:
		return "backbone"
	case GroupLinearProj:
		return "linear-proj"
	}
	return fmt.Sprintf("Group(%d)", int(g))
}

// Params holds the model's state on the host: its learnable tensors and
// the running statistics of its BatchNorm layers, by name, in one dtype.
// Every graph Build makes binds its nodes to these tensors (on the host)
// or to device copies of them (Net.SyncParams copies those back).
//
// Tensors are created, and initialised from the seed, the first time a
// graph asks for them, in the order the builder asks: the same config,
// seed and dtype give the same initial model.
type Params struct {
	dt     tensor.Dtype
	rng    *rand.Rand
	names  []string
	values map[string]*tensor.Dense
	groups map[string]Group
	bns    []string
	stats  map[string][2]*tensor.Dense
}

// NewParams returns an empty parameter store of dtype dt (tensor.Float32
// or tensor.Float64) whose tensors will be initialised from seed.
func NewParams(seed uint64, dt tensor.Dtype) (*Params, error) {
	if dt != tensor.Float32 && dt != tensor.Float64 {
		return nil, fmt.Errorf("model: NewParams: dtype must be float32 or float64, got %v", dt)
	}
	return &Params{
		dt:     dt,
		rng:    rand.New(rand.NewPCG(seed, 0xde7a)),
		values: map[string]*tensor.Dense{},
		groups: map[string]Group{},
		stats:  map[string][2]*tensor.Dense{},
	}, nil
}

// Dtype is the dtype of every tensor.
func (p *Params) Dtype() tensor.Dtype { return p.dt }

// Names lists the learnable tensors in creation order.
func (p *Params) Names() []string { return slices.Clone(p.names) }

// Value is the named learnable tensor, nil if there is none.
func (p *Params) Value(name string) *tensor.Dense { return p.values[name] }

// Group is the optimiser group of the named tensor.
func (p *Params) Group(name string) Group { return p.groups[name] }

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

// initializer makes a tensor's first values, n of them, from the store's
// random stream.
type initializer func(rng *rand.Rand, n int) []float64

func zeros() initializer { return constant(0) }

func constant(v float64) initializer {
	return func(_ *rand.Rand, n int) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
}

func normal(std float64) initializer {
	return func(rng *rand.Rand, n int) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = rng.NormFloat64() * std
		}
		return out
	}
}

func uniform(bound float64) initializer {
	return func(rng *rand.Rand, n int) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = (2*rng.Float64() - 1) * bound
		}
		return out
	}
}

// values starts a tensor at vs (len n).
func values(vs []float64) initializer {
	return func(_ *rand.Rand, n int) []float64 { return slices.Clone(vs[:n]) }
}

// xavier is torch.nn.init.xavier_uniform_ (gain 1): uniform of bound
// sqrt(6/(fanIn+fanOut)).
func xavier(fanIn, fanOut int) initializer {
	return uniform(math.Sqrt(6 / float64(fanIn+fanOut)))
}

// kaiming is He initialisation for a ReLU layer: normal with variance
// 2/fan (torchvision's ResNets use fan_out).
func kaiming(fan int) initializer { return normal(math.Sqrt(2 / float64(fan))) }

// torchLinear is nn.Linear's default init of its weight and bias (kaiming
// uniform with a = sqrt(5) for the weight): uniform of bound
// 1/sqrt(fanIn) for both.
func torchLinear(fanIn int) initializer { return uniform(1 / math.Sqrt(float64(fanIn))) }

// tensorFor returns the named tensor, creating and initialising it on first
// use; later calls must ask for the same shape.
func (p *Params) tensorFor(name string, shape []int, in initializer, group Group) (*tensor.Dense, error) {
	if t, ok := p.values[name]; ok {
		if !t.Shape().Eq(tensor.Shape(shape)) {
			return nil, fmt.Errorf("model: parameter %s has shape %v, the graph asks for %v", name, t.Shape(), shape)
		}
		return t, nil
	}
	n := tensor.Shape(shape).TotalSize()
	t := denseOf(p.dt, in(p.rng, n), shape...)
	p.names = append(p.names, name)
	p.values[name] = t
	p.groups[name] = group
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
	mean = denseOf(p.dt, make([]float64, channels), channels)
	variance = denseOf(p.dt, constant(1)(nil, channels), channels)
	p.bns = append(p.bns, name)
	p.stats[name] = [2]*tensor.Dense{mean, variance}
	return mean, variance, nil
}

// denseOf is a tensor of dtype dt holding vs.
func denseOf(dt tensor.Dtype, vs []float64, shape ...int) *tensor.Dense {
	if dt == tensor.Float64 {
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(vs))
	}
	f := make([]float32, len(vs))
	for i, v := range vs {
		f[i] = float32(v)
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(f))
}

// float64sOf copies a host tensor's values (float32 or float64) to
// float64.
func float64sOf(t *tensor.Dense) ([]float64, error) {
	if t.IsView() {
		t = t.Materialize().(*tensor.Dense)
	}
	switch d := t.Data().(type) {
	case []float64:
		return slices.Clone(d), nil
	case []float32:
		out := make([]float64, len(d))
		for i, v := range d {
			out[i] = float64(v)
		}
		return out, nil
	case float64:
		return []float64{d}, nil
	case float32:
		return []float64{float64(d)}, nil
	}
	return nil, fmt.Errorf("model: want a float32 or float64 tensor, got %v", t.Dtype())
}
