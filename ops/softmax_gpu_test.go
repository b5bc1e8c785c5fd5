package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/kernels"
)

// Softmax and LogSoftmax on the GPU against their CPU twins, forward and
// backward, float64 to TolParity64 and float32 to TolParity32, on shapes
// that take every kernel design: rows of 16 (several a warp), attention's
// rows of 300, odd rows (element by element), rows at and past the warp
// kernels' limits (block kernels), lines of stride inner > 1 (a large inner,
// and a small one), axes of one. Some lines hold -inf, NaN or +inf (NaN
// must come out where the CPU's is). The backward takes the CPU's y.
func TestGPUSoftmaxParity(t *testing.T) {
	dev := gpu(t)
	rng := rand.New(rand.NewPCG(26, 4))
	for _, c := range []struct {
		name  string
		shape []int
		axis  int
	}{
		{"attention", []int{2, 8, 300, 300}, -1},
		{"msdeform_weights", []int{2, 8, 2000, 16}, -1},
		{"odd_rows", []int{37, 301}, -1},
		{"short_rows", []int{50, 3}, 1},
		{"warp_limit_f32", []int{5, 1024}, -1},
		{"warp_limit_f64", []int{5, 512}, -1},
		{"long_rows", []int{6, 20000}, -1},
		{"long_odd_rows", []int{5, 4099}, -1},
		{"channels", []int{2, 64, 50, 60}, 1},
		{"large_inner", []int{2, 4, 300, 300}, 1},
		{"small_inner", []int{7, 1000, 2}, 1},
		{"axis_of_one", []int{4, 1, 33}, 1},
		{"vector", []int{1000}, 0},
	} {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			for _, log := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%v/%s", c.name, dt, softmaxName(log)), func(t *testing.T) {
					g := G.NewGraph()
					s, err := softmaxShapeOf(softmaxName(log), G.NewTensor(g, dt, len(c.shape), G.WithShape(c.shape...)), c.axis, log)
					if err != nil {
						t.Fatal(err)
					}
					x := randTensor(rng, dt, -6, 6, c.shape...)
					specialLines(x, s.params())
					tol := []segment{{tol: parityTol(dt)}}
					parityBy(t, dev, softmaxOp(s), tol, x)
					y, err := softmaxOp(s).Do(x)
					if err != nil {
						t.Fatal(err)
					}
					dy := randTensor(rng, dt, -1, 1, c.shape...)
					parityBy(t, dev, softmaxGradOp(s), tol, y.(*tensor.Dense), dy)
				})
			}
		}
	}
}

// specialLines puts an -inf into line 0 of x, a NaN into line 1, only -inf
// into line 2 and +inf into line 3, where x has more than 4 lines of more
// than 2 elements.
func specialLines(x *tensor.Dense, p kernels.SoftmaxParams) {
	if p.Outer*p.Inner <= 4 || p.N <= 2 {
		return
	}
	at := func(line, k int) int { return (line/p.Inner*p.N+k)*p.Inner + line%p.Inner }
	set := func(i int, v float64) {
		if d, ok := x.Data().([]float32); ok {
			d[i] = float32(v)
		} else {
			x.Data().([]float64)[i] = v
		}
	}
	set(at(0, p.N/2), math.Inf(-1))
	set(at(1, p.N-1), math.NaN())
	for k := range p.N {
		set(at(2, k), math.Inf(-1))
	}
	set(at(3, 1), math.Inf(1))
}

// Gradient checks of Softmax and LogSoftmax on the GPU, float64: inputs
// and the loss on the host, ToDevice and ToHost around the op.
func TestGPUSoftmaxGradCheck(t *testing.T) {
	dev := gpu(t)
	engine := G.WithEngine(dev.Engine())
	for i, c := range []struct {
		shape []int
		axis  int
	}{
		{[]int{3, 7}, -1},
		{[]int{2, 5, 3}, 1},
		{[]int{2, 600}, 1}, // float64 rows past the warp kernels: block
	} {
		for _, log := range []bool{false, true} {
			rng := rand.New(rand.NewPCG(uint64(i), 31))
			inputs := []autograd.Input{{Name: "x", Value: randTensor(rng, tensor.Float64, -3, 3, c.shape...)}}
			_, err := autograd.CheckGrad(func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
				x, err := ToDevice(in[0], dev)
				if err != nil {
					return nil, err
				}
				y, err := softmaxBuild(c.axis, log)(g, G.Nodes{x})
				if err != nil {
					return nil, err
				}
				return ToHost(y)
			}, inputs, uint64(i), engine)
			if err != nil {
				t.Errorf("%s %v axis %d: %v", softmaxName(log), c.shape, c.axis, err)
			}
		}
	}
}

// softmaxBenchCases are the shapes BenchmarkGPUSoftmax times:
// attention's scores, 8 heads of 300 queries over 300 keys for 2 images,
// as rows; and Deformable-DETR's attention weights, softmax over the 16
// (level, point) pairs of each of 8 heads of 22,223 encoder queries for 2
// images. kernels/bench/anchors_softmax.py times PyTorch on the same.
var softmaxBenchCases = []struct {
	name  string
	shape []int
}{
	{"attn_4800x300", []int{2 * 8 * 300, 300}},
	{"msdeform_2x8x22223x16", []int{2, 8, 22223, 16}},
}

// BenchmarkGPUSoftmax times Softmax and LogSoftmax on the GPU at
// softmaxBenchCases, float32, axis -1, forward and backward: CUDA events
// around each of b.N calls after 5 untimed ones (run with -test.benchtime
// 30x for the suite's median of 30), reporting the median (ms), the
// compulsory bytes over it (GB/s: forward x and y, backward y, dy and dx,
// each once) and its share of the device's copy bandwidth (%copy), as
// runCase does for the suite.
func BenchmarkGPUSoftmax(b *testing.B) {
	for _, c := range softmaxBenchCases {
		rng := rand.New(rand.NewPCG(1, 1))
		x := randTensor(rng, tensor.Float32, -4, 4, c.shape...)
		dy := randTensor(rng, tensor.Float32, -1, 1, c.shape...)
		bytes := float64(4 * tensor.Shape(c.shape).TotalSize())
		for _, log := range []bool{false, true} {
			g := G.NewGraph()
			s, err := softmaxShapeOf(softmaxName(log), G.NewTensor(g, tensor.Float32, len(c.shape), G.WithShape(c.shape...)), -1, log)
			if err != nil {
				b.Fatal(err)
			}
			y, err := softmaxOp(s).Do(x)
			if err != nil {
				b.Fatal(err)
			}
			op := "softmax"
			if log {
				op = "log_softmax"
			}
			b.Run(fmt.Sprintf("impl=cuda/case=%s/op=%s/pass=fwd", c.name, op), func(b *testing.B) {
				runCase(b, "cuda", softmaxOp(s), []*tensor.Dense{x}, 2*bytes)
			})
			b.Run(fmt.Sprintf("impl=cuda/case=%s/op=%s/pass=bwd", c.name, op), func(b *testing.B) {
				runCase(b, "cuda", softmaxGradOp(s), []*tensor.Dense{y.(*tensor.Dense), dy}, 3*bytes)
			})
		}
	}
}
