package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// layerNormGPUCase is a LayerNorm's x shape and whether it has gamma and
// beta.
type layerNormGPUCase struct {
	x           []int
	gamma, beta bool
	nanRow      bool // a NaN in row 1
}

func (c layerNormGPUCase) String() string {
	s := fmt.Sprintf("x=%v/gamma=%t/beta=%t", c.x, c.gamma, c.beta)
	if c.nanRow {
		s += "/nan_row"
	}
	return s
}

// layerNormGPUCases cover every kernel: DETR's encoder tokens and decoder
// queries (warp row1k in float32, row4k in float64), rows of 1 KiB and 4
// KiB, block rows of 16-byte chunks (1032 floats, 4096 doubles) and of
// single elements (1, 3, 7, 1030), a rank-1 x, every combination of gamma
// and beta, and a row holding a NaN.
var layerNormGPUCases = []layerNormGPUCase{
	{x: []int{2, 22223, 256}, gamma: true, beta: true},
	{x: []int{2, 300, 256}, gamma: true, beta: true},
	{x: []int{2, 300, 256}},
	{x: []int{7}, gamma: true, beta: true},
	{x: []int{5, 1}, gamma: true, beta: true},
	{x: []int{13, 3}, gamma: true},
	{x: []int{9, 32}, beta: true},
	{x: []int{600, 512}, gamma: true, beta: true},
	{x: []int{37, 1024}, gamma: true, beta: true},
	{x: []int{3, 1030}, gamma: true, beta: true},
	{x: []int{3000, 1032}, gamma: true, beta: true},
	{x: []int{4, 4096}, gamma: true},
	{x: []int{13, 256}, gamma: true, beta: true, nanRow: true},
	{x: []int{5, 1030}, gamma: true, beta: true, nanRow: true},
}

// layerNormGPUChecks returns the case's three ops with inputs drawn for
// them: the forward (x[, gamma][, beta]), dx (x[, gamma], dy) and the
// column sums ([x,] dy), the last only with gamma or beta.
func layerNormGPUChecks(t testing.TB, rng *rand.Rand, c layerNormGPUCase, dt tensor.Dtype) (ops []*specOp, inputs [][]*tensor.Dense) {
	t.Helper()
	g := G.NewGraph()
	cs := c.x[len(c.x)-1]
	xn := G.NewTensor(g, dt, len(c.x), G.WithShape(c.x...))
	var gn, bn *G.Node
	if c.gamma {
		gn = G.NewVector(g, dt, G.WithShape(cs))
	}
	if c.beta {
		bn = G.NewVector(g, dt, G.WithShape(cs))
	}
	s, err := layerNormShapeOf(xn, gn, bn, DefaultEps)
	if err != nil {
		t.Fatal(err)
	}
	x := randTensor(rng, dt, -1, 1, c.x...)
	if c.nanRow {
		xs := toFloat64s(t, x)
		xs[cs+cs/2] = math.NaN()
		x = fromFloat64s(dt, xs, c.x...)
	}
	dy := randTensor(rng, dt, -1, 1, c.x...)
	fwd, dxIn, paramsIn := []*tensor.Dense{x}, []*tensor.Dense{x}, []*tensor.Dense{}
	if c.gamma {
		gamma := randTensor(rng, dt, 0.5, 1.5, cs)
		fwd, dxIn, paramsIn = append(fwd, gamma), append(dxIn, gamma), append(paramsIn, x)
	}
	if c.beta {
		fwd = append(fwd, randTensor(rng, dt, -1, 1, cs))
	}
	ops = []*specOp{layerNormOp(s), layerNormGradXOp(s)}
	inputs = [][]*tensor.Dense{fwd, append(dxIn, dy)}
	if s.sums() > 0 {
		ops, inputs = append(ops, layerNormGradParamsOp(s)), append(inputs, append(paramsIn, dy))
	}
	return ops, inputs
}

// LayerNorm's three ops on the GPU against their CPU twins, to
// TolParity32 and TolParity64. The kernels add in the order the twins
// follow and round every operation on its own, so they agree bit for bit
// (TestGPULayerNormBitForBit): the column sums of dgamma and dbeta over
// DETR's 44,446 rows too, which in any other order would stray from the
// twin's by their float32 rounding, more than TolParity32 is stated for.
func TestGPULayerNormParity(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(26, 20))
	for _, c := range layerNormGPUCases {
		opsParity(t, dev, c.String(), []tensor.Dtype{tensor.Float32, tensor.Float64}, parityTol, func(t *testing.T, dt tensor.Dtype) ([]*specOp, [][]*tensor.Dense) {
			return layerNormGPUChecks(t, rng, c, dt)
		})
	}
}

