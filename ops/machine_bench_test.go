package ops

import (
	"testing"

	G "gorgonia.org/gorgonia"
)

// BenchmarkRunAllFixedCost times a run of a machine that has almost nothing
// to do (x + y on host scalars), built as NewTapeMachine builds every
// machine: what a training step pays once, whatever its graph, on top of
// its nodes. Gorgonia's RunAll runs the tape on a new goroutine while the
// caller, locked to its OS thread, waits on channels, so each run hands
// the work to another thread and back.
func BenchmarkRunAllFixedCost(b *testing.B) {
	g := G.NewGraph()
	x := G.NewScalar(g, G.Float64, G.WithName("x"), G.WithValue(1.0))
	y := G.NewScalar(g, G.Float64, G.WithName("y"), G.WithValue(2.0))
	if _, err := G.Add(x, y); err != nil {
		b.Fatal(err)
	}
	m, err := NewTapeMachine(g)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	for b.Loop() {
		if err := m.RunAll(); err != nil {
			b.Fatal(err)
		}
		m.Reset()
	}
}
