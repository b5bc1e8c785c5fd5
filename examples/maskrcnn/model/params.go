package model

import (
	"math/rand/v2"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/examples/internal/tensorstore"
)

// Params holds the model's state: its learnable tensors and the running
// statistics of its BatchNorm layers, by name, in host memory or on one GPU
// (NewParams's device), in a float32 tensorstore.Store whose methods it
// has. Every graph Build makes (training and inference alike) binds its
// nodes to these very tensors, so an optimiser that updates them in place,
// or a checkpoint that is loaded into them, changes every graph at once.
//
// Tensors are created, and initialised from the seed, the first time a
// graph asks for them, in the order the builder asks: the same config and
// seed give the same initial model on either device. On a GPU they are
// initialised on the host and copied there, and stay there for the run;
// HostValue, HostRunningStats, SetValue and SetRunningStats read and write
// them through the host (checkpoints).
type Params struct {
	*tensorstore.Store
	decay map[string]bool
}

// NewParams returns an empty parameter store whose tensors will be
// initialised from seed and live on dev (nil: the host). Graphs that use it
// must be built for the same device.
func NewParams(seed uint64, dev *backend.Device) *Params {
	s, _ := tensorstore.New(tensor.Float32, rand.New(rand.NewPCG(seed, 0x9a7a)), dev) // float32: no error
	return &Params{Store: s, decay: map[string]bool{}}
}

// Decays reports whether weight decay applies to the named tensor:
// convolution and fully connected weights, not biases or BatchNorm's scale
// and shift.
func (p *Params) Decays(name string) bool { return p.decay[name] }

// The initialisers the builder uses.
type initializer = tensorstore.Init

var (
	zeros    = tensorstore.Zeros
	constant = tensorstore.Constant
	normal   = tensorstore.Normal
	kaiming  = tensorstore.Kaiming
)

// tensorFor returns the named tensor, creating and initialising it on first
// use, with weight decay or not; later calls must ask for the same shape.
func (p *Params) tensorFor(name string, shape []int, in initializer, decay bool) (*tensor.Dense, error) {
	t, created, err := p.TensorFor(name, shape, in)
	if created {
		p.decay[name] = decay
	}
	return t, err
}
