package ops

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/kernels"
)

// convTransposeRef is the definition of conv_transpose2d: every input pixel
// scatters its value times the kernel onto the output,
// y[n,co,ih*S-P+kh*D, iw*S-P+kw*D] += x[n,ci,ih,iw] * w[ci,co,kh,kw].
func convTransposeRef(x, w, b []float64, xs, ws tensor.Shape, cfg ConvTransposeConfig) ([]float64, tensor.Shape) {
	n, ci, h, wd := xs[0], xs[1], xs[2], xs[3]
	co, kh, kw := ws[1], ws[2], ws[3]
	s, p, d, op := cfg.Stride, cfg.Pad, cfg.Dilation, cfg.OutputPad
	for i := range 2 {
		s[i], d[i] = max(s[i], 1), max(d[i], 1)
	}
	oh := (h-1)*s[0] - 2*p[0] + d[0]*(kh-1) + op[0] + 1
	ow := (wd-1)*s[1] - 2*p[1] + d[1]*(kw-1) + op[1] + 1
	y := make([]float64, n*co*oh*ow)
	for in := range n {
		for c := range co {
			for i := range oh * ow {
				if b != nil {
					y[(in*co+c)*oh*ow+i] = b[c]
				}
			}
			for k := range ci {
				for ih := range h {
					for iw := range wd {
						v := x[((in*ci+k)*h+ih)*wd+iw]
						for a := range kh {
							for bb := range kw {
								yh, yw := ih*s[0]-p[0]+a*d[0], iw*s[1]-p[1]+bb*d[1]
								if yh < 0 || yh >= oh || yw < 0 || yw >= ow {
									continue
								}
								y[((in*co+c)*oh+yh)*ow+yw] += v * w[((k*co+c)*kh+a)*kw+bb]
							}
						}
					}
				}
			}
		}
	}
	if cfg.Act == ActReLU {
		for i, v := range y {
			y[i] = max(v, 0)
		}
	}
	return y, tensor.Shape{n, co, oh, ow}
}

func convTransposeWith(cfg ConvTransposeConfig) func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		var b *G.Node
		if len(in) > 2 {
			b = in[2]
		}
		return ConvTranspose(in[0], in[1], b, cfg)
	}
}

// Mask R-CNN's upsampling layer by hand: a 2x2 kernel of stride 2 pastes a
// scaled copy of the kernel for every input pixel.
func TestConvTransposeHandValues(t *testing.T) {
	x := tensor.New(tensor.WithShape(1, 1, 2, 2), tensor.WithBacking([]float64{1, 2, 3, 4}))
	w := tensor.New(tensor.WithShape(1, 1, 2, 2), tensor.WithBacking([]float64{1, 10, 100, 1000}))
	b := vec(-150)
	got, shape, err := runGraph(t, []*tensor.Dense{x, w, b}, convTransposeWith(ConvTransposeConfig{Stride: [2]int{2, 2}, Act: ActReLU}))
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{
		0, 0, 0, 0, // 1, 10, 2, 20 minus 150
		0, 850, 50, 1850, // 100, 1000, 200, 2000
		0, 0, 0, 0, // 3, 30, 4, 40
		150, 2850, 250, 3850, // 300, 3000, 400, 4000
	}
	if !shape.Eq(tensor.Shape{1, 1, 4, 4}) || !equalFloats(got, want) {
		t.Errorf("got %v %v, want (1, 1, 4, 4) %v", shape, got, want)
	}
}

var convTransposeCases = []struct {
	name           string
	n, ci, h, w    int
	co, kh, kw     int
	cfg            ConvTransposeConfig
	bias           bool
	scaleX, scaleW float64
}{
	{"2x2s2 (mask head)", 2, 3, 3, 4, 4, 2, 2, ConvTransposeConfig{Stride: [2]int{2, 2}, Act: ActReLU}, true, 1, 1},
	{"3x3s1p1", 1, 2, 5, 4, 3, 3, 3, ConvTransposeConfig{Pad: [2]int{1, 1}}, false, 1, 1},
	{"3x3s2p1op1", 2, 2, 3, 3, 3, 3, 3, ConvTransposeConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}, OutputPad: [2]int{1, 1}, Act: ActReLU}, true, 1, 1},
	{"dilated asym", 1, 3, 4, 3, 2, 2, 3, ConvTransposeConfig{Stride: [2]int{1, 2}, Dilation: [2]int{2, 1}, Pad: [2]int{1, 0}}, true, 1, 1},
	{"4x4s4 wide", 1, 17, 2, 2, 20, 4, 4, ConvTransposeConfig{Stride: [2]int{4, 4}}, true, 1, 0.2},
}

