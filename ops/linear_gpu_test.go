package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"strconv"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
)

// Linear, MatMul and BatchedMatMul on the GPU (cuBLAS) against their CPU
// twins: the forward op and every op of its backward (the GEMMs of the
// operands' gradients, the bias's sum of rows), each on inputs in [-1, 1).
// float64 to TolParity64; float32 GEMMs multiply in TF32 on the GPU, to
// TolTF32For their natural size (products of rms 1/3, K of them); the
// bias's sums and broadcasts run in exact float32, to TolParity32.
func TestGPULinearParity(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(26, 1))
	type shapeOf func(in G.Nodes) (gemmShape, error)
	linear := func(in G.Nodes) (gemmShape, error) {
		if len(in) == 3 {
			return linearShape(in[0], in[1], in[2])
		}
		return linearShape(in[0], in[1], nil)
	}
	matmul := func(in G.Nodes) (gemmShape, error) { return matmulShape(in[0], in[1]) }
	bmm := func(ta, tb bool) shapeOf {
		return func(in G.Nodes) (gemmShape, error) { return batchedMatMulShape(in[0], in[1], ta, tb) }
	}
	for _, c := range []struct {
		name   string
		shapes [][]int // the op's inputs
		shape  shapeOf
	}{
		{"Linear/2d", [][]int{{37, 29}, {13, 29}, {13}}, linear},
		{"Linear/4d_no_bias", [][]int{{2, 3, 5, 24}, {17, 24}}, linear},
		{"Linear/tokens", [][]int{{1000, 256}, {256, 256}, {256}}, linear},
		{"MatMul", [][]int{{31, 300}, {300, 7}}, matmul},
		{"BatchedMatMul/qk", [][]int{{8, 300, 32}, {8, 300, 32}}, bmm(false, true)},
		{"BatchedMatMul/pv", [][]int{{8, 300, 300}, {8, 300, 32}}, bmm(false, false)},
		{"BatchedMatMul/transA", [][]int{{3, 9, 5}, {3, 9, 6}}, bmm(true, false)},
		{"BatchedMatMul/transAB", [][]int{{3, 9, 5}, {3, 6, 9}}, bmm(true, true)},
	} {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			t.Run(c.name+"/"+dt.String(), func(t *testing.T) {
				g := G.NewGraph()
				nodes := make(G.Nodes, len(c.shapes))
				values := make([]*tensor.Dense, len(c.shapes))
				for i, sh := range c.shapes {
					nodes[i] = G.NewTensor(g, dt, len(sh), G.WithShape(sh...))
					values[i] = randTensor(rng, dt, -1, 1, sh...)
				}
				s, err := c.shape(nodes)
				if err != nil {
					t.Fatal(err)
				}
				dy := randTensor(rng, dt, -1, 1, s.c...)
				operands := [3]*tensor.Dense{values[0], values[1], dy}
				type check struct {
					op *specOp
					in []*tensor.Dense
				}
				checks := []check{{gemmOp(s), values}}
				for _, gg := range []gemmGrad{s.gradA(), s.gradB()} {
					checks = append(checks, check{gemmOp(gg.s), []*tensor.Dense{operands[gg.from[0]], operands[gg.from[1]]}})
				}
				if s.bias {
					checks = append(checks,
						check{sumRowsOp(s.biasRows()), []*tensor.Dense{dy}},
						check{broadcastRowsOp(s.biasRows()), []*tensor.Dense{randTensor(rng, dt, -1, 1, s.n)}})
				}
				for i, ch := range checks {
					tol := autograd.TolParity64
					if dt == tensor.Float32 {
						tol = autograd.TolParity32
						if k := gemmDepth(ch.op); k > 0 {
							tol = autograd.TolTF32For(math.Sqrt(float64(k)) / 3)
						}
					}
					t.Run(fmt.Sprintf("%d:%s", i, ch.op.name), func(t *testing.T) { parityBy(t, dev, ch.op, []segment{{tol: tol}}, ch.in...) })
				}
			})
		}
	}
}

// gemmDepth is the depth K of the products a GEMM op sums (its config
// says k=K), and 0 for the bias's sums of rows and broadcasts, which run
// in exact float32 on the GPU.
func gemmDepth(op *specOp) int {
	m := regexp.MustCompile(`^c=.*,k=(\d+),`).FindStringSubmatch(op.config)
	if m == nil {
		return 0
	}
	k, _ := strconv.Atoi(m[1])
	return k
}

// The depth read from a GEMM op's config, which gemmDepth relies on.
func TestGemmDepthFromConfig(t *testing.T) {
	s := gemmShape{op: "Linear", transB: true, batch: 1, m: 6, n: 5, k: 300, bias: true,
		a: tensor.Shape{6, 300}, b: tensor.Shape{5, 300}, c: tensor.Shape{6, 5}, dt: tensor.Float32}
	if k := gemmDepth(gemmOp(s)); k != 300 {
		t.Errorf("gemmDepth = %d, want 300", k)
	}
	if k := gemmDepth(gemmOp(s.gradB().s)); k != 6 {
		t.Errorf("gemmDepth of dw = %d, want 6 (the rows)", k)
	}
	if k := gemmDepth(sumRowsOp(s.biasRows())); k != 0 {
		t.Errorf("gemmDepth of the bias's sum = %d, want 0", k)
	}
}
