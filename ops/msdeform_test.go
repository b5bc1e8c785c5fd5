package ops

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

func msDeform(levels []Level) func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return MSDeformAttn(in[0], in[1], in[2], levels) }
}

// msDeformConfig is the size of one MSDeformAttn call in a test.
type msDeformConfig struct {
	n, lq, m, d, p int
	levels         []Level
}

func (c msDeformConfig) s() int {
	s := 0
	for _, lv := range c.levels {
		s += lv.H * lv.W
	}
	return s
}

func (c msDeformConfig) valueShape() []int  { return []int{c.n, c.s(), c.m, c.d} }
func (c msDeformConfig) locShape() []int    { return []int{c.n, c.lq, c.m, len(c.levels), c.p, 2} }
func (c msDeformConfig) weightShape() []int { return []int{c.n, c.lq, c.m, len(c.levels), c.p} }
func (c msDeformConfig) outShape() []int    { return []int{c.n, c.lq, c.m * c.d} }

func (c msDeformConfig) String() string {
	return fmt.Sprintf("N=%d/Lq=%d/M=%d/D=%d/P=%d/levels=%v", c.n, c.lq, c.m, c.d, c.p, c.levels)
}

// msDeformResult holds the output and the gradients of sum(out ⊙ gradOut).
type msDeformResult struct {
	out, gradValue, gradLoc, gradWeight []float64
}

// msDeformRun runs MSDeformAttn and its three gradients through one gorgonia
// graph (G.Grad and a tape machine), as a training loop would.
func msDeformRun(t testing.TB, levels []Level, value, loc, weight, gradOut *tensor.Dense) msDeformResult {
	t.Helper()
	g := G.NewGraph()
	v := G.NodeFromAny(g, value, G.WithName("value"))
	l := G.NodeFromAny(g, loc, G.WithName("loc"))
	w := G.NodeFromAny(g, weight, G.WithName("weight"))
	gy := G.NodeFromAny(g, gradOut, G.WithName("gradOut"))
	out, err := MSDeformAttn(v, l, w, levels)
	if err != nil {
		t.Fatal(err)
	}
	loss := G.Must(G.Sum(G.Must(G.HadamardProd(out, gy))))
	grads, err := G.Grad(loss, v, l, w)
	if err != nil {
		t.Fatal(err)
	}
	vals := make([]G.Value, 4)
	G.Read(out, &vals[0])
	for i, gr := range grads {
		G.Read(gr, &vals[i+1])
	}
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		t.Fatal(err)
	}
	return msDeformResult{toFloat64s(t, vals[0]), toFloat64s(t, vals[1]), toFloat64s(t, vals[2]), toFloat64s(t, vals[3])}
}