// Forward values against the scatter definition, in both dtypes.
func TestConvTransposeMatchesDefinition(t *testing.T) {
	for _, c := range convTransposeCases {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			t.Run(fmt.Sprintf("%s/%v", c.name, dt), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(5, 6))
				x := randTensor(rng, tensor.Float64, -c.scaleX, c.scaleX, c.n, c.ci, c.h, c.w)
				w := randTensor(rng, tensor.Float64, -c.scaleW, c.scaleW, c.ci, c.co, c.kh, c.kw)
				in := []*tensor.Dense{cast(t, x, dt), cast(t, w, dt)}
				var bv []float64
				if c.bias {
					b := randTensor(rng, tensor.Float64, -0.5, 0.5, c.co)
					bv = b.Float64s()
					in = append(in, cast(t, b, dt))
				}
				got, shape, err := runGraph(t, in, convTransposeWith(c.cfg))
				if err != nil {
					t.Fatal(err)
				}
				want, wantShape := convTransposeRef(x.Float64s(), w.Float64s(), bv, x.Shape(), w.Shape(), c.cfg)
				if !shape.Eq(wantShape) {
					t.Fatalf("shape %v, want %v", shape, wantShape)
				}
				tol := autograd.TolForward64
				if dt == tensor.Float32 {
					tol = autograd.TolForward32
				}
				if err := tol.Compare(got, want); err != nil {
					t.Error(err)
				}
			})
		}
	}
}

func TestConvTransposeGradCheck(t *testing.T) {
	for _, c := range convTransposeCases {
		t.Run(c.name, func(t *testing.T) {
			for seed := uint64(1); seed <= 2; seed++ {
				rng := rand.New(rand.NewPCG(seed, 9))
				inputs := []autograd.Input{
					{Name: "x", Value: randTensor(rng, tensor.Float64, -c.scaleX, c.scaleX, c.n, c.ci, c.h, c.w)},
					{Name: "w", Value: randTensor(rng, tensor.Float64, -c.scaleW, c.scaleW, c.ci, c.co, c.kh, c.kw)},
				}
				if c.bias {
					inputs = append(inputs, autograd.Input{Name: "bias", Value: randTensor(rng, tensor.Float64, -0.5, 0.5, c.co)})
				}
				results, err := autograd.CheckGrad(convTransposeWith(c.cfg), inputs, seed)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range results {
					if r.Scale == 0 {
						t.Errorf("%s: all gradients are zero: the check proves nothing", r.Name)
					}
				}
			}
		})
	}
}

