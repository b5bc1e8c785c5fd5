package checkpoint

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	"gorgonia.org/tensor"
)

// store is a host Store of a few tensors.
type store struct {
	values map[string]*tensor.Dense
	stats  map[string][2]*tensor.Dense
}

func newStore(w, mean, variance []float32) *store {
	d := func(v []float32) *tensor.Dense { return tensor.New(tensor.WithShape(len(v)), tensor.WithBacking(v)) }
	return &store{values: map[string]*tensor.Dense{"w": d(w)}, stats: map[string][2]*tensor.Dense{"bn": {d(mean), d(variance)}}}
}

func (s *store) Names() []string                              { return []string{"w"} }
func (s *store) Value(name string) *tensor.Dense              { return s.values[name] }
func (s *store) HostValue(name string) (*tensor.Dense, error) { return s.values[name], nil }
func (s *store) SetValue(name string, v []float32) error {
	copy(s.values[name].Float32s(), v)
	return nil
}
func (s *store) BatchNorms() []string { return []string{"bn"} }
func (s *store) RunningStats(name string) (*tensor.Dense, *tensor.Dense) {
	return s.stats[name][0], s.stats[name][1]
}
func (s *store) HostRunningStats(name string) (*tensor.Dense, *tensor.Dense, error) {
	return s.stats[name][0], s.stats[name][1], nil
}
func (s *store) SetRunningStats(name string, m, v []float32) error {
	copy(s.stats[name][0].Float32s(), m)
	copy(s.stats[name][1].Float32s(), v)
	return nil
}

// optimizer keeps the state it is given.
type optimizer struct {
	steps   int
	moments map[string][2]*tensor.Dense
}

func (o *optimizer) OptimizerState() (int, map[string][2]*tensor.Dense, error) {
	return o.steps, o.moments, nil
}
func (o *optimizer) SetOptimizerState(steps int, m map[string][2]*tensor.Dense) error {
	o.steps, o.moments = steps, m
	return nil
}

// A snapshot restores into another store and optimiser as it was taken;
// weights that are not finite and missing tensors are refused.
func TestSnapshotRestore(t *testing.T) {
	src := newStore([]float32{1, 2}, []float32{3}, []float32{4})
	mv := [2]*tensor.Dense{tensor.New(tensor.WithShape(2), tensor.WithBacking([]float32{5, 6})), tensor.New(tensor.WithShape(2), tensor.WithBacking([]float32{7, 8}))}
	st, err := Snapshot(src, &optimizer{steps: 9, moments: map[string][2]*tensor.Dense{"w": mv}})
	if err != nil {
		t.Fatal(err)
	}
	dst, opt := newStore(make([]float32, 2), make([]float32, 1), make([]float32, 1)), &optimizer{}
	if err := st.Restore(dst, opt); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(dst, src) || opt.steps != 9 || !reflect.DeepEqual(opt.moments["w"][1].Float32s(), []float32{7, 8}) {
		t.Errorf("restored %+v and optimiser %+v, want %+v", dst, opt, src)
	}
	if err := (State{Params: st.Params}).Restore(dst, nil); err == nil || !strings.Contains(err.Error(), "checkpoint: no tensor bn.mean") {
		t.Errorf("restoring without statistics: %v", err)
	}
	bad := newStore([]float32{1, float32(math.NaN())}, []float32{0}, []float32{1})
	var nf *NotFiniteError
	if _, err := Snapshot(bad, nil); !errors.As(err, &nf) || nf.Name != "w" {
		t.Errorf("snapshot of NaN weights: %v, want a NotFiniteError of w", err)
	}
}