func (r msDeformResult) compare(tol autograd.Tolerance, want msDeformResult) error {
	var errs []string
	for _, c := range []struct {
		name      string
		got, want []float64
	}{
		{"out", r.out, want.out},
		{"gradValue", r.gradValue, want.gradValue},
		{"gradLoc", r.gradLoc, want.gradLoc},
		{"gradWeight", r.gradWeight, want.gradWeight},
	} {
		if err := tol.Compare(c.got, c.want); err != nil {
			errs = append(errs, c.name+": "+err.Error())
		}
	}
	if errs != nil {
		return fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return nil
}

// msDeformHandLevels are the maps of the hand-checked tests: level 0 is 2x4, level 1
// is 1x2. Head 0's channel 0 holds the ramp 50*level + 10*y + x + 1, which
// bilinear interpolation reproduces exactly between pixels, and its channel 1
// holds 1, whose sample is the share of the bilinear weight that falls inside
// the map. Head 1 holds twice head 0, so a mixed-up head shows.
var msDeformHandLevels = []Level{{2, 4}, {1, 2}}

func msDeformHandValue(dt tensor.Dtype, levels []Level) *tensor.Dense {
	var v []float64
	for l, lv := range levels {
		for y := range lv.H {
			for x := range lv.W {
				ramp := float64(50*l + 10*y + x + 1)
				for m := range 2 {
					v = append(v, float64(m+1)*ramp, float64(m+1))
				}
			}
		}
	}
	return fromFloat64s(dt, v, 1, len(v)/4, 2, 2)
}

// msDeformPoint is a sampling point of the hand-checked tests, in pixels of its
// level (x, y) or as a raw normalised location (locX, locY) when raw is set.
type msDeformPoint struct {
	level, slot  int
	x, y, weight float64
	raw          bool
}

// msDeformHandInputs places the points on both heads; every other slot samples the
// map's centre with weight 0 and so adds nothing.
func msDeformHandInputs(dt tensor.Dtype, levels []Level, p int, pts []msDeformPoint) (loc, weight *tensor.Dense) {
	nl := len(levels)
	locs := make([]float64, 2*nl*p*2)
	ws := make([]float64, 2*nl*p)
	for i := range ws {
		locs[2*i], locs[2*i+1] = 0.5, 0.5
	}
	for m := range 2 {
		for _, pt := range pts {
			i := (m*nl+pt.level)*p + pt.slot
			lx, ly := pt.x, pt.y
			if !pt.raw {
				// Pixel centres sit at (x+0.5)/W; the sizes used here are
				// powers of two, so these are exact.
				lv := levels[pt.level]
				lx, ly = (pt.x+0.5)/float64(lv.W), (pt.y+0.5)/float64(lv.H)
			}
			locs[2*i], locs[2*i+1] = lx, ly
			ws[i] = pt.weight
		}
	}
	return fromFloat64s(dt, locs, 1, 1, 2, nl, p, 2), fromFloat64s(dt, ws, 1, 1, 2, nl, p)
}

func TestMSDeformAttnHandValues(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	cases := []struct {
		name string
		pts  []msDeformPoint
		want [2]float64 // head 0: ramp sample, in-map weight; head 1 is twice that
	}{
		{"pixel centre", []msDeformPoint{{x: 2, y: 1, weight: 1}}, [2]float64{13, 1}},
		{"between pixels", []msDeformPoint{{x: 1.25, y: 0.5, weight: 1}}, [2]float64{7.25, 1}},
		{"weighted", []msDeformPoint{{x: 1.25, y: 0.5, weight: -2}}, [2]float64{-14.5, -2}},
		// x = -0.5: corner x0 = -1 is outside, x1 = 0 carries half the weight.
		{"half outside left", []msDeformPoint{{x: -0.5, y: 0, weight: 1}}, [2]float64{0.5, 0.5}},
		{"top-left corner of the map", []msDeformPoint{{x: -0.5, y: -0.5, weight: 1}}, [2]float64{0.25, 0.25}},
		// (3.5, 1.5): only pixel (1,3), value 14, is inside, with weight 1/4.
		{"bottom-right corner of the map", []msDeformPoint{{x: 3.5, y: 1.5, weight: 1}}, [2]float64{3.5, 0.25}},
		// x = 3.75: column 3 (values 4 and 14) carries 1/4, column 4 is outside.
		{"right border", []msDeformPoint{{x: 3.75, y: 0.5, weight: 1}}, [2]float64{2.25, 0.25}},
		{"left of the map", []msDeformPoint{{x: -1.3, y: 0.5, weight: 1}}, [2]float64{0, 0}},
		{"below the map", []msDeformPoint{{x: 1, y: 2.1, weight: 1}}, [2]float64{0, 0}},
		// Exactly one pixel left of the map: the only corner inside has weight 0.
		{"on the range border", []msDeformPoint{{x: -1, y: 0.5, weight: 1}}, [2]float64{0, 0}},
		{"NaN x", []msDeformPoint{{x: nan, y: 0.5, weight: 1, raw: true}}, [2]float64{0, 0}},
		{"NaN y", []msDeformPoint{{x: 0.5, y: nan, weight: 1, raw: true}}, [2]float64{0, 0}},
		{"+Inf x", []msDeformPoint{{x: inf, y: 0.5, weight: 1, raw: true}}, [2]float64{0, 0}},
		{"-Inf y", []msDeformPoint{{x: 0.5, y: -inf, weight: 1, raw: true}}, [2]float64{0, 0}},
		// Overflows to +Inf in float32.
		{"huge x", []msDeformPoint{{x: 1e300, y: 0.5, weight: 1, raw: true}}, [2]float64{0, 0}},
		// Level 1 (1x2) at its centre: x = 0.5 between values 51 and 52.
		{"second level", []msDeformPoint{{level: 1, x: 0.5, y: 0, weight: 1}}, [2]float64{51.5, 1}},
		{"two levels", []msDeformPoint{{x: 1.25, y: 0.5, weight: 0.25}, {level: 1, x: 0.5, y: 0, weight: 0.75}},
			[2]float64{0.25*7.25 + 0.75*51.5, 1}},
		{"two points", []msDeformPoint{{x: 2, y: 1, weight: 0.25}, {slot: 1, x: 0, y: 0, weight: 0.75}},
			[2]float64{0.25*13 + 0.75*1, 1}},
		{"outside point ignores its weight", []msDeformPoint{{x: 2, y: 1, weight: 1}, {slot: 1, x: nan, y: 0, weight: inf, raw: true}},
			[2]float64{13, 1}},
	}
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		tol := autograd.TolForward64
		if dt == tensor.Float32 {
			tol = autograd.TolForward32
		}
		for _, c := range cases {
			t.Run(fmt.Sprintf("%v/%s", dt, c.name), func(t *testing.T) {
				loc, weight := msDeformHandInputs(dt, msDeformHandLevels, 2, c.pts)
				got, shape, err := runGraph(t, []*tensor.Dense{msDeformHandValue(dt, msDeformHandLevels), loc, weight}, msDeform(msDeformHandLevels))
				if err != nil {
					t.Fatal(err)
				}
				if want := (tensor.Shape{1, 1, 4}); !shape.Eq(want) {
					t.Fatalf("shape %v, want %v", shape, want)
				}
				a, w := c.want[0], c.want[1]
				want := []float64{a, w, 2 * a, 2 * w}
				if err := tol.Compare(got, want); err != nil {
					t.Errorf("got %v, want %v: %v", got, want, err)
				}
			})
		}
	}
}

