package ops_test

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// Split two tokens of four features into two heads of two, as attention
// does ([L, H*d] -> [L, H, d] -> [H, L, d]); join two more tokens; pick
// tokens by index (one of more's twice, x's first once); and take the
// gradient of the sum of the picked rows with respect to x: ones on the
// token picked, zeros on the other.
func ExamplePermute() {
	g := G.NewGraph()
	x := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 4), G.WithName("x"), G.WithValue(
		tensor.New(tensor.WithShape(2, 4), tensor.WithBacking([]float64{
			1, 2, 3, 4,
			5, 6, 7, 8,
		}))))
	more := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 4), G.WithName("more"), G.WithValue(
		tensor.New(tensor.WithShape(2, 4), tensor.WithBacking([]float64{
			9, 10, 11, 12,
			13, 14, 15, 16,
		}))))
	idx := G.NewVector(g, tensor.Int, G.WithShape(3), G.WithName("idx"), G.WithValue(
		tensor.New(tensor.WithShape(3), tensor.WithBacking([]int{3, 0, 3}))))

	split, err := ops.Reshape(x, 2, 2, 2) // [L, H, d]
	if err != nil {
		panic(err)
	}
	heads, err := ops.Permute(split, 1, 0, 2) // [H, L, d]
	if err != nil {
		panic(err)
	}
	tokens, err := ops.Concat(0, x, more) // [4, 4]
	if err != nil {
		panic(err)
	}
	picked, err := ops.GatherRows(tokens, idx) // rows 3, 0, 3
	if err != nil {
		panic(err)
	}
	if _, err := G.Grad(G.Must(G.Sum(picked)), x); err != nil {
		panic(err)
	}
	var hv, pv G.Value
	G.Read(heads, &hv)
	G.Read(picked, &pv)
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		panic(err)
	}
	dx, _ := x.Grad()
	fmt.Println("heads: ", hv.Shape(), hv.Data())
	fmt.Println("picked:", pv.Data())
	fmt.Println("dx:    ", dx.Data())
	// Output:
	// heads:  (2, 2, 2) [1 2 5 6 3 4 7 8]
	// picked: [13 14 15 16 1 2 3 4 13 14 15 16]
	// dx:     [1 1 1 1 0 0 0 0]
}
