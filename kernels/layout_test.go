package kernels

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// permuteRef is the definition: out's element at output coordinates is
// in's at the permuted ones.
func permuteRef(in []float64, shape, perm []int) []float64 {
	r := len(shape)
	stride := make([]int, r)
	s := 1
	for a := r - 1; a >= 0; a-- {
		stride[a], s = s, s*shape[a]
	}
	out := make([]float64, len(in))
	for o := range out {
		rest, off := o, 0
		for k := r - 1; k >= 0; k-- {
			d := shape[perm[k]]
			off += rest % d * stride[perm[k]]
			rest /= d
		}
		out[o] = in[off]
	}
	return out
}

// The canonical form drops axes of one and merges neighbours, and picks
// the tile design exactly when the innermost axis moves.
func TestNewPermuteParams(t *testing.T) {
	for _, c := range []struct {
		shape, perm []int
		want        string
	}{
		{[]int{2, 20000, 8, 32}, []int{0, 2, 1, 3}, "dims=[2 8 20000 32],in=[5120000 32 256 1],tile=-1"},
		{[]int{2, 256, 100, 150}, []int{0, 2, 3, 1}, "dims=[2 15000 256],in=[3840000 1 15000],tile=1"},
		{[]int{2, 15000, 256}, []int{0, 2, 1}, "dims=[2 256 15000],in=[3840000 1 256],tile=1"},
		{[]int{3, 4, 5}, []int{0, 1, 2}, "dims=[60],in=[1],tile=-1"},
		{[]int{4, 1, 6}, []int{2, 1, 0}, "dims=[6 4],in=[1 6],tile=0"},
		{[]int{1, 1}, []int{1, 0}, "dims=[1],in=[1],tile=-1"},
		{[]int{6, 2, 3, 5}, []int{1, 0, 2, 3}, "dims=[2 6 15],in=[15 30 1],tile=-1"},
	} {
		if got := NewPermuteParams(c.shape, c.perm).String(); got != c.want {
			t.Errorf("%v perm %v: %s, want %s", c.shape, c.perm, got, c.want)
		}
	}
}

func TestPermuteMatchesDefinition(t *testing.T) {
	for _, c := range []struct{ shape, perm []int }{
		{[]int{2, 5, 3, 4}, []int{0, 2, 1, 3}},
		{[]int{3, 37, 45}, []int{0, 2, 1}},
		{[]int{2, 33, 5, 7}, []int{0, 2, 3, 1}},
		{[]int{2, 3, 4, 5, 6}, []int{4, 2, 0, 3, 1}},
		{[]int{4, 1, 6}, []int{2, 1, 0}},
		{[]int{7}, []int{0}},
		{[]int{1, 1}, []int{1, 0}},
	} {
		n := 1
		for _, d := range c.shape {
			n *= d
		}
		in := make([]float64, n)
		for i := range in {
			in[i] = float64(i + 1)
		}
		out := make([]float64, n)
		Permute(NewPermuteParams(c.shape, c.perm), in, out)
		if want := permuteRef(in, c.shape, c.perm); !slices.Equal(out, want) {
			t.Errorf("%v perm %v: got %v, want %v", c.shape, c.perm, out, want)
		}
	}
}

func TestCopyRows(t *testing.T) {
	src := []float32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	dst := make([]float32, 8)
	CopyRows(3, 2, 3, 3, src[1:], dst)
	if want := []float32{2, 3, 0, 5, 6, 0, 8, 9}; !slices.Equal(dst, want) {
		t.Errorf("got %v, want %v", dst, want)
	}
}

func TestGatherRows(t *testing.T) {
	x := []float64{1, 2, 3, 4, 5, 6} // [3, 2]
	out := make([]float64, 8)
	if err := GatherRows(3, 2, x, []int{2, 0, 2, 1}, out); err != nil {
		t.Fatal(err)
	}
	if want := []float64{5, 6, 1, 2, 5, 6, 3, 4}; !slices.Equal(out, want) {
		t.Errorf("got %v, want %v", out, want)
	}
	err := GatherRows(3, 2, x, []int{1, 3, -1, 0}, out)
	if err == nil || !strings.Contains(err.Error(), "index 1 is 3, outside [0, 3)") {
		t.Errorf("bad index: %v", err)
	}
	if want := []float64{3, 4, 0, 0, 0, 0, 1, 2}; !slices.Equal(out, want) {
		t.Errorf("bad index: got %v, want zero rows: %v", out, want)
	}
	dx := make([]float64, 6)
	for i := range dx {
		dx[i] = 99
	}
	GatherRowsBackward(3, 2, []float64{1, 2, 3, 4, 5, 6, 7, 8}, []int{2, 0, 2, 7}, dx)
	if want := []float64{3, 4, 0, 0, 6, 8}; !slices.Equal(dx, want) {
		t.Errorf("backward: got %v, want %v", dx, want)
	}
}

func ExamplePermute() {
	// [2, 3] -> [3, 2]
	in := []float32{1, 2, 3, 4, 5, 6}
	out := make([]float32, 6)
	p := NewPermuteParams([]int{2, 3}, []int{1, 0})
	Permute(p, in, out)
	fmt.Println(p, out)
	// Output: dims=[3 2],in=[1 3],tile=0 [1 4 2 5 3 6]
}