// One point at pixel (x, y) = (1.25, 0.5) of a 2x4 map, loss = sum(out): the
// ramp's slopes are 1 per pixel along x and 10 along y, so the location
// gradient is (4*1, 2*10) per unit of weight; the value gradient is the
// bilinear weights (3/8, 1/8, 3/8, 1/8) of pixels (0,1), (0,2), (1,1), (1,2).
func TestMSDeformAttnBackwardHandValues(t *testing.T) {
	levels := msDeformHandLevels[:1]
	dt := tensor.Float64
	loc, weight := msDeformHandInputs(dt, levels, 1, []msDeformPoint{{x: 1.25, y: 0.5, weight: 1}})
	gradOut := fromFloat64s(dt, []float64{1, 1, 1, 1}, 1, 1, 4)
	got := msDeformRun(t, levels, msDeformHandValue(dt, levels), loc, weight, gradOut)
	want := msDeformResult{
		out:        []float64{7.25, 1, 14.5, 2},
		gradLoc:    []float64{4, 20, 8, 40},
		gradWeight: []float64{8.25, 16.5},
		gradValue:  make([]float64, 8*2*2),
	}
	for pix, w := range map[int]float64{1: 3.0 / 8, 2: 1.0 / 8, 5: 3.0 / 8, 6: 1.0 / 8} {
		for i := range 4 { // heads and channels
			want.gradValue[pix*4+i] = w
		}
	}
	if err := got.compare(autograd.TolForward64, want); err != nil {
		t.Error(err)
	}
}

// loadMSDeformTestdata reads ops/testdata/msdeform.json, written by
// ops/testdata/gen_msdeform.py.
func loadMSDeformTestdata(t *testing.T) []msDeformReference {
	t.Helper()
	b, err := os.ReadFile("testdata/msdeform.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Torch string
		Cases []msDeformReference
	}
	if err := json.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	if len(file.Cases) == 0 {
		t.Fatal("testdata/msdeform.json holds no cases")
	}
	return file.Cases
}

// msDeformReference is one case of ops/testdata/msdeform.json.
type msDeformReference struct {
	Name           string
	N, Lq, M, D, P int
	Levels         [][2]int
	Value          []float64
	Loc            []float64
	Weight         []float64
	GradOut        []float64 `json:"grad_out"`
	Out            []float64
	GradValue      []float64 `json:"grad_value"`
	GradLoc        []float64 `json:"grad_loc"`
	GradWeight     []float64 `json:"grad_weight"`
}

func (r *msDeformReference) config() msDeformConfig {
	c := msDeformConfig{n: r.N, lq: r.Lq, m: r.M, d: r.D, p: r.P}
	for _, lv := range r.Levels {
		c.levels = append(c.levels, Level{lv[0], lv[1]})
	}
	return c
}

// Parity with the pure-PyTorch grid_sample reference, forward and all three
// gradients, in float64 and (on the same float32-representable inputs) in
// float32.
func TestMSDeformAttnMatchesPyTorch(t *testing.T) {
	for _, r := range loadMSDeformTestdata(t) {
		c := r.config()
		want := msDeformResult{r.Out, r.GradValue, r.GradLoc, r.GradWeight}
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			t.Run(fmt.Sprintf("%s/%v", r.Name, dt), func(t *testing.T) {
				got := msDeformRun(t, c.levels,
					fromFloat64s(dt, r.Value, c.valueShape()...),
					fromFloat64s(dt, r.Loc, c.locShape()...),
					fromFloat64s(dt, r.Weight, c.weightShape()...),
					fromFloat64s(dt, r.GradOut, c.outShape()...))
				tol := autograd.TolForward64
				if dt == tensor.Float32 {
					tol = autograd.TolForward32
				}
				if err := got.compare(tol, want); err != nil {
					t.Errorf("%v: %v", c, err)
				}
			})
		}
	}
}

// msDeformGradCheckLocs draws sampling locations whose pixel coordinates lie in
// [-1.4, size+0.4], so some points are partly and some entirely outside their
// map, but at least 0.05 pixels from any integer: bilinear interpolation has
// kinks at integer pixel positions, where central differences are wrong.
func msDeformGradCheckLocs(rng *rand.Rand, c msDeformConfig) *tensor.Dense {
	v := make([]float64, 0, tensor.Shape(c.locShape()).TotalSize())
	for range c.n * c.lq * c.m {
		for _, lv := range c.levels {
			for range c.p {
				for _, size := range []int{lv.W, lv.H} {
					var px float64
					for {
						px = -1.4 + rng.Float64()*(float64(size)+1.8)
						if f := px - math.Floor(px); f > 0.05 && f < 0.95 {
							break
						}
					}
					v = append(v, (px+0.5)/float64(size))
				}
			}
		}
	}
	return fromFloat64s(tensor.Float64, v, c.locShape()...)
}

func TestMSDeformAttnGradCheck(t *testing.T) {
	configs := []msDeformConfig{
		{n: 1, lq: 3, m: 2, d: 2, p: 1, levels: []Level{{3, 4}}},
		{n: 2, lq: 2, m: 1, d: 3, p: 3, levels: []Level{{3, 4}}},
		{n: 1, lq: 2, m: 2, d: 2, p: 3, levels: []Level{{4, 5}, {2, 3}, {1, 2}}},
	}
	for _, c := range configs {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("%v/seed=%d", c, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 17))
				inputs := []autograd.Input{
					{Name: "value", Value: randTensor(rng, tensor.Float64, -1, 1, c.valueShape()...)},
					{Name: "samplingLoc", Value: msDeformGradCheckLocs(rng, c)},
					{Name: "attnWeight", Value: randTensor(rng, tensor.Float64, -1, 1, c.weightShape()...)},
				}
				results, err := autograd.CheckGrad(msDeform(c.levels), inputs, seed)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range results {
					if r.Scale == 0 {
						t.Errorf("%s: all gradients are zero: the check proves nothing", r.Name)
					}
				}
			})
		}
	}
}

