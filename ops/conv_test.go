package ops

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
)

// convBuilder builds the graph under test from its input nodes.
type convBuilder = func(g *G.ExprGraph, in G.Nodes) (*G.Node, error)

// runWithGrads builds a graph with one input node per tensor, applies build,
// and runs it once on a TapeMachine made with opts. It returns the output
// and, when proj is non-nil, the gradients of sum(output ⊙ proj) with
// respect to every input, as float64.
func runWithGrads(t testing.TB, inputs []*tensor.Dense, proj *tensor.Dense, build convBuilder, opts ...G.VMOpt) (y []float64, grads [][]float64, err error) {
	t.Helper()
	g := G.NewGraph()
	nodes := make(G.Nodes, len(inputs))
	for i, d := range inputs {
		nodes[i] = G.NodeFromAny(g, d, G.WithName(fmt.Sprintf("in%d", i)))
	}
	out, err := build(g, nodes)
	if err != nil {
		return nil, nil, err
	}
	var yv G.Value
	G.Read(out, &yv)
	var gv []G.Value
	if proj != nil {
		pn := G.NodeFromAny(g, proj, G.WithName("proj"))
		prod, err := G.HadamardProd(out, pn)
		if err != nil {
			return nil, nil, err
		}
		loss, err := G.Sum(prod)
		if err != nil {
			return nil, nil, err
		}
		gs, err := G.Grad(loss, nodes...)
		if err != nil {
			return nil, nil, err
		}
		gv = make([]G.Value, len(gs))
		for i := range gs {
			G.Read(gs[i], &gv[i])
		}
	}
	m := G.NewTapeMachine(g, opts...)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		return nil, nil, err
	}
	y = toFloat64s(t, yv)
	for _, v := range gv {
		grads = append(grads, toFloat64s(t, v))
	}
	return y, grads, nil
}

func convWith(cfg ConvConfig) convBuilder {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		var b *G.Node
		if len(in) > 2 {
			b = in[2]
		}
		return Conv(in[0], in[1], b, cfg)
	}
}

func seq(n int) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = float64(i + 1)
	}
	return v
}

func TestConvHandValues(t *testing.T) {
	ramp := seq(9) // 3x3: 1 2 3 / 4 5 6 / 7 8 9
	ones := []float64{1, 1, 1, 1, 1, 1, 1, 1, 1}
	cases := []struct {
		name      string
		x         []float64
		xs        []int
		w         []float64
		ws        []int
		bias      []float64
		cfg       ConvConfig
		want      []float64
		wantShape tensor.Shape
	}{
		// Each output is the sum of a 2x2 window: 1+2+4+5, 2+3+5+6, ...
		{"2x2 window sums", ramp, []int{1, 1, 3, 3}, ones[:4], []int{1, 1, 2, 2}, nil,
			ConvConfig{}, []float64{12, 16, 24, 28}, tensor.Shape{1, 1, 2, 2}},
		{"bias and relu", ramp, []int{1, 1, 3, 3}, ones[:4], []int{1, 1, 2, 2}, []float64{-20},
			ConvConfig{Act: ActReLU}, []float64{0, 0, 4, 8}, tensor.Shape{1, 1, 2, 2}},
		// Windows centred on the corners; the padding adds nothing.
		{"3x3 stride 2 pad 1", ramp, []int{1, 1, 3, 3}, ones, []int{1, 1, 3, 3}, nil,
			ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}}, []float64{12, 16, 24, 28}, tensor.Shape{1, 1, 2, 2}},
		// The taps fall on the four corners: 1*1 + 10*3 + 100*7 + 1000*9.
		{"dilation 2", ramp, []int{1, 1, 3, 3}, []float64{1, 10, 100, 1000}, []int{1, 1, 2, 2}, nil,
			ConvConfig{Dilation: [2]int{2, 2}}, []float64{9731}, tensor.Shape{1, 1, 1, 1}},
		// Output 0 copies channel 0; output 1 is 0.5*channel0 - 2*channel1.
		{"channels", []float64{1, 2, 3, 1, 1, 1}, []int{1, 2, 1, 3}, []float64{1, 0, 0.5, -2}, []int{2, 2, 1, 1}, nil,
			ConvConfig{}, []float64{1, 2, 3, -1.5, -1, -0.5}, tensor.Shape{1, 2, 1, 3}},
		// Rows 0 and 2 of a 3x4 ramp, 2*x[r,c] + x[r,c+1].
		{"stride (2,1), 1x2 kernel", seq(12), []int{1, 1, 3, 4}, []float64{2, 1}, []int{1, 1, 1, 2}, nil,
			ConvConfig{Stride: [2]int{2, 1}}, []float64{4, 7, 10, 28, 31, 34}, tensor.Shape{1, 1, 2, 3}},
		{"padding along W only", ramp, []int{1, 1, 3, 3}, []float64{1}, []int{1, 1, 1, 1}, nil,
			ConvConfig{Pad: [2]int{0, 1}}, []float64{0, 1, 2, 3, 0, 0, 4, 5, 6, 0, 0, 7, 8, 9, 0}, tensor.Shape{1, 1, 3, 5}},
		{"batch of two", seq(8), []int{2, 1, 2, 2}, ones[:4], []int{1, 1, 2, 2}, []float64{0.5},
			ConvConfig{}, []float64{10.5, 26.5}, tensor.Shape{2, 1, 1, 1}},
	}
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		for _, c := range cases {
			t.Run(fmt.Sprintf("%v/%s", dt, c.name), func(t *testing.T) {
				in := []*tensor.Dense{fromFloat64s(dt, c.x, c.xs...), fromFloat64s(dt, c.w, c.ws...)}
				if c.bias != nil {
					in = append(in, fromFloat64s(dt, c.bias, len(c.bias)))
				}
				got, shape, err := runGraph(t, in, convWith(c.cfg))
				if err != nil {
					t.Fatal(err)
				}
				if !shape.Eq(c.wantShape) {
					t.Fatalf("shape %v, want %v", shape, c.wantShape)
				}
				if err := forwardTol(dt).Compare(got, c.want); err != nil {
					t.Errorf("got %v, want %v: %v", got, c.want, err)
				}
			})
		}
	}
}

