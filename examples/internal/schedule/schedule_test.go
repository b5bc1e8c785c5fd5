package schedule

import "testing"

func TestWarmupMultiStep(t *testing.T) {
	s := WarmupMultiStep{LR: 1, Warmup: 10, WarmupFactor: 0.01, Steps: []int{20, 30}, Gamma: 0.1}
	for _, c := range []struct {
		it   int
		want float64
	}{{0, 0.01}, {5, 0.505}, {10, 1}, {19, 1}, {20, 0.1}, {30, 0.01 * 1}} {
		if got := s.At(c.it); got < c.want*(1-1e-12) || got > c.want*(1+1e-12) {
			t.Errorf("At(%d) = %v, want %v", c.it, got, c.want)
		}
	}
	// Without warm-up, the rate is LR until the first milestone.
	if got := (WarmupMultiStep{LR: 2e-4, Steps: []int{40}, Gamma: 0.1}).At(0); got != 2e-4 {
		t.Errorf("no warm-up: At(0) = %v, want 2e-4", got)
	}
}