// float32 and float64 runs of the same (float32-representable) inputs agree
// to float32 rounding, forward and backward.
//
// The location gradient is compared on small maps only. Its float32 error
// grows with the map: the pixel coordinate loc*W - 0.5 is rounded to half an
// ulp of W (1e-6 pixels at W = 32), which moves every d sample/dx, and the
// result is scaled by W. On 32x32 maps with D = 32 the error reaches 6e-5 on
// gradients of up to 200, about 2x TolForward32 on elements where the sum
// over channels cancels; Deformable-DETR's float32 kernel does the same
// arithmetic. The table assumes sums of terms of order 1, which small maps
// keep.
func TestMSDeformAttnFloat32MatchesFloat64(t *testing.T) {
	for _, c := range []struct {
		msDeformConfig
		gradLoc bool
	}{
		{msDeformConfig{n: 2, lq: 20, m: 2, d: 8, p: 4, levels: []Level{{4, 5}, {2, 3}, {1, 2}}}, true},
		{msDeformConfig{n: 1, lq: 50, m: 2, d: 32, p: 4, levels: []Level{{32, 32}, {16, 16}, {8, 8}, {4, 4}}}, false},
	} {
		rng := rand.New(rand.NewPCG(5, 5))
		in32 := []*tensor.Dense{
			randTensor(rng, tensor.Float32, -1, 1, c.valueShape()...),
			randTensor(rng, tensor.Float32, -0.1, 1.1, c.locShape()...),
			randTensor(rng, tensor.Float32, -0.2, 1, c.weightShape()...),
			randTensor(rng, tensor.Float32, -1, 1, c.outShape()...),
		}
		got := msDeformRun(t, c.levels, in32[0], in32[1], in32[2], in32[3])
		want := msDeformRun(t, c.levels, cast(t, in32[0], tensor.Float64), cast(t, in32[1], tensor.Float64),
			cast(t, in32[2], tensor.Float64), cast(t, in32[3], tensor.Float64))
		if !c.gradLoc {
			got.gradLoc, want.gradLoc = nil, nil
		}
		if err := got.compare(autograd.TolForward32, want); err != nil {
			t.Errorf("%v: %v", c.msDeformConfig, err)
		}
	}
}

// Both kernels overwrite every element of their outputs, so a stale buffer
// handed in for reuse gives the same result as a fresh one.
func TestMSDeformAttnReusesStaleBuffers(t *testing.T) {
	c := msDeformConfig{n: 2, lq: 3, m: 2, d: 3, p: 2, levels: []Level{{3, 4}, {1, 2}}}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		rng := rand.New(rand.NewPCG(3, 3))
		s := msDeformShape{n: c.n, s: c.s(), m: c.m, d: c.d, lq: c.lq, l: len(c.levels), p: c.p, levels: c.levels, dt: dt}
		in := []G.Value{
			randTensor(rng, dt, -1, 1, c.valueShape()...),
			randTensor(rng, dt, -0.2, 1.2, c.locShape()...),
			randTensor(rng, dt, -1, 1, c.weightShape()...),
		}
		gy := randTensor(rng, dt, -1, 1, c.outShape()...)
		for _, pass := range []struct {
			op   *specOp
			args []G.Value
		}{{msDeformAttnOp(s), in}, {msDeformAttnGradOp(s), append(in[:3:3], gy)}} {
			op, args := pass.op, pass.args
			fresh, err := op.Do(args...)
			if err != nil {
				t.Fatal(err)
			}
			stale := randTensor(rng, dt, 5, 6, fresh.Shape()...)
			reused, err := op.UsePreallocDo(stale, args...)
			if err != nil {
				t.Fatal(err)
			}
			if reused != G.Value(stale) {
				t.Errorf("%v %s: the preallocated buffer was not used", dt, op.name)
			}
			if err := autograd.TolForward64.Compare(toFloat64s(t, reused), toFloat64s(t, fresh)); err != nil {
				t.Errorf("%v %s: %v", dt, op.name, err)
			}
			// A buffer of the wrong shape is not used.
			wrong := randTensor(rng, dt, 5, 6, 1)
			if v, err := op.UsePreallocDo(wrong, args...); err != nil || v == G.Value(wrong) {
				t.Errorf("%v %s: a buffer of the wrong shape was used (err %v)", dt, op.name, err)
			}
		}
	}
}