// The design's promise (kernels/layernorm.cu): the kernels give the CPU
// twins' bits, NaN where they have NaN, every sum in the same order and no
// fused multiply-add. A zero tolerance.
func TestGPULayerNormBitForBit(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(26, 21))
	for _, c := range []layerNormGPUCase{
		{x: []int{2, 22223, 256}, gamma: true, beta: true},
		{x: []int{2, 300, 256}, gamma: true, beta: true},
		{x: []int{37, 1024}, gamma: true, beta: true},
		{x: []int{3000, 1032}, gamma: true, beta: true},
		{x: []int{3, 1030}, gamma: true, beta: true},
		{x: []int{5, 1030}, gamma: true, beta: true, nanRow: true},
	} {
		opsParity(t, dev, c.String(), []tensor.Dtype{tensor.Float32, tensor.Float64}, exactTol, func(t *testing.T, dt tensor.Dtype) ([]*specOp, [][]*tensor.Dense) {
			return layerNormGPUChecks(t, rng, c, dt)
		})
	}
}

// opSeq runs several ops one after another as one, for the benchmark of a
// pass made of several (LayerNorm's backward: dx, then the column sums):
// op i takes the inputs at indices args[i] of opSeq's own. Its output is
// the last op's; the others' are kept in outs, reused from run to run, and
// freed by free.
type opSeq struct {
	*specOp // the last op: Type, String and the rest
	ops     []*specOp
	args    [][]int
	outs    []G.Value
}

func newOpSeq(ops []*specOp, args [][]int) *opSeq {
	return &opSeq{specOp: ops[len(ops)-1], ops: ops, args: args, outs: make([]G.Value, len(ops))}
}

func (q *opSeq) Do(in ...G.Value) (G.Value, error) { return q.UsePreallocDo(nil, in...) }

func (q *opSeq) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	last := len(q.ops) - 1
	for i, op := range q.ops {
		args := make([]G.Value, len(q.args[i]))
		for j, k := range q.args[i] {
			args[j] = in[k]
		}
		pre := q.outs[i]
		if i == last {
			pre = prealloc
		}
		v, err := op.UsePreallocDo(pre, args...)
		if err != nil {
			return nil, err
		}
		if i == last {
			return v, nil
		}
		q.outs[i] = v
	}
	panic("unreachable")
}

// free frees the device outputs of every op but the last.
func (q *opSeq) free(dev *backend.Device) {
	for _, v := range q.outs[:len(q.outs)-1] {
		if d, ok := v.(*tensor.Dense); ok && backend.IsDevice(d) {
			_ = dev.FreeDense(d)
		}
	}
}

// BenchmarkGPULayerNorm times LayerNorm at DETR's shapes, float32 with
// gamma and beta: the encoder's tokens (2 images of 22,223) and the
// decoder's queries (2 x 300), 256 channels. fwd is the forward op, bwd the
// whole backward pass (dx, then the column sums of dgamma and dbeta), and
// bwd_dx and bwd_params its two ops. CUDA events around each call, the
// median of b.N (run with -test.benchtime 30x), GB/s of the compulsory
// bytes: x read and y written (fwd); x and dy read and dx written (bwd).
// kernels/bench/anchors_layernorm.py times PyTorch's F.layer_norm on the
// same shapes and prints the two side by side.
func BenchmarkGPULayerNorm(b *testing.B) {
	for _, c := range []struct {
		name string
		rows int
	}{{"detr_encoder_44446x256", 2 * 22223}, {"detr_decoder_600x256", 2 * 300}} {
		const cs = 256
		dt := tensor.Float32
		rng := rand.New(rand.NewPCG(26, 30))
		ops, inputs := layerNormGPUChecks(b, rng, layerNormGPUCase{x: []int{c.rows, cs}, gamma: true, beta: true}, dt)
		fwd, dx, params := ops[0], ops[1], ops[2]
		x, gamma, beta, dy := inputs[0][0], inputs[0][1], inputs[0][2], inputs[1][2]
		tensorBytes := float64(c.rows * cs * int(dt.Size()))
		vecBytes := float64(cs * int(dt.Size()))
		name := func(pass string) string {
			return fmt.Sprintf("impl=cuda/dtype=%v/case=%s/pass=%s", dt, c.name, pass)
		}
		b.Run(name("fwd"), func(b *testing.B) {
			runCase(b, "cuda", fwd, []*tensor.Dense{x, gamma, beta}, 2*tensorBytes+2*vecBytes)
		})
		b.Run(name("bwd"), func(b *testing.B) {
			// Inputs x, gamma, dy: dx reads (x, gamma, dy), the column sums (x, dy).
			q := newOpSeq([]*specOp{dx, params}, [][]int{{0, 1, 2}, {0, 2}})
			defer q.free(gpu(b))
			runCase(b, "cuda", q, []*tensor.Dense{x, gamma, dy}, 3*tensorBytes+3*vecBytes)
		})
		b.Run(name("bwd_dx"), func(b *testing.B) {
			runCase(b, "cuda", dx, []*tensor.Dense{x, gamma, dy}, 3*tensorBytes+vecBytes)
		})
		b.Run(name("bwd_params"), func(b *testing.B) {
			runCase(b, "cuda", params, []*tensor.Dense{x, dy}, 2*tensorBytes+2*vecBytes)
		})
	}
}
