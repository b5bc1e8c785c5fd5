package train

import (
	"slices"
	"testing"

	"github.com/stheno-ml/stheno/examples/internal/eval"
	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
)

// curves.png plots the six losses under model.LossNames' names, and box
// and mask AP and AP50, at the iterations of the history.
func TestHistorySeries(t *testing.T) {
	h := History{
		Losses: []LossPoint{
			{Iter: 20, Total: 6, RPNObjectness: 1, RPNBox: 2, Class: 3, Box: 4, Mask: 5},
			{Iter: 40, Total: 0.6, RPNObjectness: 0.1, RPNBox: 0.2, Class: 0.3, Box: 0.4, Mask: 0.5},
		},
		Evals: []EvalPoint{{Iter: 40, Box: eval.APs{AP: 0.1, AP50: 0.2, AP75: 0.3}, Mask: eval.APs{AP: 0.4, AP50: 0.5, AP75: 0.6}}},
	}
	l := h.lossSeries()
	if !slices.Equal(l.Names, model.LossNames[:]) || !slices.Equal(l.Iters, []int{20, 40}) ||
		!slices.Equal(l.Values[0], []float64{6, 1, 2, 3, 4, 5}) || !slices.Equal(l.Values[1], []float64{0.6, 0.1, 0.2, 0.3, 0.4, 0.5}) {
		t.Errorf("loss series %+v", l)
	}
	a := h.apSeries()
	if !slices.Equal(a.Names, []string{"box AP", "box AP50", "mask AP", "mask AP50"}) || !slices.Equal(a.Iters, []int{40}) ||
		!slices.Equal(a.Values[0], []float64{0.1, 0.2, 0.4, 0.5}) {
		t.Errorf("AP series %+v", a)
	}
}