func TestMSDeformAttnBadInput(t *testing.T) {
	g := G.NewGraph()
	f32 := func(name string, shape ...int) *G.Node {
		return G.NewTensor(g, tensor.Float32, len(shape), G.WithShape(shape...), G.WithName(name))
	}
	levels := []Level{{4, 4}, {2, 2}} // S = 20
	value := f32("value", 2, 20, 2, 4)
	loc := f32("loc", 2, 5, 2, 2, 3, 2)
	weight := f32("weight", 2, 5, 2, 2, 3)
	valueInt := G.NewTensor(g, tensor.Int, 4, G.WithShape(2, 20, 2, 4), G.WithName("valueInt"))
	loc64 := G.NewTensor(g, tensor.Float64, 6, G.WithShape(2, 5, 2, 2, 3, 2), G.WithName("loc64"))
	weight64 := G.NewTensor(g, tensor.Float64, 5, G.WithShape(2, 5, 2, 2, 3), G.WithName("weight64"))
	const locWant = "samplingLoc must have shape [N Lq M L P 2] = [2 Lq 2 2 P 2]"
	const weightWant = "attnWeight must have shape [N Lq M L P] = [2 5 2 2 3]"
	cases := []struct {
		name               string
		value, loc, weight *G.Node
		levels             []Level
		want               string
	}{
		{"value rank", f32("v3", 20, 2, 4), loc, weight, levels, "value must have shape [N S M D], got (20, 2, 4)"},
		{"loc rank", value, f32("l5", 2, 5, 2, 2, 3), weight, levels, "samplingLoc must have shape [N Lq M L P 2], got (2, 5, 2, 2, 3)"},
		{"weight rank", value, loc, f32("w6", 2, 5, 2, 2, 3, 1), levels, "attnWeight must have shape [N Lq M L P], got (2, 5, 2, 2, 3, 1)"},
		{"nil value", nil, loc, weight, levels, "value is nil, want shape [N S M D]"},
		{"nil loc", value, nil, weight, levels, "samplingLoc is nil, want shape [N Lq M L P 2]"},
		{"nil weight", value, loc, nil, levels, "attnWeight is nil, want shape [N Lq M L P]"},
		{"int value", valueInt, loc, weight, levels, "value must be float32 or float64, got int"},
		{"loc dtype", value, loc64, weight, levels, "samplingLoc has dtype float64, want float32"},
		{"weight dtype", value, loc, weight64, levels, "attnWeight has dtype float64, want float32"},
		{"loc last dim", value, f32("l3", 2, 5, 2, 2, 3, 3), weight, levels, locWant + " (N and M from value, L = len(levels)), got (2, 5, 2, 2, 3, 3)"},
		{"loc N", value, f32("lN", 3, 5, 2, 2, 3, 2), weight, levels, locWant},
		{"loc M", value, f32("lM", 2, 5, 4, 2, 3, 2), weight, levels, locWant},
		{"loc L", value, f32("lL", 2, 5, 2, 3, 3, 2), weight, levels, locWant},
		{"len(levels) != L", value, loc, weight, []Level{{4, 4}, {1, 2}, {1, 2}}, "= [2 Lq 2 3 P 2] (N and M from value, L = len(levels)), got (2, 5, 2, 2, 3, 2)"},
		{"weight N", value, loc, f32("wN", 1, 5, 2, 2, 3), levels, weightWant + " (from value and samplingLoc), got (1, 5, 2, 2, 3)"},
		{"weight Lq", value, loc, f32("wLq", 2, 4, 2, 2, 3), levels, weightWant},
		{"weight M", value, loc, f32("wM", 2, 5, 1, 2, 3), levels, weightWant},
		{"weight L", value, loc, f32("wL", 2, 5, 2, 1, 3), levels, weightWant},
		{"weight P", value, loc, f32("wP", 2, 5, 2, 2, 4), levels, weightWant},
		{"no levels", value, loc, weight, nil, "levels must not be empty"},
		{"zero level", value, loc, weight, []Level{{0, 4}, {2, 2}}, "levels[0] must have positive size, got 0x4"},
		{"negative level", value, loc, weight, []Level{{4, 4}, {2, -2}}, "levels[1] must have positive size, got 2x-2"},
		{"levels sum", value, loc, weight, []Level{{4, 4}, {2, 3}}, "value must have shape [N S M D] with S = 4*4+2*3 = 22, the sum of H*W over levels, got (2, 20, 2, 4)"},
		{"levels sum short", value, loc, weight, []Level{{4, 4}, {1, 2}}, "with S = 4*4+1*2 = 18"},
		{"huge level", value, loc, weight, []Level{{1 << 40, 1 << 40}, {2, 2}}, "the sum of H*W over levels, got (2, 20, 2, 4)"},
	}
	for _, c := range cases {
		_, err := MSDeformAttn(c.value, c.loc, c.weight, c.levels)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "ops: MSDeformAttn: ") {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
}

// Nodes of MSDeformAttn over differently shaped levels of the same total size
// must not be merged by gorgonia.
func TestMSDeformAttnHashDistinguishesLevels(t *testing.T) {
	g := G.NewGraph()
	value := G.NewTensor(g, tensor.Float64, 4, G.WithShape(1, 20, 1, 2), G.WithName("value"))
	loc := G.NewTensor(g, tensor.Float64, 6, G.WithShape(1, 3, 1, 2, 1, 2), G.WithName("loc"))
	weight := G.NewTensor(g, tensor.Float64, 5, G.WithShape(1, 3, 1, 2, 1), G.WithName("weight"))
	seen := map[*G.Node][]Level{}
	for _, levels := range [][]Level{{{4, 4}, {2, 2}}, {{2, 8}, {2, 2}}, {{2, 2}, {4, 4}}, {{4, 4}, {1, 4}}} {
		n, err := MSDeformAttn(value, loc, weight, levels)
		if err != nil {
			t.Fatal(err)
		}
		if prev, ok := seen[n]; ok {
			t.Errorf("levels %v merged with levels %v", levels, prev)
		}
		seen[n] = levels
	}
}

// MSDeformAttn trains: gradients flow through G.Grad into dual values, and a
// few Adam steps on value, samplingLoc and attnWeight reduce a squared error.
func TestMSDeformAttnAdam(t *testing.T) {
	c := msDeformConfig{n: 1, lq: 4, m: 2, d: 3, p: 2, levels: []Level{{4, 5}, {2, 3}}}
	rng := rand.New(rand.NewPCG(9, 9))
	g := G.NewGraph()
	value := G.NodeFromAny(g, randTensor(rng, tensor.Float32, -1, 1, c.valueShape()...), G.WithName("value"))
	loc := G.NodeFromAny(g, randTensor(rng, tensor.Float32, 0.1, 0.9, c.locShape()...), G.WithName("loc"))
	weight := G.NodeFromAny(g, randTensor(rng, tensor.Float32, 0, 1, c.weightShape()...), G.WithName("weight"))
	target := G.NodeFromAny(g, randTensor(rng, tensor.Float32, -1, 1, c.outShape()...), G.WithName("target"))
	out, err := MSDeformAttn(value, loc, weight, c.levels)
	if err != nil {
		t.Fatal(err)
	}
	loss := G.Must(G.Mean(G.Must(G.Square(G.Must(G.Sub(out, target))))))
	learnables := G.Nodes{value, loc, weight}
	before := make([][]float64, len(learnables))
	for i, n := range learnables {
		before[i] = toFloat64s(t, n.Value())
	}
	losses := adamLosses(t, g, loss, learnables, 0.02, 5)
	for i, l := range losses {
		if math.IsNaN(l) || math.IsInf(l, 0) {
			t.Fatalf("step %d: loss %v", i, l)
		}
	}
	if !(losses[len(losses)-1] < losses[0]) {
		t.Errorf("Adam did not reduce the loss: %v", losses)
	}
	// Every input received a gradient: Adam moved each one.
	for i, n := range learnables {
		if err := autograd.TolForward32.Compare(toFloat64s(t, n.Value()), before[i]); err == nil {
			t.Errorf("%s did not change in %d Adam steps", n.Name(), len(losses))
		}
	}
}

// msDeformFuzzConfig is the call FuzzMSDeformAttn makes: 32 sampling coordinates.
var msDeformFuzzConfig = msDeformConfig{n: 1, lq: 2, m: 2, d: 3, p: 2, levels: []Level{{3, 4}, {1, 2}}}

// msDeformFuzzLocs reads float64 bit patterns from data, 8 bytes each, repeating data
// to fill n coordinates.
func msDeformFuzzLocs(data []byte, n int) []float64 {
	if len(data) == 0 {
		data = make([]byte, 8)
	}
	for len(data) < 8*n {
		data = append(data, data...)
	}
	v := make([]float64, n)
	for i := range v {
		v[i] = math.Float64frombits(binary.LittleEndian.Uint64(data[8*i:]))
	}
	return v
}

func msDeformFuzzBytes(v ...float64) []byte {
	b := make([]byte, 0, 8*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
	}
	return b
}

// Sampling locations come from a network and can be anything: whatever their
// bits, both passes run, return no error and, with finite values and
// weights, produce finite outputs and gradients.
func FuzzMSDeformAttn(f *testing.F) {
	nan, inf := math.NaN(), math.Inf(1)
	f.Add(msDeformFuzzBytes(0.5, 0.5))
	f.Add(msDeformFuzzBytes(nan, 0.5, 0.5, nan, inf, -inf, -inf, inf))
	f.Add(msDeformFuzzBytes(math.MaxFloat64, -math.MaxFloat64, 1e300, -1e300, 3.5e38, -3.5e38))
	f.Add(msDeformFuzzBytes(0, math.Copysign(0, -1), 5e-324, 1, 1.0000000000000002, 0.9999999999999999))
	// Exactly on the borders of the sampling range: pixel -1 and pixel W.
	f.Add(msDeformFuzzBytes(-0.125, -0.25, 1.125, 1.25, -0.5, 1.5, -1/6.0, 7/6.0))
	f.Add(binary.LittleEndian.AppendUint64(nil, 0x7ff8000000000001))
	f.Add(binary.LittleEndian.AppendUint64(nil, 0xfff0000000000001))
	f.Add([]byte{1, 2, 3})

	c := msDeformFuzzConfig
	rng := rand.New(rand.NewPCG(1, 2))
	value := randTensor(rng, tensor.Float64, -1, 1, c.valueShape()...)
	weight := randTensor(rng, tensor.Float64, -1, 1, c.weightShape()...)
	gy := randTensor(rng, tensor.Float64, -1, 1, c.outShape()...)
	nloc := tensor.Shape(c.locShape()).TotalSize()
	f.Fuzz(func(t *testing.T, data []byte) {
		locs := msDeformFuzzLocs(data, nloc)
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			s := msDeformShape{n: c.n, s: c.s(), m: c.m, d: c.d, lq: c.lq, l: len(c.levels), p: c.p, levels: c.levels, dt: dt}
			in := []G.Value{cast(t, value, dt), fromFloat64s(dt, locs, c.locShape()...), cast(t, weight, dt), cast(t, gy, dt)}
			out, err := msDeformAttnOp(s).Do(in[:3]...)
			if err != nil {
				t.Fatalf("%v: forward: %v", dt, err)
			}
			grads, err := msDeformAttnGradOp(s).Do(in...)
			if err != nil {
				t.Fatalf("%v: backward: %v", dt, err)
			}
			for name, v := range map[string]G.Value{"output": out, "gradients": grads} {
				for i, x := range toFloat64s(t, v) {
					if math.IsNaN(x) || math.IsInf(x, 0) {
						t.Fatalf("%v: %s[%d] = %v for locations %v", dt, name, i, x, locs)
					}
				}
			}
		}
	})
}

