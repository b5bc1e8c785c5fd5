package autograd

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// Input is one input of a graph under a gradient check.
type Input struct {
	Name  string
	Value *tensor.Dense // float64; not modified
	// NoGrad marks inputs the check does not differentiate with respect to,
	// such as RoI boxes, which the ops treat as constants.
	NoGrad bool
}

// Builder builds the graph under test on g from input nodes made for the
// Inputs, in order, and returns its output.
type Builder func(g *G.ExprGraph, inputs G.Nodes) (*G.Node, error)

// Result is the outcome of a gradient check for one input.
type Result struct {
	Name string
	// MaxAbs is the largest |analytic - numeric| over the input's elements,
	// at element Worst.
	MaxAbs float64
	Worst  int
	// Scale is the largest |numeric| gradient entry of the input, and MaxRel
	// is MaxAbs/Scale: relative to the gradient's size, not to each entry,
	// since entries near zero would make per-entry ratios meaningless.
	Scale, MaxRel float64
	Analytic      float64 // at Worst
	Numeric       float64 // at Worst
}

func (r Result) String() string {
	return fmt.Sprintf("%s: max |analytic-numeric| %.3g at %d (%.10g vs %.10g), relative to max |grad| %.3g: %.3g",
		r.Name, r.MaxAbs, r.Worst, r.Analytic, r.Numeric, r.Scale, r.MaxRel)
}

// Within reports whether the result is inside the tolerance: MaxAbs <=
// t.Abs + t.Rel*Scale.
func (r Result) Within(t Tolerance) bool {
	return r.MaxAbs <= t.Abs+t.Rel*r.Scale
}

// GradStep is the central-difference step GradCheck uses.
const GradStep = 1e-6

// GradCheck compares the gradients gorgonia.Grad computes for the graph that
// build makes with central differences. The graph's output is projected to a
// scalar with fixed random weights drawn from seed (loss = sum(out ⊙ R)), so
// every output element takes part with a different weight and errors cannot
// cancel. Inputs must be float64. vmOpts configure the tape machines, e.g.
// G.WithEngine(dev.Engine()) for graphs whose values live on a GPU (the
// inputs and the loss stay on the host: move them with ops.ToDevice and
// ops.ToHost inside build).
func GradCheck(build Builder, inputs []Input, seed uint64, vmOpts ...G.VMOpt) ([]Result, error) {
	for _, in := range inputs {
		if in.Value == nil || in.Value.Dtype() != tensor.Float64 {
			return nil, fmt.Errorf("autograd: GradCheck: input %q must be a float64 tensor", in.Name)
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0x5eed))

	// Analytic gradients.
	g := G.NewGraph()
	nodes := inputNodes(g, inputs)
	loss, proj, err := projectedLoss(g, build, nodes, nil, rng)
	if err != nil {
		return nil, err
	}
	var wrt G.Nodes
	for i, in := range inputs {
		if !in.NoGrad {
			wrt = append(wrt, nodes[i])
		}
	}
	if len(wrt) == 0 {
		return nil, fmt.Errorf("autograd: GradCheck: no input to differentiate with respect to")
	}
	grads, err := G.Grad(loss, wrt...)
	if err != nil {
		return nil, fmt.Errorf("autograd: GradCheck: Grad: %w", err)
	}
	// The tape machine reuses registers, so read the gradients through
	// G.Read rather than from the nodes after the run.
	vals := make([]G.Value, len(grads))
	for i, gr := range grads {
		G.Read(gr, &vals[i])
	}
	if err := runOnce(g, vmOpts); err != nil {
		return nil, err
	}

	// Numeric gradients, on a forward-only copy of the graph.
	g2 := G.NewGraph()
	nodes2 := inputNodes(g2, inputs)
	loss2, _, err := projectedLoss(g2, build, nodes2, proj, nil)
	if err != nil {
		return nil, err
	}
	eval, closeVM, err := lossEvaluator(g2, loss2, vmOpts)
	if err != nil {
		return nil, err
	}
	defer closeVM()

	var results []Result
	k := 0
	for i, in := range inputs {
		if in.NoGrad {
			continue
		}
		analytic, err := float64s(vals[k])
		if err != nil {
			return nil, fmt.Errorf("autograd: GradCheck: gradient of %q: %w", in.Name, err)
		}
		k++
		x := in.Value.Clone().(*tensor.Dense)
		data := x.Float64s()
		if len(analytic) != len(data) {
			return nil, fmt.Errorf("autograd: GradCheck: gradient of %q has %d elements, input has %d", in.Name, len(analytic), len(data))
		}
		if err := G.Let(nodes2[i], x); err != nil {
			return nil, err
		}
		r := Result{Name: in.Name, Worst: -1}
		for j := range data {
			orig := data[j]
			data[j] = orig + GradStep
			fp, err := eval()
			if err != nil {
				return nil, err
			}
			data[j] = orig - GradStep
			fm, err := eval()
			if err != nil {
				return nil, err
			}
			data[j] = orig
			num := (fp - fm) / (2 * GradStep)
			r.Scale = math.Max(r.Scale, math.Abs(num))
			d := math.Abs(analytic[j] - num)
			if !(d <= r.MaxAbs) || r.Worst < 0 { // NaN sticks as the worst
				r.MaxAbs, r.Worst, r.Analytic, r.Numeric = d, j, analytic[j], num
			}
		}
		if err := G.Let(nodes2[i], in.Value); err != nil {
			return nil, err
		}
		if r.Scale > 0 {
			r.MaxRel = r.MaxAbs / r.Scale
		} else {
			r.MaxRel = r.MaxAbs
		}
		results = append(results, r)
	}
	return results, nil
}

