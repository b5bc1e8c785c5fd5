package kernels

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// refConv is the definition of ConvParams, loop for loop, in float64.
func refConv(p ConvParams, x, w, bias []float64) []float64 {
	y := make([]float64, p.N*p.Cout*p.OutH*p.OutW)
	for n := range p.N {
		for co := range p.Cout {
			for oh := range p.OutH {
				for ow := range p.OutW {
					var s float64
					if bias != nil {
						s = bias[co]
					}
					for ci := range p.Cin {
						for kh := range p.KH {
							for kw := range p.KW {
								ih := oh*p.StrideH - p.PadH + kh*p.DilationH
								iw := ow*p.StrideW - p.PadW + kw*p.DilationW
								if ih < 0 || ih >= p.H || iw < 0 || iw >= p.W {
									continue
								}
								s += w[((co*p.Cin+ci)*p.KH+kh)*p.KW+kw] * x[((n*p.Cin+ci)*p.H+ih)*p.W+iw]
							}
						}
					}
					if p.ReLU {
						s = max(s, 0)
					}
					y[((n*p.Cout+co)*p.OutH+oh)*p.OutW+ow] = s
				}
			}
		}
	}
	return y
}

// refConvBackward differentiates refConv: it scatters every product's
// gradient back to its two factors.
func refConvBackward(p ConvParams, x, w, y, dy []float64) (dx, dw, db []float64) {
	dx = make([]float64, len(x))
	dw = make([]float64, len(w))
	db = make([]float64, p.Cout)
	for n := range p.N {
		for co := range p.Cout {
			for oh := range p.OutH {
				for ow := range p.OutW {
					i := ((n*p.Cout+co)*p.OutH+oh)*p.OutW + ow
					g := dy[i]
					if p.ReLU && !(y[i] > 0) {
						g = 0
					}
					db[co] += g
					for ci := range p.Cin {
						for kh := range p.KH {
							for kw := range p.KW {
								ih := oh*p.StrideH - p.PadH + kh*p.DilationH
								iw := ow*p.StrideW - p.PadW + kw*p.DilationW
								if ih < 0 || ih >= p.H || iw < 0 || iw >= p.W {
									continue
								}
								xi := ((n*p.Cin+ci)*p.H+ih)*p.W + iw
								wi := ((co*p.Cin+ci)*p.KH+kh)*p.KW + kw
								dx[xi] += g * w[wi]
								dw[wi] += g * x[xi]
							}
						}
					}
				}
			}
		}
	}
	return dx, dw, db
}

// convTestParams fills in the output size the way the ops package does.
func convTestParams(n, cin, h, w, cout, kh, kw, sh, sw, ph, pw, dh, dw int, relu bool) ConvParams {
	return ConvParams{
		N: n, Cin: cin, H: h, W: w, Cout: cout, KH: kh, KW: kw,
		StrideH: sh, StrideW: sw, PadH: ph, PadW: pw, DilationH: dh, DilationW: dw,
		OutH: (h+2*ph-dh*(kh-1)-1)/sh + 1, OutW: (w+2*pw-dw*(kw-1)-1)/sw + 1,
		ReLU: relu,
	}
}

