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

// Params holds the model's state: its learnable tensors and the running
// statistics of its BatchNorm layers, by name, in one dtype, in host memory
// or on one GPU (NewParams's device). Every graph Build makes (training and
// inference alike) binds its nodes to these very tensors, so an optimiser
// that updates them in place, or a checkpoint loaded into them, changes
// every graph at once.
//
// Tensors are created, and initialised from the seed, the first time a
// graph asks for them, in the order the builder asks: the same config,
// seed and dtype give the same initial model on either device. On a GPU
// they are initialised on the host, copied there, and stay there for the
// run; HostValue, HostRunningStats, SetValue and SetRunningStats read and
// write them through the host (checkpoints). Free gives the device memory
// back.
type Params struct {
	dev    *backend.Device // nil: the host
	dt     tensor.Dtype
	seed   uint64
	rng    *rand.Rand
	names  []string
	values map[string]*tensor.Dense
	groups map[string]Group
	// frozen are the tensors that are not learnable: BackboneResNet50's
	// frozen convolutions and its BatchNorms' fixed affine constants.
	frozenNames []string
	frozen      map[string]*tensor.Dense
	bns         []string
	stats       map[string][2]*tensor.Dense
}

// NewParams returns an empty float32 parameter store whose tensors will be
// initialised from seed and live on dev (nil: the host). Graphs that use it
// are built for the same device.
func NewParams(seed uint64, dev *backend.Device) *Params {
	p, _ := newParams(seed, tensor.Float32, dev)
	return p
}

// newParams is NewParams of dtype dt (tensor.Float32 or tensor.Float64, the
// gradient check's).
func newParams(seed uint64, dt tensor.Dtype, dev *backend.Device) (*Params, error) {
	if dt != tensor.Float32 && dt != tensor.Float64 {
		return nil, fmt.Errorf("model: NewParams: dtype must be float32 or float64, got %v", dt)
	}
	return &Params{
		dev:    dev,
		dt:     dt,
		seed:   seed,
		rng:    rand.New(rand.NewPCG(seed, 0xde7a)),
		values: map[string]*tensor.Dense{},
		groups: map[string]Group{},
		frozen: map[string]*tensor.Dense{},
		stats:  map[string][2]*tensor.Dense{},
	}, nil
}

// Device is where the tensors live (nil: the host).
func (p *Params) Device() *backend.Device { return p.dev }

// Dtype is the dtype of every tensor.
func (p *Params) Dtype() tensor.Dtype { return p.dt }

// Names lists the learnable tensors in creation order.
func (p *Params) Names() []string { return slices.Clone(p.names) }

// Value is the named learnable tensor, where it lives (nil if there is
// none). A device tensor's memory cannot be read from the host: use
// HostValue.
func (p *Params) Value(name string) *tensor.Dense { return p.values[name] }

// Frozen lists the tensors that are not learnable (no gradient, no
// optimiser), in creation order: BackboneResNet50's stem and layer1
// convolutions and its BatchNorms' weight and bias, the reference's
// frozen parameters and FrozenBatchNorm2d buffers. They are initialised
// from the seed in the same stream as the learnable ones; HostValue and
// SetValue reach them by name too.
func (p *Params) Frozen() []string { return slices.Clone(p.frozenNames) }

// Group is the optimiser group of the named tensor.
func (p *Params) Group(name string) Group { return p.groups[name] }

// BatchNorms lists the BatchNorm layers in creation order.
func (p *Params) BatchNorms() []string { return slices.Clone(p.bns) }

// RunningStats returns the named BatchNorm layer's running mean and
// variance, where they live (see Value).
func (p *Params) RunningStats(name string) (mean, variance *tensor.Dense) {
	s := p.stats[name]
	return s[0], s[1]
}

// lookup finds a learnable or frozen tensor by name.
func (p *Params) lookup(name string) (*tensor.Dense, bool) {
	if t, ok := p.values[name]; ok {
		return t, true
	}
	t, ok := p.frozen[name]
	return t, ok
}

// Size is the number of learnable scalars.
func (p *Params) Size() int {
	n := 0
	for _, v := range p.values {
		n += v.Shape().TotalSize()
	}
	return n
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
	h := tensor.New(tensor.WithShape(t.Shape()...), tensor.Of(p.dt))
	if err := p.load(h, src); err != nil {
		return err
	}
	return p.dev.Engine().Memcpy(t, h)
}

// HostValue returns the named tensor's values (learnable or frozen) in
// host memory: the tensor itself on the host, a copy of it on a GPU.
func (p *Params) HostValue(name string) (*tensor.Dense, error) {
	t, ok := p.lookup(name)
	if !ok {
		return nil, fmt.Errorf("model: no parameter %s", name)
	}
	return p.hostCopy(t)
}

// SetValue copies values (as many as the tensor has) into the named
// tensor (learnable or frozen), where it lives.
func (p *Params) SetValue(name string, values []float32) error {
	t, ok := p.lookup(name)
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
	for _, name := range p.frozenNames {
		errs = append(errs, p.dev.FreeDense(p.frozen[name]))
	}
	for _, name := range p.bns {
		errs = append(errs, p.dev.FreeDense(p.stats[name][0]), p.dev.FreeDense(p.stats[name][1]))
	}
	p.values, p.stats, p.names, p.bns = map[string]*tensor.Dense{}, map[string][2]*tensor.Dense{}, nil, nil
	p.frozen, p.frozenNames = map[string]*tensor.Dense{}, nil
	return errors.Join(errs...)
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
	if _, ok := p.frozen[name]; ok {
		return nil, fmt.Errorf("model: %s is a frozen tensor, the graph asks for a learnable one", name)
	}
	if t, ok := p.values[name]; ok {
		if !t.Shape().Eq(tensor.Shape(shape)) {
			return nil, fmt.Errorf("model: parameter %s has shape %v, the graph asks for %v", name, t.Shape(), shape)
		}
		return t, nil
	}
	n := tensor.Shape(shape).TotalSize()
	t, err := p.place(denseOf(p.dt, in(p.rng, n), shape...))
	if err != nil {
		return nil, fmt.Errorf("model: parameter %s: %w", name, err)
	}
	p.names = append(p.names, name)
	p.values[name] = t
	p.groups[name] = group
	return t, nil
}

// frozenFor is tensorFor of a tensor that is not learnable.
func (p *Params) frozenFor(name string, shape []int, in initializer) (*tensor.Dense, error) {
	if _, ok := p.values[name]; ok {
		return nil, fmt.Errorf("model: %s is a learnable parameter, the graph asks for a frozen one", name)
	}
	if t, ok := p.frozen[name]; ok {
		if !t.Shape().Eq(tensor.Shape(shape)) {
			return nil, fmt.Errorf("model: frozen tensor %s has shape %v, the graph asks for %v", name, t.Shape(), shape)
		}
		return t, nil
	}
	n := tensor.Shape(shape).TotalSize()
	t, err := p.place(denseOf(p.dt, in(p.rng, n), shape...))
	if err != nil {
		return nil, fmt.Errorf("model: frozen tensor %s: %w", name, err)
	}
	p.frozenNames = append(p.frozenNames, name)
	p.frozen[name] = t
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