func forwardTol(dt tensor.Dtype) autograd.Tolerance {
	if dt == tensor.Float32 {
		return autograd.TolForward32
	}
	return autograd.TolForward64
}

// With loss = sum(y), dw[k] is the sum of the inputs tap k meets, dx counts
// the windows covering each pixel, and db the outputs; with the ReLU only the
// two outputs above zero (24-20 and 28-20) count.
func TestConvBackwardHandValues(t *testing.T) {
	ramp := seq(9)
	cases := []struct {
		name           string
		bias           float64
		act            Activation
		dx, dw, dbWant []float64
	}{
		{"linear", 0, ActNone, []float64{1, 2, 1, 2, 4, 2, 1, 2, 1}, []float64{12, 16, 24, 28}, []float64{4}},
		{"relu", -20, ActReLU, []float64{0, 0, 0, 1, 2, 1, 1, 2, 1}, []float64{9, 11, 15, 17}, []float64{2}},
	}
	for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
		for _, c := range cases {
			in := []*tensor.Dense{
				fromFloat64s(dt, ramp, 1, 1, 3, 3),
				fromFloat64s(dt, []float64{1, 1, 1, 1}, 1, 1, 2, 2),
				fromFloat64s(dt, []float64{c.bias}, 1),
			}
			proj := fromFloat64s(dt, []float64{1, 1, 1, 1}, 1, 1, 2, 2)
			_, grads, err := runWithGrads(t, in, proj, convWith(ConvConfig{Act: c.act}))
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range [][]float64{c.dx, c.dw, c.dbWant} {
				if err := forwardTol(dt).Compare(grads[i], want); err != nil {
					t.Errorf("%v %s: gradient %d is %v, want %v: %v", dt, c.name, i, grads[i], want, err)
				}
			}
		}
	}
}

// convRef is ops/testdata/conv.json, written by gen_conv.py.
type convRef struct {
	Torch string        `json:"torch"`
	Cases []convRefCase `json:"cases"`
}

type convRefTensor struct {
	Shape []int     `json:"shape"`
	Data  []float64 `json:"data"`
}

func (r convRefTensor) dense(dt tensor.Dtype) *tensor.Dense {
	return fromFloat64s(dt, r.Data, r.Shape...)
}

