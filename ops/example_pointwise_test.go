package ops_test

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// Add a bias to every row of a matrix (broadcasting, as in PyTorch), pass
// the result through ReLU and take each row's mean; then the gradient of
// the means' sum with respect to the bias, which sums over the rows the
// bias was broadcast along.
func ExampleAdd() {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 3), G.WithName("x"), G.WithValue(
		tensor.New(tensor.WithShape(2, 3), tensor.WithBacking([]float64{1, -2, 3, -4, 5, -6}))))
	bias := G.NewVector(g, tensor.Float64, G.WithShape(3), G.WithName("bias"), G.WithValue(
		tensor.New(tensor.WithShape(3), tensor.WithBacking([]float64{0.5, 0.5, 0.5}))))
	h, err := ops.Add(x, bias) // [2 3] + [3]
	if err != nil {
		panic(err)
	}
	r, err := ops.ReLU(h)
	if err != nil {
		panic(err)
	}
	means, err := ops.Mean(r, []int{-1}, false) // [2]
	if err != nil {
		panic(err)
	}
	loss, err := ops.Sum(means, nil, false) // a scalar
	if err != nil {
		panic(err)
	}
	if _, err := G.Grad(loss, bias); err != nil {
		panic(err)
	}
	var rv, mv G.Value
	G.Read(r, &rv)
	G.Read(means, &mv)
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		panic(err)
	}
	d, _ := bias.Grad()
	fmt.Printf("relu(x + bias): %v\n", rv.Data())
	fmt.Printf("row means:      %.4f\n", mv.Data())
	fmt.Printf("d loss/d bias:  %.4f\n", d.Data())
	// Output:
	// relu(x + bias): [1.5 0 3.5 0 5.5 0]
	// row means:      [1.6667 1.8333]
	// d loss/d bias:  [0.3333 0.3333 0.3333]
}

// Sum a [2, 3, 2] tensor over its first and last axes, keeping them as
// dims of one, and take the mean of everything; an axis counts from the
// end when negative, as in torch.sum.
func ExampleSum() {
	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float32, 3, G.WithShape(2, 3, 2), G.WithName("x"), G.WithValue(
		tensor.New(tensor.WithShape(2, 3, 2), tensor.WithBacking([]float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}))))
	s, err := ops.Sum(x, []int{0, -1}, true)
	if err != nil {
		panic(err)
	}
	mean, err := ops.Mean(x, nil, false)
	if err != nil {
		panic(err)
	}
	var sv, mv G.Value
	G.Read(s, &sv)
	G.Read(mean, &mv)
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		panic(err)
	}
	fmt.Println("sum over axes 0 and -1:", sv.Shape(), sv.Data())
	fmt.Println("mean:", mv.Data())
	// Output:
	// sum over axes 0 and -1: (1, 3, 1) [18 26 34]
	// mean: 6.5
}
