package ops_test

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// One query looks at a 2x2 map with one head of two channels, from two
// points: the centre of the map, where all four pixels weigh a quarter, and
// the centre of its bottom-right pixel.
func ExampleMSDeformAttn() {
	g := G.NewGraph()
	// value [N=1, S=2*2, M=1, D=2]: pixel (y,x) holds (1+2y+x, 10*(1+2y+x)).
	value := G.NewTensor(g, tensor.Float64, 4, G.WithName("value"), G.WithValue(
		tensor.New(tensor.WithShape(1, 4, 1, 2), tensor.WithBacking([]float64{1, 10, 2, 20, 3, 30, 4, 40}))))
	// samplingLoc [N=1, Lq=1, M=1, L=1, P=2, (x,y)].
	loc := G.NewTensor(g, tensor.Float64, 6, G.WithName("loc"), G.WithValue(
		tensor.New(tensor.WithShape(1, 1, 1, 1, 2, 2), tensor.WithBacking([]float64{0.5, 0.5, 0.75, 0.75}))))
	// attnWeight [N=1, Lq=1, M=1, L=1, P=2].
	weight := G.NewTensor(g, tensor.Float64, 5, G.WithName("weight"), G.WithValue(
		tensor.New(tensor.WithShape(1, 1, 1, 1, 2), tensor.WithBacking([]float64{0.5, 0.5}))))

	out, err := ops.MSDeformAttn(value, loc, weight, []ops.Level{{H: 2, W: 2}})
	if err != nil {
		fmt.Println(err)
		return
	}
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		fmt.Println(err)
		return
	}
	// 0.5*2.5 + 0.5*4 and ten times that.
	fmt.Println(out.Shape(), out.Value().Data())

	_, err = ops.MSDeformAttn(value, loc, weight, []ops.Level{{H: 2, W: 3}})
	fmt.Println(err)
	// Output:
	// (1, 1, 2) [3.25 32.5]
	// ops: MSDeformAttn: value must have shape [N S M D] with S = 2*3 = 6, the sum of H*W over levels, got (1, 4, 1, 2)
}