type convRefCase struct {
	Name             string                   `json:"name"`
	Kind             string                   `json:"kind"`
	Stride           [2]int                   `json:"stride"`
	Pad              [2]int                   `json:"pad"`
	Dilation         [2]int                   `json:"dilation"`
	Act              string                   `json:"act"`
	Training         bool                     `json:"training"`
	Momentum         float64                  `json:"momentum"`
	Eps              float64                  `json:"eps"`
	Inputs           map[string]convRefTensor `json:"inputs"`
	Proj             []float64                `json:"proj"`
	Y                convRefTensor            `json:"y"`
	Grads            map[string][]float64     `json:"grads"`
	RunningMean      []float64                `json:"running_mean"`
	RunningVar       []float64                `json:"running_var"`
	RunningMeanAfter []float64                `json:"running_mean_after"`
	RunningVarAfter  []float64                `json:"running_var_after"`

	// kind "convbn_steps": two training batches, then one in evaluation.
	XShape       []int         `json:"x_shape"`
	W            convRefTensor `json:"w"`
	Gamma        []float64     `json:"gamma"`
	Beta         []float64     `json:"beta"`
	Batches      [][]float64   `json:"batches"`
	Outputs      [][]float64   `json:"outputs"`
	RunningMeans [][]float64   `json:"running_means"`
	RunningVars  [][]float64   `json:"running_vars"`
}

func (c *convRefCase) config() ConvConfig {
	cfg := ConvConfig{Stride: c.Stride, Pad: c.Pad, Dilation: c.Dilation}
	if c.Act == "relu" {
		cfg.Act = ActReLU
	}
	return cfg
}

// loadConvRef reads the PyTorch reference, failing the test when it is
// missing: the reference is checked in, so a missing file is a broken tree.
func loadConvRef(t testing.TB, kind string) []convRefCase {
	t.Helper()
	b, err := os.ReadFile("testdata/conv.json")
	if err != nil {
		t.Fatalf("reading the reference (regenerate with /usr/bin/python3 ops/testdata/gen_conv.py > ops/testdata/conv.json): %v", err)
	}
	var ref convRef
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatalf("decoding testdata/conv.json: %v", err)
	}
	var cases []convRefCase
	for _, c := range ref.Cases {
		if c.Kind == kind {
			cases = append(cases, c)
		}
	}
	if len(cases) == 0 {
		t.Fatalf("testdata/conv.json has no case of kind %q", kind)
	}
	return cases
}

func TestConvMatchesPyTorch(t *testing.T) {
	for _, c := range loadConvRef(t, "conv") {
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			t.Run(fmt.Sprintf("%v/%s", dt, c.Name), func(t *testing.T) {
				names := []string{"x", "w"}
				if _, ok := c.Inputs["bias"]; ok {
					names = append(names, "bias")
				}
				var in []*tensor.Dense
				for _, n := range names {
					in = append(in, c.Inputs[n].dense(dt))
				}
				proj := fromFloat64s(dt, c.Proj, c.Y.Shape...)
				y, grads, err := runWithGrads(t, in, proj, convWith(c.config()))
				if err != nil {
					t.Fatal(err)
				}
				tol := forwardTol(dt)
				if err := tol.Compare(y, c.Y.Data); err != nil {
					t.Errorf("y: %v", err)
				}
				for i, n := range names {
					if err := tol.Compare(grads[i], c.Grads[n]); err != nil {
						t.Errorf("gradient of %s: %v", n, err)
					}
				}
			})
		}
	}
}

// kinkMargin is how far from zero every pre-activation of a gradient check
// through a ReLU must be. The check moves inputs by 1e-6, which moves the
// pre-activations by about as much; a pre-activation within that of zero
// would make the central difference straddle the kink and compare a
// one-sided slope with half of it.
const kinkMargin = 1e-3

// drawAwayFromKink calls draw until pre, the pre-activations of the drawn
// inputs, has no element within kinkMargin of zero, and fails the test if
// that takes implausibly many draws.
func drawAwayFromKink(t *testing.T, draw func() []*tensor.Dense, pre func([]*tensor.Dense) []float64) []*tensor.Dense {
	t.Helper()
	for range 50 {
		in := draw()
		closest := math.Inf(1)
		for _, v := range pre(in) {
			closest = min(closest, math.Abs(v))
		}
		if closest >= kinkMargin {
			return in
		}
	}
	t.Fatalf("no draw in 50 keeps the pre-activations %v away from zero", kinkMargin)
	return nil
}

