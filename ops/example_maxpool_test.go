package ops_test

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// Pool a 4x4 plane as the ResNet stem does (kernel 3, stride 2, padding
// 1) and take the gradient of the sum of the outputs: each window's
// gradient goes to the first of its maxima (the values and the gradient
// PyTorch's F.max_pool2d gives).
func ExampleMaxPool2d() {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float64, 4, G.WithShape(1, 1, 4, 4), G.WithName("x"), G.WithValue(
		tensor.New(tensor.WithShape(1, 1, 4, 4), tensor.WithBacking([]float64{
			1, 5, 5, 0,
			2, 0, 3, 3,
			7, 1, 3, 6,
			7, 4, 2, 2,
		}))))
	y, err := ops.MaxPool2d(x, ops.MaxPool2dConfig{Kernel: [2]int{3, 3}, Stride: [2]int{2, 2}, Pad: [2]int{1, 1}})
	if err != nil {
		panic(err)
	}
	loss := G.Must(G.Sum(y))
	if _, err := G.Grad(loss, x); err != nil {
		panic(err)
	}
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		panic(err)
	}
	fmt.Println("y shape:", y.Shape())
	fmt.Println("y:", y.Value().Data())
	dx, _ := x.Grad()
	fmt.Println("dloss/dx:", dx.Data())
	// Output:
	// y shape: (1, 1, 2, 2)
	// y: [5 5 7 6]
	// dloss/dx: [0 2 0 0 0 0 0 0 1 0 0 1 0 0 0 0]
}