func TestConvTransposeBadInput(t *testing.T) {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float32, 4, G.WithShape(2, 3, 4, 4), G.WithName("x"))
	x3 := G.NewTensor(g, tensor.Float32, 3, G.WithShape(3, 4, 4), G.WithName("x3"))
	w := G.NewTensor(g, tensor.Float32, 4, G.WithShape(3, 5, 2, 2), G.WithName("w"))
	wCin := G.NewTensor(g, tensor.Float32, 4, G.WithShape(5, 3, 2, 2), G.WithName("wCin"))
	w64 := G.NewTensor(g, tensor.Float64, 4, G.WithShape(3, 5, 2, 2), G.WithName("w64"))
	bias := G.NewVector(g, tensor.Float32, G.WithShape(5), G.WithName("bias"))
	bias3 := G.NewVector(g, tensor.Float32, G.WithShape(3), G.WithName("bias3"))
	s2 := ConvTransposeConfig{Stride: [2]int{2, 2}}
	cases := []struct {
		name    string
		x, w, b *G.Node
		cfg     ConvTransposeConfig
		want    string
	}{
		{"x rank", x3, w, nil, s2, "x must have shape [N Cin H W]"},
		{"w channels", x, wCin, nil, s2, "w must have shape [3 Cout KH KW]"},
		{"w dtype", x, w64, nil, s2, "w has dtype float64"},
		{"bias shape", x, w, bias3, s2, "bias must have shape [5]"},
		{"output pad", x, w, bias, ConvTransposeConfig{Stride: [2]int{2, 2}, OutputPad: [2]int{2, 0}}, "OutputPad must be in [0, Stride)"},
		{"stride", x, w, bias, ConvTransposeConfig{Stride: [2]int{-1, 1}}, "Stride must be positive"},
		{"empty", x, w, nil, ConvTransposeConfig{Pad: [2]int{3, 3}}, "empty output"},
		{"act", x, w, nil, ConvTransposeConfig{Act: 7}, "unknown Activation"},
	}
	for _, c := range cases {
		_, err := ConvTranspose(c.x, c.w, c.b, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
}

// The GPU's depth-to-space forward (convtranspose_device.go), computed with
// the CPU twins of its kernels: the weights transposed as transpose_planes
// transposes them, the 1x1 convolution, then the epilogue by (KH, KW). On
// integers (every sum exact) it must give the op's CPU result bit for bit,
// in every case whose stride is its kernel; the others must not take it.
func TestConvTransposeDepthToSpace(t *testing.T) {
	cases := append(convTransposeCases[:0:0], convTransposeCases...)
	cases = append(cases, convTransposeCases[0])
	cases[len(cases)-1].name, cases[len(cases)-1].bias = "2x2s2 no bias", false
	cases[len(cases)-1].cfg.Act = ActNone
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := G.NewGraph()
			s, err := convTransposeParams(G.NewTensor(g, tensor.Float32, 4, G.WithShape(c.n, c.ci, c.h, c.w)),
				G.NewTensor(g, tensor.Float32, 4, G.WithShape(c.ci, c.co, c.kh, c.kw)), c.cfg)
			if err != nil {
				t.Fatal(err)
			}
			s.bias = c.bias
			want := c.cfg.Stride == [2]int{c.kh, c.kw} && c.cfg.Pad == [2]int{} && c.cfg.Dilation == [2]int{} && c.cfg.OutputPad == [2]int{}
			if s.depthToSpace() != want {
				t.Fatalf("depthToSpace() = %t, want %t", s.depthToSpace(), want)
			}
			if !want {
				return
			}
			rng := rand.New(rand.NewPCG(7, 7))
			in := []*tensor.Dense{intTensor(rng, tensor.Float32, -2, 2, s.xShape()...), intTensor(rng, tensor.Float32, -1, 1, s.wShape()...)}
			var bias []float32
			if s.bias {
				in = append(in, intTensor(rng, tensor.Float32, -1, 1, s.bShape()...))
				bias = in[2].Float32s()
			}
			y, err := convTOp(s).Do(toValues(in)...)
			if err != nil {
				t.Fatal(err)
			}
			p := s.p
			rows, cols := p.Cout, p.Cin*p.KH*p.KW // w as [Cin, Cout*KH*KW], ConvTranspose's Cin being p.Cout
			wv, wt := in[1].Float32s(), make([]float32, rows*cols)
			for r := range rows {
				for c := range cols {
					wt[c*rows+r] = wv[r*cols+c]
				}
			}
			z := make([]float32, p.N*cols*p.OutH*p.OutW)
			if err := convForward(s.pointwise(), [][]float32{in[0].Float32s(), wt}, z); err != nil {
				t.Fatal(err)
			}
			got := make([]float32, s.yShape().TotalSize())
			kernels.ConvTransposeEpilogue(s.epilogue(p.KH, p.KW), z, bias, got)
			for i, v := range y.(*tensor.Dense).Float32s() {
				if got[i] != v {
					t.Fatalf("element %d: %v by depth to space, %v by the op", i, got[i], v)
				}
			}
		})
	}
}
