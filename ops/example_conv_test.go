package ops_test

import (
	"fmt"
	"log"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// A 2x2 box filter over a 3x3 ramp, with a bias and a ReLU fused into the
// convolution, and the gradient of the sum of the output with respect to the
// filter.
func ExampleConv() {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 4, G.WithName("x"), G.WithValue(tensor.New(
		tensor.WithShape(1, 1, 3, 3), tensor.WithBacking([]float64{1, 2, 3, 4, 5, 6, 7, 8, 9}))))
	w := G.NewTensor(g, tensor.Float64, 4, G.WithName("w"), G.WithShape(1, 1, 2, 2), G.WithInit(G.Ones()))
	b := G.NewVector(g, tensor.Float64, G.WithName("b"), G.WithValue(tensor.New(tensor.WithShape(1), tensor.WithBacking([]float64{-20}))))

	y, err := ops.Conv(x, w, b, ops.ConvConfig{Act: ops.ActReLU})
	if err != nil {
		log.Fatal(err)
	}
	loss, err := G.Sum(y)
	if err != nil {
		log.Fatal(err)
	}
	grads, err := G.Grad(loss, w)
	if err != nil {
		log.Fatal(err)
	}
	var yv, dw G.Value
	G.Read(y, &yv)
	G.Read(grads[0], &dw)
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("y", yv.Shape(), yv.Data())
	fmt.Println("dL/dw", dw.Data()) // only the two windows above 20 count
	// Output:
	// y (1, 1, 2, 2) [0 0 4 8]
	// dL/dw [9 11 15 17]
}

// A convolution followed by BatchNorm and a ReLU. The same graph runs a
// training step, which normalises with the batch's statistics and updates
// the running ones, and then, with Training flipped, an evaluation step,
// which uses the running statistics.
func ExampleConvBN() {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 4, G.WithName("x"), G.WithValue(tensor.New(
		tensor.WithShape(1, 1, 2, 2), tensor.WithBacking([]float64{1, 2, 3, 4}))))
	w := G.NewTensor(g, tensor.Float64, 4, G.WithName("w"), G.WithShape(1, 1, 1, 1), G.WithInit(G.Ones()))
	bn, err := ops.NewBatchNorm(g, tensor.Float64, 1, "bn") // PyTorch's defaults, in training mode
	if err != nil {
		log.Fatal(err)
	}
	y, err := ops.ConvBN(x, w, bn, nil, ops.ConvConfig{Act: ops.ActReLU})
	if err != nil {
		log.Fatal(err)
	}
	var yv G.Value
	G.Read(y, &yv)
	m := G.NewTapeMachine(g)
	defer m.Close()

	if err := m.RunAll(); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("train: y %.4f\n", yv.Data())
	fmt.Printf("running mean %.4f, variance %.4f\n", bn.RunningMean.Data(), bn.RunningVar.Data())

	bn.Training = false
	m.Reset()
	if err := m.RunAll(); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("eval:  y %.4f\n", yv.Data())
	// Output:
	// train: y [0.0000 0.0000 0.4472 1.3416]
	// running mean [0.2500], variance [1.0667]
	// eval:  y [0.7262 1.6944 2.6627 3.6309]
}
