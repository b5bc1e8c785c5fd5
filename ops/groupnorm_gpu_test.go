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

// groupNormGPUCase is a GroupNorm's x shape, its groups and whether it
// has gamma and beta.
type groupNormGPUCase struct {
	x           []int
	groups      int
	gamma, beta bool
	nanGroup    bool // a NaN in row 1 (sample 0, group 1; or sample 1 of one group)
	f32Only     bool // too big to be worth a float64 run as well
}

func (c groupNormGPUCase) String() string {
	s := fmt.Sprintf("x=%v/groups=%d/gamma=%t/beta=%t", c.x, c.groups, c.gamma, c.beta)
	if c.nanGroup {
		s += "/nan_group"
	}
	return s
}

// groupNormGPUCases cover every kernel: Mask R-CNN's FPN levels with 32
// groups (v16b planes of 10 and 3 tiles, scalar planes of 25x25), the
// 512-channel map, planes of two tiles the second almost empty (scalar),
// planes of one element ([N, C]), groups of more channels than a warp's
// lanes, 5-D x, every combination of gamma and beta, a group holding a
// NaN, and one group of more tile sums than fwd adds itself (stats_rows).
var groupNormGPUCases = []groupNormGPUCase{
	{x: []int{2, 256, 200, 200}, groups: 32, gamma: true, beta: true, f32Only: true},
	{x: []int{2, 256, 100, 100}, groups: 32, gamma: true, beta: true},
	{x: []int{2, 256, 25, 25}, groups: 32, gamma: true, beta: true},
	{x: []int{2, 512, 64, 64}, groups: 32, gamma: true, beta: true},
	{x: []int{3, 6, 4097}, groups: 3, gamma: true},
	{x: []int{3, 4, 4100}, groups: 1, beta: true},
	{x: []int{5, 8}, groups: 4, gamma: true, beta: true},
	{x: []int{2, 70, 3}, groups: 2},
	{x: []int{2, 4, 3, 2, 4}, groups: 2, gamma: true, beta: true},
	{x: []int{2, 64, 13, 13}, groups: 32, gamma: true, beta: true, nanGroup: true},
	{x: []int{2, 64, 8, 8}, groups: 32, gamma: true, beta: true, nanGroup: true},
	{x: []int{2, 256, 100, 100}, groups: 1, gamma: true, beta: true, f32Only: true},
	{x: []int{1, 129, 4100}, groups: 1, gamma: true, beta: true},
}

// groupNormGPUChecks returns the case's four ops with inputs drawn for
// them: the forward (x[, gamma][, beta]), the backward's sums (x[, gamma],
// dy), dx (x[, gamma], dy, sums) and the channel sums (sums), the last
// only with gamma or beta. The sums the last two read are the CPU twin's.
func groupNormGPUChecks(t testing.TB, rng *rand.Rand, c groupNormGPUCase, dt tensor.Dtype) (ops []*specOp, inputs [][]*tensor.Dense) {
	t.Helper()
	g := G.NewGraph()
	cs := c.x[1]
	xn := G.NewTensor(g, dt, len(c.x), G.WithShape(c.x...))
	var gn, bn *G.Node
	if c.gamma {
		gn = G.NewVector(g, dt, G.WithShape(cs))
	}
	if c.beta {
		bn = G.NewVector(g, dt, G.WithShape(cs))
	}
	s, err := groupNormShapeOf(xn, c.groups, gn, bn, DefaultEps)
	if err != nil {
		t.Fatal(err)
	}
	x := randTensor(rng, dt, -1, 1, c.x...)
	if c.nanGroup {
		xs := toFloat64s(t, x)
		l := cs / c.groups * s.hw
		xs[l+l/2] = math.NaN()
		x = fromFloat64s(dt, xs, c.x...)
	}
	dy := randTensor(rng, dt, -1, 1, c.x...)
	fwd, xg := []*tensor.Dense{x}, []*tensor.Dense{x}
	if c.gamma {
		gamma := randTensor(rng, dt, 0.5, 1.5, cs)
		fwd, xg = append(fwd, gamma), append(xg, gamma)
	}
	if c.beta {
		fwd = append(fwd, randTensor(rng, dt, -1, 1, cs))
	}
	sumsOp := groupNormGradSumsOp(s)
	sumsIn := append(append([]*tensor.Dense{}, xg...), dy)
	sv, err := sumsOp.Do(denseValues(sumsIn)...)
	if err != nil {
		t.Fatal(err)
	}
	sums := sv.(*tensor.Dense)
	ops = []*specOp{groupNormOp(s), sumsOp, groupNormGradXOp(s)}
	inputs = [][]*tensor.Dense{fwd, sumsIn, append(append([]*tensor.Dense{}, sumsIn...), sums)}
	if s.sums() > 0 {
		ops, inputs = append(ops, groupNormGradParamsOp(s)), append(inputs, []*tensor.Dense{sums})
	}
	return ops, inputs
}

func denseValues(in []*tensor.Dense) []G.Value {
	v := make([]G.Value, len(in))
	for i, d := range in {
		v[i] = d
	}
	return v
}

func (c groupNormGPUCase) dtypes() []tensor.Dtype {
	if c.f32Only {
		return []tensor.Dtype{tensor.Float32}
	}
	return []tensor.Dtype{tensor.Float32, tensor.Float64}
}

// GroupNorm's four ops on the GPU against their CPU twins, to TolParity32
// and TolParity64; the kernels in fact give the twins' bits
// (TestGPUGroupNormBitForBit).
func TestGPUGroupNormParity(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(26, 40))
	for _, c := range groupNormGPUCases {
		opsParity(t, dev, c.String(), c.dtypes(), parityTol, func(t *testing.T, dt tensor.Dtype) ([]*specOp, [][]*tensor.Dense) {
			return groupNormGPUChecks(t, rng, c, dt)
		})
	}
}

