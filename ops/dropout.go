package ops

import (
	"fmt"
	"sync/atomic"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels"
)

// DropoutRNG is the random state of a model's Dropout nodes: a seed, the
// training step, and whether the model is training. A gorgonia graph is
// built once and run again every step, its ops unchanged; the masks must
// change from step to step all the same, reproducibly. So a Dropout node
// holds no mask and no generator state: it draws its mask when it runs,
// from a counter-based generator (Philox-4x32-10) keyed by the seed and
// counted by the step, the node's stream (the order in which the nodes
// sharing this DropoutRNG were built) and the element's index. The same
// seed, step and graph give the same masks on every run, on the CPU and
// on the GPU, bit for bit; the backward op draws the forward's mask again
// rather than saving it.
//
// The training loop calls Next once per step, between runs (never while
// the graph runs: the forward and the backward of a step must see the same
// step), and SetTraining(false) to evaluate with the same graph: Dropout is
// then the identity. Build the nodes in the same order to get the same
// streams (and masks) in another process; SetStep resumes a run from a
// checkpoint. A DropoutRNG is safe for use by several goroutines.
type DropoutRNG struct {
	seed     uint64
	step     atomic.Uint64
	off      atomic.Bool // not training
	children atomic.Uint32
}

// NewDropoutRNG returns the state for seed, at step 0, training.
func NewDropoutRNG(seed uint64) *DropoutRNG { return &DropoutRNG{seed: seed} }

// Seed returns the seed.
func (r *DropoutRNG) Seed() uint64 { return r.seed }

// Next advances to the next training step, so that every Dropout node
// draws a new mask from its next run on, and returns the new step.
func (r *DropoutRNG) Next() uint64 { return r.step.Add(1) }

// Step returns the step the Dropout nodes draw their masks for.
func (r *DropoutRNG) Step() uint64 { return r.step.Load() }

// SetStep sets the step, as when resuming training from a checkpoint.
func (r *DropoutRNG) SetStep(step uint64) { r.step.Store(step) }

// SetTraining switches dropout on (training, the start) or off (the
// identity, for evaluation).
func (r *DropoutRNG) SetTraining(on bool) { r.off.Store(!on) }

// Training says whether dropout is on.
func (r *DropoutRNG) Training() bool { return !r.off.Load() }

// Dropout is torch.nn.functional.dropout(x, p, training): while rng is
// training, each element of x is zeroed with probability p and the others
// are scaled by 1/(1-p) (rounded to x's dtype as PyTorch rounds it), so
// that the expected output is x; otherwise, or with p = 0, y is x. x
// times 0, as in PyTorch: a NaN or an infinity of x gives NaN where it is
// dropped. The masks come from rng (see DropoutRNG): a new one each step,
// the same for the same seed, step and node on any device; they are not
// PyTorch's masks, which come from another generator.
//
// x may have any shape (at most 2^34 elements); p must be in [0, 1).
// Differentiable with respect to x: dx = dy * mask * 1/(1-p), the mask
// drawn again from the counter (no mask is saved). Every pass reads and
// writes each element once, on the GPU too, with no host round trip.
func Dropout(x *G.Node, p float64, rng *DropoutRNG) (*G.Node, error) {
	const op = "Dropout"
	if rng == nil {
		return nil, fmt.Errorf("ops: %s: rng is nil, want a *DropoutRNG (NewDropoutRNG)", op)
	}
	if !(p >= 0 && p < 1) {
		return nil, fmt.Errorf("ops: %s: p must be in [0, 1), got %v", op, p)
	}
	xs, dt, err := floatTensor(op, x)
	if err != nil {
		return nil, err
	}
	if n := xs.TotalSize(); n > kernels.DropoutMaxElements {
		return nil, fmt.Errorf("ops: %s: x %v has %d elements, more than the 2^34 its mask counts", op, xs, n)
	}
	// The stream is taken even for p = 0, so that the nodes built after
	// this one get the same streams whatever p is.
	s := dropoutShape{x: xs.Clone(), p: p, rng: rng, stream: rng.children.Add(1) - 1, dt: dt}
	if p == 0 {
		return x, nil
	}
	return G.ApplyOp(dropoutOp(s, false), x)
}

// dropoutShape is a checked Dropout node: x's shape, p, its DropoutRNG and
// stream, the dtype.
type dropoutShape struct {
	x      tensor.Shape
	p      float64
	rng    *DropoutRNG
	stream uint32
	dt     tensor.Dtype
}

// String names every parameter but the step and the training flag, which
// the op reads when it runs: a node stays the same node from step to step.
// The DropoutRNG's address keeps two of them apart.
func (s dropoutShape) String() string {
	return fmt.Sprintf("x=%v,p=%v,seed=%d,stream=%d,rng=%p,%v", s.x, s.p, s.rng.seed, s.stream, s.rng, s.dt)
}

// params is the mask and scale of the current step (the identity outside
// training).
func (s dropoutShape) params() kernels.DropoutParams {
	p := kernels.DropoutParams{N: s.x.TotalSize(), Seed: s.rng.seed, Stream: s.stream, Step: s.rng.Step(), Keep: kernels.DropoutKeepAll, Scale: 1}
	if s.rng.Training() {
		p.Keep, p.Scale = kernels.DropoutKeep(s.p), kernels.DropoutScale(s.p, int(s.dt.Size()))
	}
	return p
}

// dropoutOp is y = x * mask * scale; backward, the same of dy: dx = dy *
// mask * scale. Either's gradient is the backward op of its gradient.
func dropoutOp(s dropoutShape, backward bool) *specOp {
	name := "Dropout"
	if backward {
		name = "Dropout backward"
	}
	return newOp(&opSpec{
		name: name, config: s.String(),
		inputs: []argSpec{{name: "x", shape: s.x}}, out: s.x, dtype: s.dt,
		cpu: func(in []*tensor.Dense, out *tensor.Dense) error {
			return floatTwin(s.params(), dropoutTwin[float32], dropoutTwin[float64])(in, out)
		},
		device:  s.device(name),
		diffWRT: []bool{true},
		grad: func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			dx, err := G.ApplyOp(dropoutOp(s, true), grad)
			if err != nil {
				return nil, fmt.Errorf("ops: %s: gradient: %w", name, err)
			}
			return G.Nodes{dx}, nil
		},
	})
}

func dropoutTwin[T kernels.Float](p kernels.DropoutParams, in [][]T, y []T) error {
	kernels.Dropout(p, in[0], y)
	return nil
}
