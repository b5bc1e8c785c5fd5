package ops

import (
	"slices"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func gatherBuild(g *G.ExprGraph, in G.Nodes) (*G.Node, error) { return GatherRows(in[0], in[1]) }

func intVector(v ...int) *tensor.Dense {
	return tensor.New(tensor.WithShape(len(v)), tensor.WithBacking(slices.Clone(v)))
}

// Rows by hand, repeats included; the gradient adds the repeats' rows.
func TestGatherRowsHandValues(t *testing.T) {
	x := dense64([]int{3, 2}, 1, 2, 3, 4, 5, 6)
	idx := intVector(2, 0, 2)
	got, shape, err := runGraph(t, []*tensor.Dense{x, idx}, gatherBuild)
	if err != nil {
		t.Fatal(err)
	}
	if !shape.Eq(tensor.Shape{3, 2}) || !slices.Equal(got, []float64{5, 6, 1, 2, 5, 6}) {
		t.Errorf("out = %v %v", got, shape)
	}
	grads := gradOf(t, []*tensor.Dense{x, idx}, dense64([]int{3, 2}, 1, 2, 3, 4, 5, 6), []int{0}, gatherBuild)
	if want := []float64{3, 4, 0, 0, 1 + 5, 2 + 6}; !slices.Equal(grads[0], want) {
		t.Errorf("dx = %v, want %v", grads[0], want)
	}
	// Rows of a rank-3 x.
	x3 := dense64([]int{2, 2, 2}, 1, 2, 3, 4, 5, 6, 7, 8)
	got, shape, err = runGraph(t, []*tensor.Dense{x3, intVector(1)}, gatherBuild)
	if err != nil || !shape.Eq(tensor.Shape{1, 2, 2}) || !slices.Equal(got, []float64{5, 6, 7, 8}) {
		t.Errorf("rank 3: %v %v %v", got, shape, err)
	}
}

// An index outside [0, N) is an error when the op runs on the host.
func TestGatherRowsBadIndex(t *testing.T) {
	x := dense64([]int{3, 2}, 1, 2, 3, 4, 5, 6)
	for _, idx := range [][]int{{0, 3}, {-1, 0}} {
		_, _, err := runGraph(t, []*tensor.Dense{x, intVector(idx...)}, gatherBuild)
		if err == nil || !strings.Contains(err.Error(), "ops: GatherRows: index") || !strings.Contains(err.Error(), "outside [0, 3)") {
			t.Errorf("idx %v: got %v", idx, err)
		}
	}
}