// CheckGrad runs GradCheck and returns an error describing every input whose
// gradient is outside the TolGrad tolerance.
func CheckGrad(build Builder, inputs []Input, seed uint64, vmOpts ...G.VMOpt) ([]Result, error) {
	results, err := GradCheck(build, inputs, seed, vmOpts...)
	if err != nil {
		return results, err
	}
	var bad []string
	for _, r := range results {
		if !r.Within(TolGrad) || math.IsNaN(r.MaxAbs) {
			bad = append(bad, r.String())
		}
	}
	if len(bad) > 0 {
		return results, fmt.Errorf("autograd: gradient check failed (tolerance %+v):\n%s", TolGrad, strings.Join(bad, "\n"))
	}
	return results, nil
}

func inputNodes(g *G.ExprGraph, inputs []Input) G.Nodes {
	nodes := make(G.Nodes, len(inputs))
	for i, in := range inputs {
		v := in.Value.Clone().(*tensor.Dense)
		nodes[i] = G.NodeFromAny(g, v, G.WithName(in.Name))
	}
	return nodes
}

// projectedLoss builds loss = sum(out ⊙ R). R is drawn from rng when proj is
// nil, and returned so a second graph can use the same projection.
func projectedLoss(g *G.ExprGraph, build Builder, nodes G.Nodes, proj *tensor.Dense, rng *rand.Rand) (*G.Node, *tensor.Dense, error) {
	out, err := build(g, nodes)
	if err != nil {
		return nil, nil, fmt.Errorf("autograd: GradCheck: building the graph: %w", err)
	}
	if out.Dtype() != tensor.Float64 {
		return nil, nil, fmt.Errorf("autograd: GradCheck: output must be float64, got %v", out.Dtype())
	}
	if out.IsScalar() {
		return out, nil, nil
	}
	if proj == nil {
		r := make([]float64, out.Shape().TotalSize())
		for i := range r {
			r[i] = rng.Float64()*2 - 1
		}
		proj = tensor.New(tensor.WithShape(out.Shape()...), tensor.WithBacking(r))
	}
	pn := G.NodeFromAny(g, proj, G.WithName("projection"))
	prod, err := G.HadamardProd(out, pn)
	if err != nil {
		return nil, nil, fmt.Errorf("autograd: GradCheck: projecting the output: %w", err)
	}
	loss, err := G.Sum(prod)
	if err != nil {
		return nil, nil, fmt.Errorf("autograd: GradCheck: summing the output: %w", err)
	}
	return loss, proj, nil
}

// newMachine wraps G.NewTapeMachine, which panics on compile errors.
func newMachine(g *G.ExprGraph, opts ...G.VMOpt) (m G.VM, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("autograd: compiling the graph: %v", r)
		}
	}()
	return G.NewTapeMachine(g, opts...), nil
}

func runOnce(g *G.ExprGraph, vmOpts []G.VMOpt) error {
	m, err := newMachine(g, vmOpts...)
	if err != nil {
		return err
	}
	defer m.Close()
	if err := m.RunAll(); err != nil {
		return fmt.Errorf("autograd: GradCheck: running the graph: %w", err)
	}
	return nil
}

func lossEvaluator(g *G.ExprGraph, loss *G.Node, vmOpts []G.VMOpt) (func() (float64, error), func(), error) {
	// Read must be part of the graph before the machine compiles it.
	var lv G.Value
	G.Read(loss, &lv)
	m, err := newMachine(g, vmOpts...)
	if err != nil {
		return nil, nil, err
	}
	eval := func() (float64, error) {
		defer m.Reset()
		if err := m.RunAll(); err != nil {
			return 0, fmt.Errorf("autograd: GradCheck: running the graph: %w", err)
		}
		switch v := lv.(type) {
		case *G.F64:
			return float64(*v), nil
		default:
			f, err := float64s(lv)
			if err != nil || len(f) != 1 {
				return 0, fmt.Errorf("autograd: GradCheck: loss is %T, want a float64 scalar", lv)
			}
			return f[0], nil
		}
	}
	return eval, func() { m.Close() }, nil
}

func float64s(v G.Value) ([]float64, error) {
	if backend.IsDevice(v) {
		dev, err := backend.DeviceOf(v)
		if err != nil {
			return nil, err
		}
		if v, err = dev.ToHost(v.(*tensor.Dense)); err != nil {
			return nil, err
		}
	}
	switch t := v.(type) {
	case *tensor.Dense:
		if t.Dtype() != tensor.Float64 {
			return nil, fmt.Errorf("dtype %v, want float64", t.Dtype())
		}
		if t.IsView() {
			t = t.Materialize().(*tensor.Dense)
		}
		return t.Float64s(), nil
	case *G.F64:
		return []float64{float64(*t)}, nil
	case nil:
		return nil, fmt.Errorf("no value")
	default:
		return nil, fmt.Errorf("unexpected value %T", v)
	}
}