// The design's promise (kernels/groupnorm.cu): the kernels give the CPU
// twins' bits, NaN where they have NaN, every sum in the same order and no
// fused multiply-add. A zero tolerance.
func TestGPUGroupNormBitForBit(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(26, 41))
	for _, c := range []groupNormGPUCase{
		{x: []int{2, 256, 200, 200}, groups: 32, gamma: true, beta: true, f32Only: true},
		{x: []int{2, 256, 25, 25}, groups: 32, gamma: true, beta: true},
		{x: []int{2, 512, 64, 64}, groups: 32, gamma: true, beta: true},
		{x: []int{3, 6, 4097}, groups: 3, gamma: true},
		{x: []int{2, 70, 3}, groups: 2},
		{x: []int{2, 64, 13, 13}, groups: 32, gamma: true, beta: true, nanGroup: true},
		{x: []int{1, 129, 4100}, groups: 1, gamma: true, beta: true},
	} {
		opsParity(t, dev, c.String(), c.dtypes(), exactTol, func(t *testing.T, dt tensor.Dtype) ([]*specOp, [][]*tensor.Dense) {
			return groupNormGPUChecks(t, rng, c, dt)
		})
	}
}

// groupNormBackward runs GroupNorm's backward ops one after another as one
// op, for the benchmark of the whole pass: (x, gamma, dy) -> the sums, dx
// (kept in dx, reused from run to run) and then [dgamma | dbeta].
type groupNormBackward struct {
	*specOp  // the last op: Type, String and the rest
	sums, dx *specOp
	outs     [2]G.Value
}

func (q *groupNormBackward) Do(in ...G.Value) (G.Value, error) { return q.UsePreallocDo(nil, in...) }

func (q *groupNormBackward) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	sums, err := q.sums.UsePreallocDo(q.outs[0], in...)
	if err != nil {
		return nil, err
	}
	q.outs[0] = sums
	if q.outs[1], err = q.dx.UsePreallocDo(q.outs[1], append(append([]G.Value{}, in...), sums)...); err != nil {
		return nil, err
	}
	return q.specOp.UsePreallocDo(prealloc, sums)
}

// free frees the sums and dx.
func (q *groupNormBackward) free(dev *backend.Device) {
	for _, v := range q.outs {
		if d, ok := v.(*tensor.Dense); ok && backend.IsDevice(d) {
			_ = dev.FreeDense(d)
		}
	}
}

// BenchmarkGPUGroupNorm times GroupNorm(32 groups) at Mask R-CNN's FPN
// shapes, float32 with gamma and beta: levels P2, P3 and P5 of 256
// channels (2 images of 200x200, 100x100, 25x25) and a 512-channel map of
// 64x64. fwd is the forward op; bwd the whole backward pass (the sums,
// dx, then dgamma and dbeta), bwd_sums and bwd_dx its two big ops. CUDA
// events around each call, the median of b.N (run with -test.benchtime
// 30x), GB/s of the compulsory bytes: x read and y written (fwd); x and dy
// read and dx written (bwd). kernels/bench/anchors_groupnorm.py times
// PyTorch's F.group_norm on the same shapes and prints the two side by
// side.
func BenchmarkGPUGroupNorm(b *testing.B) {
	for _, c := range []struct {
		name string
		x    []int
	}{
		{"fpn_p2_2x256x200x200", []int{2, 256, 200, 200}},
		{"fpn_p3_2x256x100x100", []int{2, 256, 100, 100}},
		{"fpn_p5_2x256x25x25", []int{2, 256, 25, 25}},
		{"map_2x512x64x64", []int{2, 512, 64, 64}},
	} {
		dt := tensor.Float32
		rng := rand.New(rand.NewPCG(26, 50))
		ops, inputs := groupNormGPUChecks(b, rng, groupNormGPUCase{x: c.x, groups: 32, gamma: true, beta: true}, dt)
		fwd, sums, dx, params := ops[0], ops[1], ops[2], ops[3]
		x, gamma, beta, dy, sv := inputs[0][0], inputs[0][1], inputs[0][2], inputs[1][2], inputs[2][3]
		tensorBytes := float64(tensor.Shape(c.x).TotalSize() * int(dt.Size()))
		vecBytes := float64(c.x[1] * int(dt.Size()))
		name := func(pass string) string {
			return fmt.Sprintf("impl=cuda/dtype=%v/case=%s/pass=%s", dt, c.name, pass)
		}
		b.Run(name("fwd"), func(b *testing.B) {
			runCase(b, "cuda", fwd, []*tensor.Dense{x, gamma, beta}, 2*tensorBytes+2*vecBytes)
		})
		b.Run(name("bwd"), func(b *testing.B) {
			q := &groupNormBackward{specOp: params, sums: sums, dx: dx}
			defer q.free(gpu(b))
			runCase(b, "cuda", q, []*tensor.Dense{x, gamma, dy}, 3*tensorBytes+3*vecBytes)
		})
		b.Run(name("bwd_sums"), func(b *testing.B) {
			runCase(b, "cuda", sums, []*tensor.Dense{x, gamma, dy}, 2*tensorBytes+vecBytes)
		})
		b.Run(name("bwd_dx"), func(b *testing.B) {
			runCase(b, "cuda", dx, []*tensor.Dense{x, gamma, dy, sv}, 3*tensorBytes+vecBytes)
		})
	}
}
