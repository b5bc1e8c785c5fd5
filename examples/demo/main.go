// Command demo trains a small graph that uses all three of stheno's ops —
// ConvBN and Conv, RoIAlign, and MSDeformAttn — on the CPU, and prints its
// loss as it falls.
//
// The task is distillation: a "teacher" network of the same architecture,
// with its own fixed random weights, labels a batch of synthetic images; a
// "student" starting from other random weights learns to reproduce the
// teacher's RoI scores and attention outputs with Adam. Every op's gradient
// takes part: the loss can only fall if all of them are right.
//
//	go run ./examples/demo [-steps 80] [-lr 0.02] [-seed 1]
package main

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

const (
	batch   = 2
	imgSize = 24
	roisPer = 6  // RoIs per image
	queries = 10 // MSDeformAttn queries per image
	heads   = 2
	points  = 2
	width   = 8 // channels of the backbone
)

func main() {
	steps := flag.Int("steps", 80, "training steps")
	lr := flag.Float64("lr", 0.02, "Adam learning rate")
	seed := flag.Uint64("seed", 1, "random seed")
	flag.Parse()
	if err := run(*steps, *lr, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(steps int, lr float64, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 7))
	images := syntheticImages(rng)
	rois := randomRoIs(rng)
	queryEmb := uniform(rng, -1, 1, batch*queries, width)

	// The teacher labels the data once.
	teacher, err := newNet(rng, images, rois, queryEmb)
	if err != nil {
		return err
	}
	targets, err := teacher.outputs()
	if err != nil {
		return fmt.Errorf("teacher: %w", err)
	}

	student, err := newNet(rng, images, rois, queryEmb)
	if err != nil {
		return err
	}
	loss, err := student.distillationLoss(targets)
	if err != nil {
		return err
	}
	if _, err := G.Grad(loss, student.params...); err != nil {
		return fmt.Errorf("gradients: %w", err)
	}
	var lossVal G.Value
	G.Read(loss, &lossVal)
	m := G.NewTapeMachine(student.g, G.BindDualValues(student.params...))
	defer m.Close()
	solver := G.NewAdamSolver(G.WithLearnRate(lr))

	fmt.Printf("training a %d-parameter student on %d images (%d RoIs, %d queries) for %d steps\n",
		student.size(), batch, batch*roisPer, batch*queries, steps)
	start := time.Now()
	var first, last float64
	for step := 1; step <= steps; step++ {
		if err := m.RunAll(); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
		last = lossVal.Data().(float64)
		if step == 1 {
			first = last
		}
		if step == 1 || step%10 == 0 || step == steps {
			fmt.Printf("step %3d  loss %.6f\n", step, last)
		}
		if err := solver.Step(G.NodesToValueGrads(student.params)); err != nil {
			return fmt.Errorf("step %d: solver: %w", step, err)
		}
		m.Reset()
	}
	fmt.Printf("loss %.6f -> %.6f (%.1f%% of the start) in %v\n", first, last, 100*last/first, time.Since(start).Round(time.Millisecond))
	if !(last < first) {
		return fmt.Errorf("the loss did not fall")
	}
	return nil
}

// net is one copy of the architecture with its own weights.
type net struct {
	g             *G.ExprGraph
	params        G.Nodes
	scores, attns *G.Node // [K,1] RoI scores and [N,Lq,M*D] attention outputs
}

func newNet(rng *rand.Rand, images, rois, queryEmb *tensor.Dense) (*net, error) {
	g := G.NewGraph()
	n := &net{g: g}
	param := func(name string, t *tensor.Dense) *G.Node {
		p := G.NodeFromAny(g, t, G.WithName(name))
		n.params = append(n.params, p)
		return p
	}
	x := G.NodeFromAny(g, images, G.WithName("images"))
	r := G.NodeFromAny(g, rois, G.WithName("rois"))
	q := G.NodeFromAny(g, queryEmb, G.WithName("queries"))

	// Backbone: a ConvBN stem, then two stride-2 convolutions: features at
	// 1/2 (12x12) and 1/4 (6x6) of the image.
	bn := &ops.BatchNorm{
		Gamma:       param("bn.gamma", constant(width, 1)),
		Beta:        param("bn.beta", constant(width, 0)),
		RunningMean: constant(width, 0),
		RunningVar:  constant(width, 1),
		Training:    true,
	}
	stem, err := ops.ConvBN(x, param("stem.w", kaiming(rng, width, 3, 3, 3)), bn, nil,
		ops.ConvConfig{Pad: [2]int{1, 1}, Act: ops.ActReLU})
	if err != nil {
		return nil, err
	}
	down := ops.ConvConfig{Stride: [2]int{2, 2}, Pad: [2]int{1, 1}, Act: ops.ActReLU}
	c2, err := ops.Conv(stem, param("c2.w", kaiming(rng, width, width, 3, 3)), param("c2.b", constant(width, 0.1)), down)
	if err != nil {
		return nil, err
	}
	c3, err := ops.Conv(c2, param("c3.w", kaiming(rng, width, width, 3, 3)), param("c3.b", constant(width, 0.1)), down)
	if err != nil {
		return nil, err
	}

	// RoI head: RoIAlign on the 1/2 features, a linear score per RoI.
	pooled, err := ops.RoIAlign(c2, r, ops.RoIAlignConfig{PooledH: 3, PooledW: 3, SpatialScale: 0.5, SamplingRatio: 2, Aligned: true})
	if err != nil {
		return nil, err
	}
	flat, err := G.Reshape(pooled, tensor.Shape{batch * roisPer, width * 9})
	if err != nil {
		return nil, err
	}
	if n.scores, err = G.Mul(flat, param("score.w", uniform(rng, -0.2, 0.2, width*9, 1))); err != nil {
		return nil, err
	}

	// Attention head: queries sample both feature levels with MSDeformAttn.
	levels := []ops.Level{{H: 12, W: 12}, {H: 6, W: 6}}
	value, err := multiLevelValue(c2, c3)
	if err != nil {
		return nil, err
	}
	lp := len(levels) * points
	locLogits, err := G.Mul(q, param("loc.w", uniform(rng, -1, 1, width, heads*lp*2)))
	if err != nil {
		return nil, err
	}
	loc, err := G.Sigmoid(locLogits)
	if err != nil {
		return nil, err
	}
	if loc, err = G.Reshape(loc, tensor.Shape{batch, queries, heads, len(levels), points, 2}); err != nil {
		return nil, err
	}
	wLogits, err := G.Mul(q, param("attw.w", uniform(rng, -1, 1, width, heads*lp)))
	if err != nil {
		return nil, err
	}
	if wLogits, err = G.Reshape(wLogits, tensor.Shape{batch * queries * heads, lp}); err != nil {
		return nil, err
	}
	attw, err := G.SoftMax(wLogits, 1)
	if err != nil {
		return nil, err
	}
	if attw, err = G.Reshape(attw, tensor.Shape{batch, queries, heads, len(levels), points}); err != nil {
		return nil, err
	}
	if n.attns, err = ops.MSDeformAttn(value, loc, attw, levels); err != nil {
		return nil, err
	}
	return n, nil
}

