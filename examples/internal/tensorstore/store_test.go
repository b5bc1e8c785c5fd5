package tensorstore

import (
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"gorgonia.org/tensor"
)

// A host store creates each tensor once, from its stream, refuses other
// shapes and the other kind of tensor under a name, and reads and writes
// values through the host.
func TestStore(t *testing.T) {
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		s, err := New(dt, rand.New(rand.NewPCG(1, 2)), nil)
		if err != nil {
			t.Fatal(err)
		}
		w, created, err := s.TensorFor("w", []int{2, 3}, Normal(1))
		if err != nil || !created || w.Dtype() != dt {
			t.Fatalf("%v: TensorFor: %v, %v, %v", dt, w, created, err)
		}
		if again, created, err := s.TensorFor("w", []int{2, 3}, Zeros()); again != w || created || err != nil {
			t.Errorf("%v: second TensorFor: %p %v %v, want the first tensor", dt, again, created, err)
		}
		if _, _, err := s.TensorFor("w", []int{3, 2}, Zeros()); err == nil || !strings.HasPrefix(err.Error(), "tensorstore: ") {
			t.Errorf("%v: another shape: %v", dt, err)
		}
		if _, err := s.FrozenFor("w", []int{2, 3}, Zeros()); err == nil {
			t.Errorf("%v: a learnable tensor asked for as frozen: no error", dt)
		}
		if _, err := s.FrozenFor("f", []int{4}, Constant(2)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.StatsFor("bn", 3); err != nil {
			t.Fatal(err)
		}
		if s.Size() != 6 || !reflect.DeepEqual(s.Names(), []string{"w"}) || !reflect.DeepEqual(s.Frozen(), []string{"f"}) || !reflect.DeepEqual(s.BatchNorms(), []string{"bn"}) {
			t.Errorf("%v: size %d, names %v, frozen %v, BatchNorms %v", dt, s.Size(), s.Names(), s.Frozen(), s.BatchNorms())
		}
		if err := s.SetValue("f", []float32{1, 2, 3, 4}); err != nil {
			t.Fatal(err)
		}
		if h, err := s.HostValue("f"); err != nil || h.Shape().TotalSize() != 4 || h.Data() == nil {
			t.Errorf("%v: HostValue: %v, %v", dt, h, err)
		} else if got := DenseOf(tensor.Float64, []float64{1, 2, 3, 4}, 4); dt == tensor.Float64 && !reflect.DeepEqual(h.Float64s(), got.Float64s()) {
			t.Errorf("%v: f is %v after SetValue", dt, h)
		}
		if err := s.SetRunningStats("bn", []float32{1, 2, 3}, []float32{4}); err == nil {
			t.Errorf("%v: SetRunningStats with one variance for three channels: no error", dt)
		}
		mean, variance, err := s.HostRunningStats("bn")
		if err != nil || mean.Shape()[0] != 3 || variance.Shape()[0] != 3 {
			t.Errorf("%v: HostRunningStats: %v %v %v", dt, mean, variance, err)
		}
	}
	if _, err := New(tensor.Int, nil, nil); err == nil {
		t.Error("New of int tensors: no error")
	}
}

// The same seed and requests give the same values in either dtype (the
// float32 ones are the float64 ones rounded).
func TestInitDeterministic(t *testing.T) {
	draw := func(dt tensor.Dtype) *tensor.Dense {
		s, _ := New(dt, rand.New(rand.NewPCG(7, 8)), nil)
		s.TensorFor("a", []int{5}, Zeros())
		w, _, _ := s.TensorFor("w", []int{5}, Kaiming(3))
		return w
	}
	f32, f64 := draw(tensor.Float32).Float32s(), draw(tensor.Float64).Float64s()
	for i := range f32 {
		if f32[i] != float32(f64[i]) || f64[i] == 0 {
			t.Fatalf("value %d: float32 %v, float64 %v", i, f32[i], f64[i])
		}
	}
}