func TestConvGradCheck(t *testing.T) {
	configs := []struct {
		name   string
		xs, ws []int
		cfg    ConvConfig
		bias   bool
	}{
		{"3x3 pad 1 relu bias", []int{2, 2, 5, 6}, []int{3, 2, 3, 3}, ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU}, true},
		{"1x1 no bias", []int{2, 3, 4, 4}, []int{2, 3, 1, 1}, ConvConfig{}, false},
		{"stride 2 pad 1 relu bias", []int{1, 2, 7, 6}, []int{3, 2, 3, 3}, ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}, Act: ActReLU}, true},
		{"dilation 2 pad 2 bias", []int{1, 2, 7, 7}, []int{2, 2, 3, 3}, ConvConfig{Pad: [2]int{2, 2}, Dilation: [2]int{2, 2}}, true},
		{"stride (2,1) dilation (1,2) relu", []int{2, 2, 6, 7}, []int{2, 2, 2, 3},
			ConvConfig{Stride: [2]int{2, 1}, Pad: [2]int{0, 1}, Dilation: [2]int{1, 2}, Act: ActReLU}, false},
	}
	for _, c := range configs {
		for seed := uint64(1); seed <= 2; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", c.name, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 17))
				draw := func() []*tensor.Dense {
					in := []*tensor.Dense{
						randTensor(rng, tensor.Float64, -1, 1, c.xs...),
						randTensor(rng, tensor.Float64, -0.5, 0.5, c.ws...),
					}
					if c.bias {
						in = append(in, randTensor(rng, tensor.Float64, -0.5, 0.5, c.ws[0]))
					}
					return in
				}
				var in []*tensor.Dense
				if c.cfg.Act == ActReLU {
					linear := c.cfg
					linear.Act = ActNone
					in = drawAwayFromKink(t, draw, func(in []*tensor.Dense) []float64 {
						y, _, err := runGraph(t, in, convWith(linear))
						if err != nil {
							t.Fatal(err)
						}
						return y
					})
				} else {
					in = draw()
				}
				inputs := []autograd.Input{{Name: "x", Value: in[0]}, {Name: "w", Value: in[1]}}
				if c.bias {
					inputs = append(inputs, autograd.Input{Name: "bias", Value: in[2]})
				}
				results, err := autograd.CheckGrad(convWith(c.cfg), inputs, seed)
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

func TestConvBadInput(t *testing.T) {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float32, 4, G.WithShape(2, 3, 8, 8), G.WithName("x"))
	x3 := G.NewTensor(g, tensor.Float32, 3, G.WithShape(3, 8, 8), G.WithName("x3"))
	xi := G.NewTensor(g, tensor.Int, 4, G.WithShape(2, 3, 8, 8), G.WithName("xi"))
	w := G.NewTensor(g, tensor.Float32, 4, G.WithShape(4, 3, 3, 3), G.WithName("w"))
	w2 := G.NewMatrix(g, tensor.Float32, G.WithShape(4, 27), G.WithName("w2"))
	wCin := G.NewTensor(g, tensor.Float32, 4, G.WithShape(4, 5, 3, 3), G.WithName("wCin"))
	w64 := G.NewTensor(g, tensor.Float64, 4, G.WithShape(4, 3, 3, 3), G.WithName("w64"))
	wBig := G.NewTensor(g, tensor.Float32, 4, G.WithShape(4, 3, 9, 3), G.WithName("wBig"))
	bias := G.NewVector(g, tensor.Float32, G.WithShape(4), G.WithName("bias"))
	bias5 := G.NewVector(g, tensor.Float32, G.WithShape(5), G.WithName("bias5"))
	bias64 := G.NewVector(g, tensor.Float64, G.WithShape(4), G.WithName("bias64"))
	biasM := G.NewMatrix(g, tensor.Float32, G.WithShape(4, 1), G.WithName("biasM"))
	ok := ConvConfig{Pad: [2]int{1, 1}}
	with := func(f func(*ConvConfig)) ConvConfig { c := ok; f(&c); return c }
	cases := []struct {
		name    string
		x, w, b *G.Node
		cfg     ConvConfig
		want    string
	}{
		{"x rank", x3, w, nil, ok, "x must have shape [N Cin H W], got (3, 8, 8)"},
		{"w rank", x, w2, nil, ok, "w must have shape [Cout Cin KH KW], got (4, 27)"},
		{"nil x", nil, w, nil, ok, "x is nil"},
		{"nil w", x, nil, nil, ok, "w is nil"},
		{"int x", xi, w, nil, ok, "x must be float32 or float64, got int"},
		{"dtype mismatch", x, w64, nil, ok, "w has dtype float64, want float32"},
		{"Cin mismatch", x, wCin, nil, ok, "w must have shape [Cout 3 KH KW] to match the 3 channels of x, got (4, 5, 3, 3)"},
		{"bias shape", x, w, bias5, ok, "bias must have shape [4], got (5)"},
		{"bias rank", x, w, biasM, ok, "bias must have shape [4], got (4, 1)"},
		{"bias dtype", x, w, bias64, ok, "bias has dtype float64, want float32"},
		{"negative stride", x, w, bias, with(func(c *ConvConfig) { c.Stride = [2]int{1, -2} }), "Stride must be positive (or 0 for 1), got [1 -2]"},
		{"negative dilation", x, w, bias, with(func(c *ConvConfig) { c.Dilation = [2]int{-1, 1} }), "Dilation must be positive (or 0 for 1), got [-1 1]"},
		{"negative pad", x, w, bias, with(func(c *ConvConfig) { c.Pad = [2]int{0, -1} }), "Pad must be non-negative, got [0 -1]"},
		{"unknown activation", x, w, bias, with(func(c *ConvConfig) { c.Act = 7 }), "unknown Activation 7"},
		{"kernel larger than padded input", x, wBig, nil, ConvConfig{}, "the dilated kernel spans 9x3, more than the padded input 8x8"},
		{"dilated kernel too large", x, w, nil, ConvConfig{Dilation: [2]int{1, 4}}, "the dilated kernel spans 3x9, more than the padded input 8x8"},
	}
	for _, c := range cases {
		_, err := Conv(c.x, c.w, c.b, c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "ops: Conv: ") {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
	// The padding makes the same kernel fit; zero stride and dilation mean 1.
	if _, err := Conv(x, wBig, nil, ConvConfig{Pad: [2]int{1, 0}}); err != nil {
		t.Errorf("9x3 kernel on an 8x8 input padded to 10x8: %v", err)
	}
	y, err := Conv(x, w, bias, ConvConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (tensor.Shape{2, 4, 6, 6}); !y.Shape().Eq(want) {
		t.Errorf("zero stride and dilation: output shape %v, want %v", y.Shape(), want)
	}
}

// Nodes of Conv with different configs must not be merged by gorgonia, and
// the forward and backward ops of one config must not collide either.
func TestConvHashDistinguishesConfigs(t *testing.T) {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 4, G.WithShape(1, 2, 8, 8), G.WithName("x"))
	w := G.NewTensor(g, tensor.Float64, 4, G.WithShape(2, 2, 3, 3), G.WithName("w"))
	b := G.NewVector(g, tensor.Float64, G.WithShape(2), G.WithName("b"))
	base := ConvConfig{Stride: [2]int{1, 1}, Pad: [2]int{1, 1}, Dilation: [2]int{1, 1}}
	variants := []ConvConfig{base}
	for _, f := range []func(*ConvConfig){
		func(c *ConvConfig) { c.Act = ActReLU },
		func(c *ConvConfig) { c.Stride[0] = 2 },
		func(c *ConvConfig) { c.Stride[1] = 2 },
		func(c *ConvConfig) { c.Pad[0] = 2 },
		func(c *ConvConfig) { c.Pad[1] = 0 },
		func(c *ConvConfig) { c.Dilation[0] = 2 },
		func(c *ConvConfig) { c.Dilation[1] = 2 },
	} {
		c := base
		f(&c)
		variants = append(variants, c)
	}
	seen := map[*G.Node]string{}
	add := func(n *G.Node, err error, what string) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if prev, ok := seen[n]; ok {
			t.Errorf("%s merged with %s", what, prev)
		}
		seen[n] = what
	}
	for _, c := range variants {
		n, err := Conv(x, w, b, c)
		add(n, err, fmt.Sprintf("%+v with bias", c))
		n, err = Conv(x, w, nil, c)
		add(n, err, fmt.Sprintf("%+v without bias", c))
	}
	ops := []G.Op{}
	for _, s := range []convShape{{bias: true, dt: tensor.Float64}, {bias: false, dt: tensor.Float64}, {bias: false, dt: tensor.Float32},
		{bias: false, dt: tensor.Float32, gradReady: true}, {bias: false, dt: tensor.Float32, gradReady: true, gradPacked: true}} {
		ops = append(ops, convOp(s), convDgradOp(s), convWgradOp(s), convGradOp(s))
	}
	hashes := map[uint32]string{}
	for _, op := range ops {
		h := op.Hashcode()
		if prev, ok := hashes[h]; ok {
			t.Errorf("%v hashes like %v", op, prev)
		}
		hashes[h] = fmt.Sprint(op)
	}
}

// A buffer handed in for reuse must be overwritten, not accumulated into, and
// values of the wrong shape must be reported, not read as garbage.
func TestConvOpsPreallocAndShapes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	g := G.NewGraph()
	xn := G.NewTensor(g, tensor.Float64, 4, G.WithShape(1, 2, 4, 5), G.WithName("x"))
	wn := G.NewTensor(g, tensor.Float64, 4, G.WithShape(3, 2, 3, 3), G.WithName("w"))
	bn := G.NewVector(g, tensor.Float64, G.WithShape(3), G.WithName("b"))
	cfg := ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU}
	y, err := Conv(xn, wn, bn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	op := y.Op().(*specOp)
	p, dt, err := convParams("Conv", xn, wn, cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.ReLU = true
	s := convShape{p: p, bias: true, dt: dt}
	if op.String() != convOp(s).String() {
		t.Fatalf("Conv made %v, not %v", op, convOp(s))
	}
	x := randTensor(rng, tensor.Float64, -1, 1, 1, 2, 4, 5)
	w := randTensor(rng, tensor.Float64, -1, 1, 3, 2, 3, 3)
	b := randTensor(rng, tensor.Float64, -1, 1, 3)
	fresh, err := op.Do(x, w, b)
	if err != nil {
		t.Fatal(err)
	}
	stale := randTensor(rng, tensor.Float64, 5, 6, 1, 3, 4, 5)
	reused, err := op.UsePreallocDo(stale, x, w, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := autograd.TolForward64.Compare(toFloat64s(t, reused), toFloat64s(t, fresh)); err != nil {
		t.Errorf("forward into a stale buffer: %v", err)
	}
	dy := randTensor(rng, tensor.Float64, -1, 1, 1, 3, 4, 5)
	yv := fresh
	for _, c := range []struct {
		gop   G.Op
		first *tensor.Dense
	}{{convDgradOp(s), w}, {convWgradOp(s), x}} {
		gop, first := c.gop, c.first
		want, err := gop.Do(first, yv, dy)
		if err != nil {
			t.Fatal(err)
		}
		stale := randTensor(rng, tensor.Float64, 5, 6, want.Shape()...)
		got, err := gop.(G.UsePreallocDoer).UsePreallocDo(stale, first, yv, dy)
		if err != nil {
			t.Fatal(err)
		}
		if err := autograd.TolForward64.Compare(toFloat64s(t, got), toFloat64s(t, want)); err != nil {
			t.Errorf("%v into a stale buffer: %v", gop, err)
		}
	}
	// The backward as SymDiff builds it: convGradOp's packed [g | dbias]
	// (g masked by y > 0, dbias its per-channel sums), which dgrad and
	// wgrad read in place, to the same results as from g on its own.
	packed, err := convGradOp(s).Do(yv, dy)
	if err != nil {
		t.Fatal(err)
	}
	pv, yd, dyd := packed.Data().([]float64), yv.Data().([]float64), dy.Data().([]float64)
	if len(pv) != len(dyd)+3 {
		t.Fatalf("convGradOp: %d elements, want %d", len(pv), len(dyd)+3)
	}
	gWant, dbWant := make([]float64, len(dyd)), make([]float64, 3)
	for i := range dyd {
		if yd[i] > 0 {
			gWant[i] = dyd[i]
		}
		dbWant[i/20] += gWant[i] // 20 pixels per channel plane, one image
	}
	if err := autograd.TolForward64.Compare(pv[:len(dyd)], gWant); err != nil {
		t.Errorf("convGradOp: g: %v", err)
	}
	if err := autograd.TolForward64.Compare(pv[len(dyd):], dbWant); err != nil {
		t.Errorf("convGradOp: bias gradient: %v", err)
	}
	back := s
	back.p.ReLU, back.bias = false, false
	ready := back
	ready.gradReady, ready.gradPacked = true, true
	gt := tensor.New(tensor.WithShape(1, 3, 4, 5), tensor.WithBacking(gWant))
	for _, c := range []struct {
		plain, packed G.Op
		first         *tensor.Dense
	}{{convDgradOp(back), convDgradOp(ready), w}, {convWgradOp(back), convWgradOp(ready), x}} {
		want, err := c.plain.Do(c.first, yv, gt)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.packed.Do(c.first, yv, packed)
		if err != nil {
			t.Fatal(err)
		}
		if err := autograd.TolForward64.Compare(toFloat64s(t, got), toFloat64s(t, want)); err != nil {
			t.Errorf("%v from the packed gradient: %v", c.packed, err)
		}
		if _, err := c.packed.Do(c.first, yv, gt); err == nil || !strings.Contains(err.Error(), "grad has shape (1, 3, 4, 5), want (63)") {
			t.Errorf("%v given g unpacked: %v", c.packed, err)
		}
	}
	wrong := randTensor(rng, tensor.Float64, -1, 1, 1, 2, 5, 4)
	if _, err := op.Do(wrong, w, b); err == nil || !strings.Contains(err.Error(), "ops: Conv: x has shape (1, 2, 5, 4), want (1, 2, 4, 5)") {
		t.Errorf("wrong x shape at run time: %v", err)
	}
	if _, err := op.Do(cast(t, x, tensor.Float32), w, b); err == nil || !strings.Contains(err.Error(), "x has dtype float32, want float64") {
		t.Errorf("wrong x dtype at run time: %v", err)
	}
}

// The backward ops are not differentiable again; asking for a second
// derivative is an error, not a panic.
func TestConvSecondDerivativeIsAnError(t *testing.T) {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 4, G.WithShape(1, 1, 3, 3), G.WithName("x"), G.WithInit(G.Ones()))
	w := G.NewTensor(g, tensor.Float64, 4, G.WithShape(1, 1, 2, 2), G.WithName("w"), G.WithInit(G.Ones()))
	y, err := Conv(x, w, nil, ConvConfig{})
	if err != nil {
		t.Fatal(err)
	}
	loss, _ := G.Sum(y)
	grads, err := G.Grad(loss, x)
	if err != nil {
		t.Fatal(err)
	}
	loss2, _ := G.Sum(grads[0])
	if _, err := G.Grad(loss2, w); err == nil || !strings.Contains(err.Error(), "second derivatives are not implemented") {
		t.Errorf("second derivative: got %v", err)
	}
}

// convBenchShapes are the layers of a ResNet-style detector backbone the
// benchmarks time, float32.
var convBenchShapes = []struct {
	name   string
	xs, ws []int
	cfg    ConvConfig
}{
	{"3x3", []int{2, 64, 64, 64}, []int{64, 64, 3, 3}, ConvConfig{Pad: [2]int{1, 1}, Act: ActReLU}},
	{"1x1", []int{2, 256, 32, 32}, []int{64, 256, 1, 1}, ConvConfig{Act: ActReLU}},
	{"3x3s2", []int{2, 64, 64, 64}, []int{128, 64, 3, 3}, ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}, Act: ActReLU}},
	{"7x7s2stem", []int{2, 3, 224, 224}, []int{64, 3, 7, 7}, ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{3, 3}, Act: ActReLU}},
}

