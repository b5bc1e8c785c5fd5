package hostop

import (
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Do hands the function its inputs as T, in place when their dtype is T's,
// and returns its output in the inputs' dtype; bad inputs are refused.
func TestDo(t *testing.T) {
	sum := func(in [][]float64, out []float64) error {
		for _, x := range in {
			for i, v := range x {
				out[i] += v
			}
		}
		return nil
	}
	op64 := &Op[float64]{Name: "sum", In: []tensor.Shape{{2}, {2}}, Size: 2, Run: sum}
	a := tensor.New(tensor.WithShape(2), tensor.WithBacking([]float32{1, 2}))
	b := tensor.New(tensor.WithShape(2), tensor.WithBacking([]float32{3, 0.5}))
	v, err := op64.Do(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if d := v.(*tensor.Dense); d.Dtype() != tensor.Float32 || d.Float32s()[0] != 4 || d.Float32s()[1] != 2.5 {
		t.Errorf("float32 inputs through a float64 function: %v", v)
	}

	var seen []float32
	op32 := &Op[float32]{Name: "read", In: []tensor.Shape{{2}}, Size: 1, Run: func(in [][]float32, out []float32) error {
		seen = in[0]
		return nil
	}}
	if _, err := op32.Do(a); err != nil {
		t.Fatal(err)
	}
	if &seen[0] != &a.Float32s()[0] {
		t.Error("a float32 input was copied for a float32 function")
	}

	c := tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{1, 2}))
	for _, tc := range []struct {
		in   []G.Value
		want string
	}{
		{[]G.Value{a}, "want 2 inputs, got 1"},
		{[]G.Value{a, c}, "input 1 is float64, input 0 float32"},
		{[]G.Value{a, tensor.New(tensor.WithShape(3), tensor.WithBacking([]float32{1, 2, 3}))}, "input 1 must be a float32 or float64 host tensor of shape (2)"},
	} {
		if _, err := op64.Do(tc.in...); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "hostop: sum: ") {
			t.Errorf("want an error with %q, got %v", tc.want, err)
		}
	}
	if diff := op64.DiffWRT(2); len(diff) != 2 || diff[0] || diff[1] {
		t.Errorf("DiffWRT = %v, want no input differentiable", diff)
	}
}

// With Reuse the op writes every run's output into the same memory; without
// it each run's output is its own and starts as zeros.
func TestReuse(t *testing.T) {
	runs := 0
	count := func(in [][]float32, out []float32) error {
		runs++
		for i := range out {
			out[i] += float32(runs) // reads what is there: zeros or the last run's
		}
		return nil
	}
	x := tensor.New(tensor.WithShape(1), tensor.WithBacking([]float32{0}))
	for _, reuse := range []bool{false, true} {
		runs = 0
		op := &Op[float32]{Name: "count", In: []tensor.Shape{{1}}, Size: 3, Run: count, Reuse: reuse}
		v1, err := op.Do(x)
		if err != nil {
			t.Fatal(err)
		}
		first := v1.(*tensor.Dense).Float32s()
		v2, err := op.Do(x)
		if err != nil {
			t.Fatal(err)
		}
		second := v2.(*tensor.Dense).Float32s()
		shared := &first[0] == &second[0]
		if shared != reuse {
			t.Errorf("Reuse %v: the two runs' outputs share memory: %v", reuse, shared)
		}
		want := float32(2) // a fresh output of zeros, plus 2
		if reuse {
			want = 3 // the first run's 1, plus 2
		}
		if second[0] != want {
			t.Errorf("Reuse %v: the second run saw %v, want %v", reuse, second[0], want)
		}
	}
}
