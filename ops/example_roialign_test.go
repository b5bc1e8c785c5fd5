package ops_test

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// Pool two boxes of a 4x4 feature map into 2x2 grids and take the gradient
// of their sum with respect to the map.
func ExampleRoIAlign() {
	g := G.NewGraph()
	// x[0,0,y,x] = 4y + x: bilinear samples of a ramp are easy to check.
	x := G.NewTensor(g, tensor.Float64, 4, G.WithShape(1, 1, 4, 4), G.WithName("x"), G.WithInit(G.RangedFrom(0)))
	rois := G.NewMatrix(g, tensor.Float64, G.WithShape(2, 5), G.WithName("rois"), G.WithValue(
		tensor.New(tensor.WithShape(2, 5), tensor.WithBacking([]float64{
			0, 0.5, 0.5, 2.5, 2.5, // batch index, x1, y1, x2, y2
			0, 1.5, 0.5, 3.5, 2.5,
		}))))
	pooled, err := ops.RoIAlign(x, rois, ops.RoIAlignConfig{
		PooledH: 2, PooledW: 2, SpatialScale: 1, SamplingRatio: 2, Aligned: true,
	})
	if err != nil {
		panic(err)
	}
	loss := G.Must(G.Sum(pooled))
	if _, err := G.Grad(loss, x); err != nil {
		panic(err)
	}
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		panic(err)
	}
	fmt.Println("pooled:", pooled.Value().Data())
	grad, _ := x.Grad()
	fmt.Println("dloss/dx row 1:", grad.Data().([]float64)[4:8])
	// Output:
	// pooled: [2.5 3.5 6.5 7.5 3.5 4.5 7.5 8.5]
	// dloss/dx row 1: [0.5 1.5 1.5 0.5]
}