// benchGraph times one graph: the forward pass, or the forward pass and the
// gradients of sum(y) with respect to every learnable input. flops is the
// count of one forward convolution; the backward pass costs two more.
func benchGraph(b *testing.B, bwd bool, flops float64, build func(g *G.ExprGraph) (*G.Node, G.Nodes, error)) {
	g := G.NewGraph()
	y, wrt, err := build(g)
	if err != nil {
		b.Fatal(err)
	}
	if bwd {
		loss, err := G.Sum(y)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := G.Grad(loss, wrt...); err != nil {
			b.Fatal(err)
		}
		flops *= 3
	}
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil { // warm up the buffer pools
		b.Fatal(err)
	}
	m.Reset()
	for b.Loop() {
		if err := m.RunAll(); err != nil {
			b.Fatal(err)
		}
		m.Reset()
	}
	b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

func benchNode(g *G.ExprGraph, rng *rand.Rand, name string, lo, hi float64, shape ...int) *G.Node {
	return G.NodeFromAny(g, randTensor(rng, tensor.Float32, lo, hi, shape...), G.WithName(name))
}

func convFlops(xs, ws []int, cfg ConvConfig) float64 {
	p, _, err := convParams("bench", G.NewTensor(G.NewGraph(), tensor.Float32, 4, G.WithShape(xs...)),
		G.NewTensor(G.NewGraph(), tensor.Float32, 4, G.WithShape(ws...)), cfg)
	if err != nil {
		panic(err)
	}
	return 2 * float64(p.N*p.Cout*p.OutH*p.OutW*p.Cin*p.KH*p.KW)
}

// BenchmarkConvVsGorgonia times this package's Conv against gorgonia's own
// Conv2d (im2col + gonum GEMM) in one run, on one 3x3 layer without bias or
// activation (which gorgonia's op does not fuse), float32.
func BenchmarkConvVsGorgonia(b *testing.B) {
	xs, ws := []int{2, 64, 64, 64}, []int{64, 64, 3, 3}
	cfg := ConvConfig{Pad: [2]int{1, 1}}
	flops := convFlops(xs, ws, cfg)
	for _, impl := range []string{"stheno", "gorgonia"} {
		for _, pass := range []string{"fwd", "fwdbwd"} {
			b.Run(fmt.Sprintf("impl=%s/pass=%s", impl, pass), func(b *testing.B) {
				benchGraph(b, pass == "fwdbwd", flops, func(g *G.ExprGraph) (*G.Node, G.Nodes, error) {
					rng := rand.New(rand.NewPCG(1, 1))
					x := benchNode(g, rng, "x", -1, 1, xs...)
					w := benchNode(g, rng, "w", -0.1, 0.1, ws...)
					var y *G.Node
					var err error
					if impl == "stheno" {
						y, err = Conv(x, w, nil, cfg)
					} else {
						y, err = G.Conv2d(x, w, tensor.Shape{3, 3}, []int{1, 1}, []int{1, 1}, []int{1, 1})
					}
					return y, G.Nodes{x, w}, err
				})
			})
		}
	}
}

// BenchmarkConv times Conv with bias and ReLU on the backbone's shapes.
func BenchmarkConv(b *testing.B) {
	for _, s := range convBenchShapes {
		for _, pass := range []string{"fwd", "fwdbwd"} {
			b.Run(fmt.Sprintf("shape=%s/pass=%s", s.name, pass), func(b *testing.B) {
				benchGraph(b, pass == "fwdbwd", convFlops(s.xs, s.ws, s.cfg), func(g *G.ExprGraph) (*G.Node, G.Nodes, error) {
					rng := rand.New(rand.NewPCG(1, 1))
					x := benchNode(g, rng, "x", -1, 1, s.xs...)
					w := benchNode(g, rng, "w", -0.1, 0.1, s.ws...)
					bias := benchNode(g, rng, "bias", -0.1, 0.1, s.ws[0])
					y, err := Conv(x, w, bias, s.cfg)
					return y, G.Nodes{x, w, bias}, err
				})
			})
		}
	}
}

// TestConvNoInputGrad: with NoInputGrad, Conv and ConvBN give the same
// weight gradient and make no data-gradient op (G.Grad with respect to
// the weights only, as for a trainable layer on a frozen one).
func TestConvNoInputGrad(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	fill := func(n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = rng.NormFloat64()
		}
		return v
	}
	xv, wv := fill(2*3*6*6), fill(4*3*3*3)
	for _, bn := range []bool{false, true} {
		var dws [2][]float64
		for i, noDx := range []bool{false, true} {
			g := G.NewGraph()
			x := G.NewTensor(g, tensor.Float64, 4, G.WithShape(2, 3, 6, 6), G.WithName("x"),
				G.WithValue(tensor.New(tensor.WithShape(2, 3, 6, 6), tensor.WithBacking(append([]float64(nil), xv...)))))
			w := G.NewTensor(g, tensor.Float64, 4, G.WithShape(4, 3, 3, 3), G.WithName("w"),
				G.WithValue(tensor.New(tensor.WithShape(4, 3, 3, 3), tensor.WithBacking(append([]float64(nil), wv...)))))
			cfg := ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}, Act: ActReLU, NoInputGrad: noDx}
			var y *G.Node
			var err error
			if bn {
				b, e := NewBatchNorm(g, tensor.Float64, 4, "bn")
				if e != nil {
					t.Fatal(e)
				}
				y, err = ConvBN(x, w, b, nil, cfg)
			} else {
				y, err = Conv(x, w, nil, cfg)
			}
			if err != nil {
				t.Fatal(err)
			}
			loss, err := Sum(y, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			gs, err := G.Grad(loss, w)
			if err != nil {
				t.Fatalf("bn %v, NoInputGrad %v: %v", bn, noDx, err)
			}
			dgrads := 0
			for _, n := range g.AllNodes() {
				if n.Op() != nil && strings.HasPrefix(n.Op().String(), "ConvDgrad(") {
					dgrads++
				}
			}
			if want := map[bool]int{false: 1, true: 0}[noDx]; dgrads != want {
				t.Errorf("bn %v, NoInputGrad %v: %d data-gradient ops, want %d", bn, noDx, dgrads, want)
			}
			m, err := NewTapeMachine(g)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.RunAll(); err != nil {
				t.Fatal(err)
			}
			dws[i] = append([]float64(nil), gs[0].Value().Data().([]float64)...)
			m.Close()
		}
		for j := range dws[0] {
			if dws[0][j] != dws[1][j] {
				t.Fatalf("bn %v: dw[%d] %v with NoInputGrad, %v without", bn, j, dws[1][j], dws[0][j])
			}
		}
	}
}