// convCases cover the blockings: reductions over kcMax (Cin*KH*KW = 270,
// Cout = 300, P = 400), pixel blocks over colBlock, sizes that are no
// multiple of any tile, strides, dilations, pads wider than the kernel,
// outputs of one pixel and one column, and both ways of packing wgrad's B.
var convCases = []ConvParams{
	convTestParams(1, 1, 3, 3, 1, 2, 2, 1, 1, 0, 0, 1, 1, false),
	convTestParams(2, 3, 7, 9, 5, 3, 3, 1, 1, 1, 1, 1, 1, true),
	convTestParams(2, 4, 11, 8, 7, 3, 3, 2, 1, 1, 0, 1, 1, false),
	convTestParams(1, 3, 13, 13, 9, 7, 7, 2, 2, 3, 3, 1, 1, true),
	convTestParams(2, 5, 10, 9, 6, 3, 3, 1, 1, 2, 2, 2, 2, true),
	convTestParams(1, 2, 6, 5, 3, 3, 2, 3, 2, 4, 3, 1, 2, false),
	convTestParams(2, 30, 9, 10, 17, 3, 3, 1, 1, 1, 1, 1, 1, true),
	convTestParams(1, 300, 4, 5, 3, 1, 1, 1, 1, 0, 0, 1, 1, false),
	convTestParams(1, 6, 20, 20, 300, 1, 1, 1, 1, 0, 0, 1, 1, true),
	convTestParams(3, 4, 21, 19, 33, 3, 3, 1, 1, 1, 1, 1, 1, true),
	convTestParams(1, 2, 5, 1, 4, 3, 1, 1, 1, 1, 0, 1, 1, false),
	convTestParams(2, 3, 4, 4, 2, 4, 4, 1, 1, 0, 0, 1, 1, true),
	// Channels-last wgrad (Cin >= channelsLastMin, several taps per pixel),
	// with panels that straddle taps, strides, dilations and pads per axis.
	convTestParams(2, 17, 11, 13, 9, 3, 3, 1, 2, 2, 1, 2, 1, true),
	convTestParams(1, 20, 9, 8, 5, 5, 5, 2, 2, 2, 2, 1, 1, false),
	convTestParams(1, 40, 6, 7, 3, 2, 3, 1, 1, 0, 2, 1, 2, true),
}

// dyadicFloats returns n multiples of 1/8 in [-1, 1]. With such inputs every
// product is a multiple of 1/64 and every sum in these tests is exact in
// float32 as in float64, so kernels that sum in different orders (or with
// fused multiply-adds) must agree with the reference exactly: any difference
// is a bug, not rounding.
func dyadicFloats(rng *rand.Rand, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = float64(rng.IntN(17)-8) / 8
	}
	return v
}

func convertTo[T Float](v []float64) []T {
	if v == nil {
		return nil
	}
	out := make([]T, len(v))
	for i, f := range v {
		out[i] = T(f)
	}
	return out
}

func TestConvKernelsExact(t *testing.T) {
	paths := map[bool]int{}
	for _, p := range convCases {
		paths[p.useChannelsLast()]++
	}
	if paths[true] == 0 || paths[false] == 0 {
		t.Fatalf("the cases must exercise both ways of packing wgrad's B, got %v", paths)
	}
	testConvKernelsExact[float32](t)
	testConvKernelsExact[float64](t)
}

func testConvKernelsExact[T Float](t *testing.T) {
	for ci, p := range convCases {
		rng := rand.New(rand.NewPCG(uint64(ci), 3))
		x := dyadicFloats(rng, p.N*p.Cin*p.H*p.W)
		w := dyadicFloats(rng, p.Cout*p.Cin*p.KH*p.KW)
		bias := dyadicFloats(rng, p.Cout)
		dy := dyadicFloats(rng, p.N*p.Cout*p.OutH*p.OutW)
		for _, withBias := range []bool{false, true} {
			b := bias
			if !withBias {
				b = nil
			}
			wantY := refConv(p, x, w, b)
			wantDx, wantDw, wantDb := refConvBackward(p, x, w, wantY, dy)
			for _, mk := range append(microKernels[T](), refKernel[T](3, 5)) {
				name := fmt.Sprintf("%T/case%d/bias=%t/kernel=%s", T(0), ci, withBias, mk.name)
				y := make([]T, len(wantY))
				fillWith(y, 7) // outputs are overwritten, never accumulated into
				convForward(mk, p, convertTo[T](x), convertTo[T](w), convertTo[T](b), y)
				expectExact(t, name+"/y", y, wantY)

				yT := convertTo[T](wantY)
				dx := make([]T, len(x))
				fillWith(dx, 7)
				convBackwardData(mk, p, convertTo[T](w), yT, convertTo[T](dy), dx)
				expectExact(t, name+"/dx", dx, wantDx)

				dw := make([]T, len(w))
				fillWith(dw, 7)
				var db []T
				if withBias {
					db = make([]T, p.Cout)
					fillWith(db, 7)
				}
				convBackwardFilter(mk, p, convertTo[T](x), yT, convertTo[T](dy), dw, db)
				expectExact(t, name+"/dw", dw, wantDw)
				if withBias {
					expectExact(t, name+"/db", db, wantDb)
				}
			}
		}
	}
}