// multiLevelValue flattens feature maps [N,C,H,W] into MSDeformAttn's value
// layout [N, sum(H*W), heads, C/heads], levels one after the other.
func multiLevelValue(maps ...*G.Node) (*G.Node, error) {
	var flat G.Nodes
	for _, f := range maps {
		s := f.Shape()
		t, err := G.Transpose(f, 0, 2, 3, 1) // NCHW -> NHWC
		if err != nil {
			return nil, err
		}
		r, err := G.Reshape(t, tensor.Shape{s[0], s[2] * s[3], heads, s[1] / heads})
		if err != nil {
			return nil, err
		}
		flat = append(flat, r)
	}
	return G.Concat(1, flat...)
}

// outputs runs the network once and returns copies of its two outputs.
func (n *net) outputs() ([]*tensor.Dense, error) {
	var s, a G.Value
	G.Read(n.scores, &s)
	G.Read(n.attns, &a)
	m := G.NewTapeMachine(n.g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		return nil, err
	}
	return []*tensor.Dense{s.(*tensor.Dense).Clone().(*tensor.Dense), a.(*tensor.Dense).Clone().(*tensor.Dense)}, nil
}

// distillationLoss is the mean squared error of both outputs against the
// teacher's.
func (n *net) distillationLoss(targets []*tensor.Dense) (*G.Node, error) {
	var total *G.Node
	for i, out := range []*G.Node{n.scores, n.attns} {
		t := G.NodeFromAny(n.g, targets[i], G.WithName(fmt.Sprintf("target%d", i)))
		diff, err := G.Sub(out, t)
		if err != nil {
			return nil, err
		}
		sq, err := G.Square(diff)
		if err != nil {
			return nil, err
		}
		mse, err := G.Mean(sq)
		if err != nil {
			return nil, err
		}
		if total == nil {
			total = mse
		} else if total, err = G.Add(total, mse); err != nil {
			return nil, err
		}
	}
	return total, nil
}

func (n *net) size() int {
	s := 0
	for _, p := range n.params {
		s += p.Shape().TotalSize()
	}
	return s
}

// syntheticImages draws bright squares of random colour on noise.
func syntheticImages(rng *rand.Rand) *tensor.Dense {
	img := uniform(rng, 0, 0.2, batch, 3, imgSize, imgSize)
	d := img.Float64s()
	for b := range batch {
		for range 3 {
			s := 3 + rng.IntN(6)
			y0, x0 := rng.IntN(imgSize-s), rng.IntN(imgSize-s)
			for c := range 3 {
				v := 0.5 + 0.5*rng.Float64()
				for y := y0; y < y0+s; y++ {
					for x := x0; x < x0+s; x++ {
						d[((b*3+c)*imgSize+y)*imgSize+x] = v
					}
				}
			}
		}
	}
	return img
}

// randomRoIs draws roisPer boxes per image, in image coordinates.
func randomRoIs(rng *rand.Rand) *tensor.Dense {
	v := make([]float64, 0, batch*roisPer*5)
	for b := range batch {
		for range roisPer {
			w, h := 4+rng.Float64()*12, 4+rng.Float64()*12
			x, y := rng.Float64()*(imgSize-w), rng.Float64()*(imgSize-h)
			v = append(v, float64(b), x, y, x+w, y+h)
		}
	}
	return tensor.New(tensor.WithShape(batch*roisPer, 5), tensor.WithBacking(v))
}

func uniform(rng *rand.Rand, lo, hi float64, shape ...int) *tensor.Dense {
	v := make([]float64, tensor.Shape(shape).TotalSize())
	for i := range v {
		v[i] = lo + (hi-lo)*rng.Float64()
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(v))
}

// kaiming draws He-uniform convolution weights [Cout, Cin, KH, KW].
func kaiming(rng *rand.Rand, shape ...int) *tensor.Dense {
	fanIn := float64(shape[1] * shape[2] * shape[3])
	bound := math.Sqrt(6 / fanIn)
	return uniform(rng, -bound, bound, shape...)
}

func constant(n int, v float64) *tensor.Dense {
	d := make([]float64, n)
	for i := range d {
		d[i] = v
	}
	return tensor.New(tensor.WithShape(n), tensor.WithBacking(d))
}