// msDeformBenchCases are CPU-sized versions of the Deformable-DETR shapes in
// /work/shared/TARGETS.md: its decoder (300 queries) on a 4-level pyramid
// of a small image, and its encoder, where every pixel is a query.
var msDeformBenchCases = []struct {
	name string
	c    msDeformConfig
}{
	{"decoder", msDeformConfig{n: 1, lq: 300, m: 8, d: 32, p: 4, levels: []Level{{32, 32}, {16, 16}, {8, 8}, {4, 4}}}},
	{"encoder", msDeformConfig{n: 1, lq: 1360, m: 8, d: 32, p: 4, levels: []Level{{32, 32}, {16, 16}, {8, 8}, {4, 4}}}},
}

func BenchmarkMSDeformAttn(b *testing.B) {
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, bc := range msDeformBenchCases {
			c := bc.c
			rng := rand.New(rand.NewPCG(1, 1))
			s := msDeformShape{n: c.n, s: c.s(), m: c.m, d: c.d, lq: c.lq, l: len(c.levels), p: c.p, levels: c.levels, dt: dt}
			in := []G.Value{
				randTensor(rng, dt, -1, 1, c.valueShape()...),
				randTensor(rng, dt, 0, 1, c.locShape()...),
				randTensor(rng, dt, 0, 1.0/float64(len(c.levels)*c.p), c.weightShape()...),
				randTensor(rng, dt, -1, 1, c.outShape()...),
			}
			samples := float64(c.n * c.lq * c.m * len(c.levels) * c.p)
			for _, pass := range []struct {
				name string
				op   interface {
					UsePreallocDo(G.Value, ...G.Value) (G.Value, error)
				}
				in    []G.Value
				shape tensor.Shape
			}{
				{"fwd", msDeformAttnOp(s), in[:3], s.outShape()},
				{"bwd", msDeformAttnGradOp(s), in, s.packedShape()},
			} {
				b.Run(fmt.Sprintf("impl=cpu/dtype=%v/case=%s/pass=%s", dt, bc.name, pass.name), func(b *testing.B) {
					buf := tensor.New(tensor.Of(dt), tensor.WithShape(pass.shape...))
					for b.Loop() {
						if _, err := pass.op.UsePreallocDo(buf, pass.in...); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(samples*float64(b.N)/b.Elapsed().Seconds(), "samples/s")
				})
			}
		}
	}
}