func fillWith[T Float](s []T, v T) {
	for i := range s {
		s[i] = v
	}
}

func expectExact[T Float](t *testing.T, name string, got []T, want []float64) {
	t.Helper()
	for i := range want {
		if float64(got[i]) != want[i] {
			t.Errorf("%s: element %d of %d is %v, want %v", name, i, len(want), got[i], want[i])
			return
		}
	}
}

// The blocking and the split into jobs adapt to the number of workers; the
// sum behind each element must not, so that runs are reproducible across
// machines. Random (non-dyadicFloats) data makes any change of order visible.
func TestConvKernelsIndependentOfWorkers(t *testing.T) {
	p := convTestParams(2, 19, 17, 23, 21, 3, 3, 1, 1, 1, 1, 1, 1, true)
	rng := rand.New(rand.NewPCG(9, 9))
	x := convertTo[float32](convRandFloats(rng, p.N*p.Cin*p.H*p.W))
	w := convertTo[float32](convRandFloats(rng, p.Cout*p.Cin*p.KH*p.KW))
	bias := convertTo[float32](convRandFloats(rng, p.Cout))
	dy := convertTo[float32](convRandFloats(rng, p.N*p.Cout*p.OutH*p.OutW))
	run := func() [][]float32 {
		y := make([]float32, len(dy))
		dx := make([]float32, len(x))
		dw := make([]float32, len(w))
		db := make([]float32, p.Cout)
		ConvForward(p, x, w, bias, y)
		ConvBackwardData(p, w, y, dy, dx)
		ConvBackwardFilter(p, x, y, dy, dw, db)
		return [][]float32{y, dx, dw, db}
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(1)
	want := run()
	for _, procs := range []int{2, 3, 8} {
		runtime.GOMAXPROCS(procs)
		for i, got := range run() {
			if !slices.Equal(got, want[i]) {
				t.Errorf("GOMAXPROCS=%d: output %d differs from the serial run", procs, i)
			}
		}
	}
}

func convRandFloats(rng *rand.Rand, n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = rng.Float64()*2 - 1
	}
	return v
}

// BenchmarkConvKernels times each pass of the kernels alone on shapes of a
// ResNet-style detector backbone, float32.
func BenchmarkConvKernels(b *testing.B) {
	shapes := []struct {
		name string
		p    ConvParams
	}{
		{"3x3", convTestParams(2, 64, 64, 64, 64, 3, 3, 1, 1, 1, 1, 1, 1, true)},
		{"1x1", convTestParams(2, 256, 32, 32, 64, 1, 1, 1, 1, 0, 0, 1, 1, true)},
		{"3x3s2", convTestParams(2, 64, 64, 64, 128, 3, 3, 2, 2, 1, 1, 1, 1, true)},
		{"7x7s2", convTestParams(2, 3, 224, 224, 64, 7, 7, 2, 2, 3, 3, 1, 1, true)},
	}
	for _, s := range shapes {
		p := s.p
		rng := rand.New(rand.NewPCG(1, 1))
		x := convertTo[float32](convRandFloats(rng, p.N*p.Cin*p.H*p.W))
		w := convertTo[float32](convRandFloats(rng, p.Cout*p.Cin*p.KH*p.KW))
		bias := convertTo[float32](convRandFloats(rng, p.Cout))
		dy := convertTo[float32](convRandFloats(rng, p.N*p.Cout*p.OutH*p.OutW))
		y := make([]float32, len(dy))
		dx := make([]float32, len(x))
		dw := make([]float32, len(w))
		db := make([]float32, p.Cout)
		flops := 2 * float64(p.N*p.pixels()*p.Cout*p.reduction())
		for _, pass := range []string{"fwd", "dgrad", "wgrad"} {
			b.Run(fmt.Sprintf("shape=%s/pass=%s", s.name, pass), func(b *testing.B) {
				for b.Loop() {
					switch pass {
					case "fwd":
						ConvForward(p, x, w, bias, y)
					case "dgrad":
						ConvBackwardData(p, w, y, dy, dx)
					case "wgrad":
						ConvBackwardFilter(p, x, y, dy, dw, db)
					}
				}
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
