package ops_test

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// Self-attention of three tokens of four features in two heads, with
// identity projections and no biases, the third token masked out as a key:
// each token mixes the first two by its similarity to them, the values
// torch.nn.MultiheadAttention gives with the same weights (0.6698 =
// e^(1/sqrt 2) / (e^(1/sqrt 2) + 1), the weight of the matching token).
func ExampleMultiHeadAttention() {
	const e = 4
	g := G.NewGraph()
	matrix := func(name string, rows, cols int, v []float64) *G.Node {
		return G.NewMatrix(g, tensor.Float64, G.WithShape(rows, cols), G.WithName(name),
			G.WithValue(tensor.New(tensor.WithShape(rows, cols), tensor.WithBacking(v))))
	}
	eye := func(n int) []float64 {
		v := make([]float64, n*n)
		for i := range n {
			v[i*n+i] = 1
		}
		return v
	}
	x := G.NewTensor(g, tensor.Float64, 3, G.WithShape(3, 1, e), G.WithName("x"), G.WithValue( // [L, N, E]
		tensor.New(tensor.WithShape(3, 1, e), tensor.WithBacking([]float64{
			1, 0, 0, 1,
			0, 1, 1, 0,
			1, 1, 0, 0,
		}))))
	w := ops.AttentionWeights{
		InProjWeight:  matrix("in_proj_weight", 3*e, e, append(append(eye(e), eye(e)...), eye(e)...)),
		OutProjWeight: matrix("out_proj_weight", e, e, eye(e)),
	}
	maskValue, err := ops.KeyPaddingMask([]bool{false, false, true}, 1, 3, tensor.Float64)
	if err != nil {
		panic(err)
	}
	mask := G.NodeFromAny(g, maskValue, G.WithName("mask"))
	out, weights, err := ops.MultiHeadAttention(x, x, x, w, mask, ops.AttentionConfig{NumHeads: 2, NeedWeights: true})
	if err != nil {
		panic(err)
	}
	var ov, wv G.Value
	G.Read(out, &ov)
	G.Read(weights, &wv)
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		panic(err)
	}
	fmt.Printf("out:     %v %.4f\n", ov.Shape(), ov.Data())
	fmt.Printf("weights: %v %.4f\n", wv.Shape(), wv.Data())
	// Output:
	// out:     (3, 1, 4) [0.6698 0.3302 0.3302 0.6698 0.3302 0.6698 0.6698 0.3302 0.5000 0.5000 0.5000 0.5000]
	// weights: (1, 3, 3) [0.6698 0.3302 0.0000 0.3302 0.6698 0.0000 0.5000 0.5000 0.0000]
}
