package ops_test

import (
	"fmt"
	"log"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// run runs g's machine once, after G.Read has been set up on its nodes.
func run(g *G.ExprGraph) {
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		log.Fatal(err)
	}
}

func vector(g *G.ExprGraph, name string, v ...float64) *G.Node {
	return G.NewVector(g, tensor.Float64, G.WithName(name), G.WithValue(tensor.New(tensor.WithShape(len(v)), tensor.WithBacking(v))))
}

// Objectness loss over four anchors, the last one padding: its zero weight
// takes it out of the loss and the gradient. The weights also average over
// the three real anchors.
func ExampleSigmoidBCE() {
	g := G.NewGraph()
	logits := vector(g, "logits", 2, -1, 0, 1234)
	targets := vector(g, "targets", 1, 0, 1, 0)
	weights := vector(g, "weights", 1.0/3, 1.0/3, 1.0/3, 0)
	loss, err := ops.SigmoidBCE(logits, targets, weights)
	if err != nil {
		log.Fatal(err)
	}
	grads, err := G.Grad(loss, logits)
	if err != nil {
		log.Fatal(err)
	}
	var l, dl G.Value
	G.Read(loss, &l)
	G.Read(grads[0], &dl)
	run(g)
	fmt.Printf("loss %.4f\n", l.Data())
	fmt.Printf("dloss/dlogits %.4f\n", dl.Data())
	// Output:
	// loss 0.3778
	// dloss/dlogits [-0.0397 0.0896 -0.1667 0.0000]
}

// Box regression and classification losses of two sampled RoIs: the first
// is a foreground RoI of class 2 with regression targets, the second a
// background RoI, which only the classification loss sees.
func ExampleSmoothL1() {
	g := G.NewGraph()
	deltas := vector(g, "deltas", 0.1, -0.2, 0, 0.5, 9, 9, 9, 9)
	targets := vector(g, "targets", 0, 0, 0, 0.3, 0, 0, 0, 0)
	weights := vector(g, "weights", 1, 1, 1, 1, 0, 0, 0, 0)
	box, err := ops.SmoothL1(deltas, targets, weights, 1.0/9)
	if err != nil {
		log.Fatal(err)
	}
	logits := G.NewMatrix(g, tensor.Float64, G.WithName("logits"), G.WithValue(tensor.New(
		tensor.WithShape(2, 3), tensor.WithBacking([]float64{0, 1, 3, 2, 0, 0}))))
	labels := vector(g, "labels", 2, 0)
	cls, err := ops.SoftmaxCrossEntropy(logits, labels, vector(g, "rowWeights", 0.5, 0.5))
	if err != nil {
		log.Fatal(err)
	}
	var b, c G.Value
	G.Read(box, &b)
	G.Read(cls, &c)
	run(g)
	fmt.Printf("smooth-L1 %.4f, cross-entropy %.4f\n", b.Data(), c.Data())
	// Output:
	// smooth-L1 0.3339, cross-entropy 0.2047
}

// Mask R-CNN's 2x upsampling: a 2x2 transposed convolution of stride 2
// pastes a scaled copy of its kernel for every input pixel.
func ExampleConvTranspose() {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 4, G.WithName("x"), G.WithValue(tensor.New(
		tensor.WithShape(1, 1, 2, 2), tensor.WithBacking([]float64{1, 2, 3, 4}))))
	w := G.NewTensor(g, tensor.Float64, 4, G.WithName("w"), G.WithValue(tensor.New(
		tensor.WithShape(1, 1, 2, 2), tensor.WithBacking([]float64{1, 0, 0, -1}))))
	y, err := ops.ConvTranspose(x, w, nil, ops.ConvTransposeConfig{Stride: [2]int{2, 2}})
	if err != nil {
		log.Fatal(err)
	}
	var yv G.Value
	G.Read(y, &yv)
	run(g)
	t := yv.(*tensor.Dense)
	fmt.Println(t.Shape())
	for r := range 4 {
		fmt.Println(t.Float64s()[r*4 : r*4+4])
	}
	// Output:
	// (1, 1, 4, 4)
	// [1 0 2 0]
	// [0 -1 0 -2]
	// [3 0 4 0]
	// [0 -3 0 -4]
}

// A feature pyramid's top-down path: the coarse map is upsampled to the
// fine one's size.
func ExampleUpsampleNearest() {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 4, G.WithName("x"), G.WithValue(tensor.New(
		tensor.WithShape(1, 1, 1, 2), tensor.WithBacking([]float64{1, 2}))))
	y, err := ops.UpsampleNearest(x, 3)
	if err != nil {
		log.Fatal(err)
	}
	var yv G.Value
	G.Read(y, &yv)
	run(g)
	fmt.Println(yv.Shape(), yv.Data())
	// Output:
	// (1, 1, 3, 6) [1 1 1 2 2 2 1 1 1 2 2 2 1 1 1 2 2 2]
}

// Two RoIs of different sizes are pooled from different levels of a
// two-level pyramid (strides 4 and 8; a 32-pixel RoI belongs on level 1).
// Each level's map is filled with its level number plus one, so the pooled
// values tell where each RoI came from.
func ExampleMultiLevelRoIAlign() {
	g := G.NewGraph()
	fine := G.NewTensor(g, tensor.Float64, 4, G.WithName("p2"), G.WithShape(1, 1, 16, 16), G.WithInit(G.ValuesOf(1.0)))
	coarse := G.NewTensor(g, tensor.Float64, 4, G.WithName("p3"), G.WithShape(1, 1, 8, 8), G.WithInit(G.ValuesOf(2.0)))
	rois := G.NewMatrix(g, tensor.Float64, G.WithName("rois"), G.WithValue(tensor.New(
		tensor.WithShape(2, 5), tensor.WithBacking([]float64{
			0, 4, 4, 20, 20, // 16x16: level 0
			0, 8, 8, 48, 48, // 40x40: level 1
		}))))
	cfg := ops.MultiLevelRoIAlignConfig{
		PooledH: 2, PooledW: 2, SamplingRatio: 2, Aligned: true,
		Scales: []float64{1.0 / 4, 1.0 / 8}, CanonicalSize: 32, CanonicalLevel: 1,
	}
	pooled, err := ops.MultiLevelRoIAlign([]*G.Node{fine, coarse}, rois, cfg)
	if err != nil {
		log.Fatal(err)
	}
	var v G.Value
	G.Read(pooled, &v)
	run(g)
	fmt.Println(v.Shape(), v.Data())
	fmt.Println("levels:", cfg.Level(4, 4, 20, 20), cfg.Level(8, 8, 48, 48))
	// Output:
	// (2, 1, 2, 2) [1 1 1 1 2 2 2 2]
	// levels: 0 1
}