// The kernel choice: msdeform_sm90a.cu's vector-reduction backward only for
// float32 with D % 4 == 0 and aligned pointers, on a GPU that runs it;
// msdeform.cu's kernels otherwise, and always forward. Whatever the inputs,
// the choice is a kernel the shipped modules hold, not a variant.
func TestMSDeformKernelFor(t *testing.T) {
	cases := []struct {
		backward              bool
		dt                    tensor.Dtype
		d                     int
		aligned, quad, sorted bool
		want                  cuda.Kernel[cuda.MSDeformParams]
		wantMod               string
	}{
		{true, tensor.Float32, 32, true, true, false, cuda.MSDeformBwdRed4Rs4Occ3F32, "msdeform_sm90a"},
		{true, tensor.Float32, 32, true, false, false, cuda.MSDeformBwdAtomicC4Rs4Occ3F32, "msdeform"},
		{true, tensor.Float32, 30, true, true, false, cuda.MSDeformBwdAtomicC4Rs4Occ3F32, "msdeform"},
		{true, tensor.Float32, 32, false, true, false, cuda.MSDeformBwdAtomicC4Rs4Occ3F32, "msdeform"},
		{true, tensor.Float64, 32, true, true, false, cuda.MSDeformBwdAtomicC4Rs4F64, "msdeform"},
		{false, tensor.Float32, 32, true, true, false, cuda.MSDeformFwdV16bOcc5F32, "msdeform"},
		{false, tensor.Float32, 30, true, true, false, cuda.MSDeformFwdScalarF32, "msdeform"},
		{false, tensor.Float32, 32, true, true, true, cuda.MSDeformFwdV16bSortedF32, "msdeform"},
		{false, tensor.Float32, 30, true, true, true, cuda.MSDeformFwdScalarSortedF32, "msdeform"},
		{false, tensor.Float64, 32, true, false, true, cuda.MSDeformFwdV16bSortedF64, "msdeform"},
		{false, tensor.Float64, 32, false, false, true, cuda.MSDeformFwdScalarSortedF64, "msdeform"},
		{false, tensor.Float64, 32, true, false, false, cuda.MSDeformFwdV16bF64, "msdeform"},
	}
	for _, c := range cases {
		k, err := msDeformKernelFor(c.backward, c.dt, c.d, c.aligned, c.quad, c.sorted)
		if err != nil || k.k != c.want || k.k.Module() != c.wantMod || k.sorted != c.sorted {
			t.Errorf("msDeformKernelFor(backward %v, %v, D %d, aligned %v, quad %v, sorted %v) = %s (sorted %v), %v; want %s in %s",
				c.backward, c.dt, c.d, c.aligned, c.quad, c.sorted, string(k.k), k.sorted, err, c.want.Name(), c.wantMod)
		}
	}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, d := range []int{1, 2, 4, 30, 32} {
			for i := range 16 {
				backward, aligned, quad, sorted := i&1 != 0, i&2 != 0, i&4 != 0, i&8 != 0 && i&1 == 0
				k, err := msDeformKernelFor(backward, dt, d, aligned, quad, sorted)
				if err != nil {
					t.Fatal(err)
				}
				if info, ok := cuda.Lookup(string(k.k)); !ok || info.Variant || info.Params != "MSDeformParams" {
					t.Errorf("msDeformKernelFor(backward %v, %v, D %d, aligned %v, quad %v, sorted %v) = %s: %+v, %v; want a shipped kernel",
						backward, dt, d, aligned, quad, sorted, string(k.k), info, ok)
				}
			}
		}
	}
	if _, err := msDeformKernelFor(false, tensor.Int32, 32, true, false, false); err == nil {
		t.Error("msDeformKernelFor(int32): no error")
	}
}

