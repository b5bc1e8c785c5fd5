package ops

import (
	"fmt"
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// convTGPUCase is a ConvTranspose's x and w shapes and config.
type convTGPUCase struct {
	name        string
	n, ci, h, w int
	co, kh, kw  int
	cfg         ConvTransposeConfig
	bias        bool
}

// convTGPUCases: convTransposeCases (the mask head's 2x2 stride 2, which
// takes the depth-to-space path, and 4x4 stride 4; the others the strided
// data-gradient GEMM: padding, output padding, dilation, unequal strides),
// and the mask head at 256 channels (K % 4 == 0: Hopper's wgmma kernels
// where the GPU has them) with and without its bias and ReLU.
func convTGPUCases() []convTGPUCase {
	var cs []convTGPUCase
	for _, c := range convTransposeCases {
		cs = append(cs, convTGPUCase{c.name, c.n, c.ci, c.h, c.w, c.co, c.kh, c.kw, c.cfg, c.bias})
	}
	s2 := ConvTransposeConfig{Stride: [2]int{2, 2}}
	relu := s2
	relu.Act = ActReLU
	return append(cs,
		convTGPUCase{"mask head 256", 6, 256, 14, 14, 256, 2, 2, relu, true},
		convTGPUCase{"mask head 256, no bias, no relu", 3, 256, 7, 7, 64, 2, 2, s2, false},
	)
}

func (c convTGPUCase) shape(t testing.TB, dt tensor.Dtype) convTShape {
	t.Helper()
	g := G.NewGraph()
	s, err := convTransposeParams(G.NewTensor(g, dt, 4, G.WithShape(c.n, c.ci, c.h, c.w)),
		G.NewTensor(g, dt, 4, G.WithShape(c.ci, c.co, c.kh, c.kw)), c.cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.bias = c.bias
	return s
}

// withConvTPath runs f with path forced for ConvTranspose's forward on dev.
func withConvTPath(dev *backend.Device, path convTPath, f func()) {
	key := convTPathKey{}
	defer dev.SetValue(key, dev.Value(key))
	dev.SetValue(key, path)
	f()
}

// ConvTranspose's three ops on the GPU against their CPU twins: the
// forward by each path that fits the case (depth to space where the stride
// is the kernel, and the strided data-gradient GEMM always), the input and
// the weight gradients (with the bias gradient). Random inputs to TolTF32
// in float32 (the GEMMs' TF32) where the sums are short; integers (which
// TF32 holds, every sum exact) to TolParity32 in float32 on every case;
// TolParity64 in float64. The 256-channel cases, whose float32 sums of
// random values exceed TolTF32's regime, take integers only.
func TestGPUConvTransposeParity(t *testing.T) {
	dev := gpu(t)
	for ci, c := range convTGPUCases() {
		for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
			for _, exact := range []bool{false, true} {
				if (exact && dt == tensor.Float64) || (!exact && dt == tensor.Float32 && c.ci > 32) {
					continue
				}
				t.Run(fmt.Sprintf("%v/%s/exact=%t", dt, c.name, exact), func(t *testing.T) {
					rng := rand.New(rand.NewPCG(uint64(ci), 50))
					s := c.shape(t, dt)
					draw := func(lo, hi float64, shape ...int) *tensor.Dense {
						if exact {
							return intTensor(rng, dt, int(lo*2), int(hi*2), shape...)
						}
						return randTensor(rng, dt, lo, hi, shape...)
					}
					x, w := draw(-1, 1, s.xShape()...), draw(-0.5, 0.5, s.wShape()...)
					in := []*tensor.Dense{x, w}
					if s.bias {
						in = append(in, draw(-0.5, 0.5, s.bShape()...))
					}
					gemm, sums := convTols(dt, exact)
					paths := []convTPath{convTPathDgrad}
					if s.depthToSpace() {
						paths = append(paths, convTPathD2S)
					}
					for _, path := range paths {
						t.Run(path.String(), func(t *testing.T) {
							withConvTPath(dev, path, func() {
								parityBy(t, dev, convTOp(s), []segment{{tol: gemm}}, in...)
							})
						})
					}
					dy := draw(-0.5, 0.5, s.yShape()...)
					parityBy(t, dev, convTDgradOp(s), []segment{{tol: gemm}}, w, dy)
					segs := []segment{{tol: gemm}}
					if s.bias {
						segs = []segment{{n: s.wShape().TotalSize(), tol: gemm}, {tol: sums}}
					}
					parityBy(t, dev, convTWgradOp(s), segs, x, dy)
				})
			}
		}
	}
}

// Forcing the depth-to-space path on a transposed convolution it does not
// compute is an error, not a wrong result.
func TestGPUConvTransposeForcedPath(t *testing.T) {
	dev := gpu(t)
	c := convTGPUCases()[1] // 3x3, stride 1, padding 1
	s := c.shape(t, tensor.Float32)
	rng := rand.New(rand.NewPCG(1, 51))
	x, w := toDev(t, dev, randTensor(rng, s.dt, -1, 1, s.xShape()...)), toDev(t, dev, randTensor(rng, s.dt, -1, 1, s.wShape()...))
	withConvTPath(dev, convTPathD2S, func() {
		if _, err := convTOp(s).Do(x, w); err == nil {
			t.Error("the depth-to-space path ran a 3x3 stride-1 transposed convolution")
		}
	})
}

// BenchmarkGPUConvTranspose times ConvTranspose in float32 on Mask R-CNN's
// mask head (torchvision's: 2x2, stride 2, 256 channels, bias and ReLU) of
// 256 RoIs pooled to 14x14: the forward by both paths (path=d2s: a 1x1
// convolution and the depth-to-space pass; path=dgrad: the strided
// data-gradient GEMM and the pass in place), the input gradient and the
// weight gradient. CUDA events around each call, the median of b.N (run
// with -test.benchtime 30x); GB/s of the compulsory bytes: x and w read
// and y written (fwd), w and dy read and dx written (dgrad), x and dy read
// and dw written (wgrad).
func BenchmarkGPUConvTranspose(b *testing.B) {
	dt := tensor.Float32
	c := convTGPUCase{"mask_head_256x256x14x14", 256, 256, 14, 14, 256, 2, 2, ConvTransposeConfig{Stride: [2]int{2, 2}, Act: ActReLU}, true}
	s := c.shape(b, dt)
	rng := rand.New(rand.NewPCG(1, 52))
	x, w := randTensor(rng, dt, -1, 1, s.xShape()...), randTensor(rng, dt, -0.05, 0.05, s.wShape()...)
	bias, dy := randTensor(rng, dt, -0.1, 0.1, s.bShape()...), randTensor(rng, dt, -1, 1, s.yShape()...)
	size := func(shapes ...tensor.Shape) float64 {
		n := 0
		for _, sh := range shapes {
			n += sh.TotalSize()
		}
		return float64(n * int(dt.Size()))
	}
	name := func(pass string) string {
		return fmt.Sprintf("impl=cuda/dtype=%v/case=%s/pass=%s", dt, c.name, pass)
	}
	for _, path := range []convTPath{convTPathD2S, convTPathDgrad} {
		b.Run(name("fwd")+"/path="+path.String(), func(b *testing.B) {
			withConvTPath(gpu(b), path, func() {
				runCase(b, "cuda", convTOp(s), []*tensor.Dense{x, w, bias}, size(s.xShape(), s.wShape(), s.yShape()))
			})
		})
	}
	b.Run(name("dgrad"), func(b *testing.B) {
		runCase(b, "cuda", convTDgradOp(s), []*tensor.Dense{w, dy}, size(s.wShape(), s.yShape(), s.xShape()))
	})
	b.Run(name("wgrad"), func(b *testing.B) {
		runCase(b, "cuda", convTWgradOp(s), []*tensor.Dense{x, dy}, size(s.xShape(), s.yShape(), s.wShape()))
	})
}
