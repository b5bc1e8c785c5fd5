package model

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/examples/internal/tensorstore"
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
// or on one GPU (NewParams's device), in a tensorstore.Store whose methods
// it has. Every graph Build makes (training and inference alike) binds its
// nodes to these very tensors, so an optimiser that updates them in place,
// or a checkpoint loaded into them, changes every graph at once.
//
// Tensors are created, and initialised from the seed, the first time a
// graph asks for them, in the order the builder asks: the same config,
// seed and dtype give the same initial model on either device. On a GPU
// they are initialised on the host, copied there, and stay there for the
// run; HostValue, HostRunningStats, SetValue and SetRunningStats read and
// write them through the host (checkpoints). Free gives the device memory
// back.
//
// Frozen lists the tensors that are not learnable: BackboneResNet50's stem
// and layer1 convolutions and its BatchNorms' weight and bias, the
// reference's frozen parameters and FrozenBatchNorm2d buffers.
type Params struct {
	*tensorstore.Store
	seed   uint64
	groups map[string]Group
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
	s, err := tensorstore.New(dt, rand.New(rand.NewPCG(seed, 0xde7a)), dev)
	if err != nil {
		return nil, fmt.Errorf("model: NewParams: %w", err)
	}
	return &Params{Store: s, seed: seed, groups: map[string]Group{}}, nil
}

// Group is the optimiser group of the named tensor.
func (p *Params) Group(name string) Group { return p.groups[name] }

// The initialisers the builder uses.
type initializer = tensorstore.Init

var (
	zeros       = tensorstore.Zeros
	constant    = tensorstore.Constant
	normal      = tensorstore.Normal
	uniform     = tensorstore.Uniform
	values      = tensorstore.Values
	xavier      = tensorstore.Xavier
	kaiming     = tensorstore.Kaiming
	torchLinear = tensorstore.TorchLinear
	denseOf     = tensorstore.DenseOf
)

// tensorFor returns the named learnable tensor, creating and initialising
// it on first use in the given optimiser group; later calls must ask for
// the same shape.
func (p *Params) tensorFor(name string, shape []int, in initializer, group Group) (*tensor.Dense, error) {
	t, created, err := p.TensorFor(name, shape, in)
	if created {
		p.groups[name] = group
	}
	return t, err
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