// The forward sorts queries only from msDeformOrderMin per image and not
// when every pixel is a query, and its grid of cells never exceeds what
// msdeform_sort_scan's shared memory holds.
func TestMSDeformQueryOrderRule(t *testing.T) {
	cases := []struct {
		name        string
		lq          int
		lv0         Level
		encoder     bool // Lq == S
		sorts       bool
		bands, cols int
	}{
		{"detr_decoder", 300, Level{100, 167}, false, false, 13, 167},
		{"just below", msDeformOrderMin - 1, Level{92, 160}, false, false, 12, 160},
		{"seed_full", 15422, Level{92, 160}, false, true, 12, 160},
		{"encoder", 0, Level{100, 167}, true, false, 13, 167},
		{"8400 cells: columns merged once", 20000, Level{200, 336}, false, true, 25, 168},
		{"one pixel", 20000, Level{1, 1}, false, true, 1, 1},
		{"10000 bands halved: columns cannot merge", 20000, Level{80000, 1}, false, true, 5000, 1},
	}
	for _, c := range cases {
		levels := []Level{c.lv0, {(c.lv0.H + 1) / 2, (c.lv0.W + 1) / 2}}
		s := msDeformShape{n: 1, m: 8, d: 32, l: 2, p: 4, levels: levels, dt: tensor.Float32}
		for _, lv := range levels {
			s.s += lv.H * lv.W
		}
		s.lq = c.lq
		if c.encoder {
			s.lq = s.s
		}
		if got := s.sortsQueries(); got != c.sorts {
			t.Errorf("%s: Lq %d, S %d: sortsQueries = %v, want %v", c.name, s.lq, s.s, got, c.sorts)
		}
		bands, cols := s.orderGrid(msDeformOrderBandRows)
		if bands != c.bands || cols != c.cols || bands*cols > cuda.MSDeformOrderCells {
			t.Errorf("%s: level 0 %dx%d: orderGrid = %d x %d, want %d x %d (at most %d cells)",
				c.name, c.lv0.H, c.lv0.W, bands, cols, c.bands, c.cols, cuda.MSDeformOrderCells)
		}
	}
}

// The backward op has no gradient of its own: it says so, and asking for
// one is an error rather than a wrong graph.
func TestMSDeformAttnNoSecondDerivatives(t *testing.T) {
	c := msDeformConfig{n: 1, lq: 2, m: 1, d: 2, p: 1, levels: []Level{{2, 2}}}
	s := msDeformShape{n: c.n, s: c.s(), m: c.m, d: c.d, lq: c.lq, l: len(c.levels), p: c.p, levels: c.levels, dt: tensor.Float64}
	op := msDeformAttnGradOp(s)
	if slices.Contains(op.DiffWRT(4), true) {
		t.Errorf("DiffWRT = %v, want all false", op.DiffWRT(4))
	}
	g := G.NewGraph()
	in := G.Nodes{
		G.NewTensor(g, tensor.Float64, 4, G.WithShape(s.valueShape()...), G.WithName("value")),
		G.NewTensor(g, tensor.Float64, 6, G.WithShape(s.locShape()...), G.WithName("loc")),
		G.NewTensor(g, tensor.Float64, 5, G.WithShape(s.weightShape()...), G.WithName("weight")),
		G.NewTensor(g, tensor.Float64, 3, G.WithShape(s.outShape()...), G.WithName("grad")),
	}
	if _, err := op.SymDiff(in, nil, nil); err == nil || !strings.Contains(err.Error(), "second derivatives of MSDeformAttn are not implemented") {
		t.Errorf("SymDiff: got %v", err)
	}
}
