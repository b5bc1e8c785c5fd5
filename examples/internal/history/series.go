package history

import "math"

// Series are named quantities sampled at iterations, each a line of
// curves.png: a run's losses (the total first, then its parts: Mask
// R-CNN's six, DETR's classification, L1 and GIoU) or its evaluations'
// precisions (box AP, and mask AP where there are masks). Values[i][k] is
// quantity Names[k] at iteration Iters[i]; NaN where it is undefined.
type Series struct {
	Names  []string
	Iters  []int
	Values [][]float64
}

// Add appends the values of iteration iter, in Names' order.
func (s *Series) Add(iter int, values ...float64) {
	s.Iters = append(s.Iters, iter)
	s.Values = append(s.Values, values)
}

// series returns quantity k's line: x the iterations, y its values (NaN
// where a row has no value k).
func (s Series) series(k int) (x, y []float64) {
	for i, it := range s.Iters {
		v := math.NaN()
		if i < len(s.Values) && k < len(s.Values[i]) {
			v = s.Values[i][k]
		}
		x = append(x, float64(it))
		y = append(y, v)
	}
	return x, y
}
