package train

import (
	"image"

	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
	"github.com/stheno-ml/stheno/examples/maskrcnn/viz"
)

// curves plots the losses (log scale) over the AP of the evaluations.
func curves(h History) image.Image {
	x := make([]float64, len(h.Losses))
	ys := make([][]float64, len(model.LossNames))
	for j, p := range h.Losses {
		x[j] = float64(p.Iter)
		for i, v := range p.values() {
			ys[i] = append(ys[i], v)
		}
	}
	var loss []viz.Series
	for i, name := range model.LossNames {
		loss = append(loss, viz.Series{Name: name, X: x, Y: ys[i]})
	}
	var ex []float64
	var ap [4][]float64
	for _, e := range h.Evals {
		ex = append(ex, float64(e.Iter))
		ap[0] = append(ap[0], float64(e.Box.AP))
		ap[1] = append(ap[1], float64(e.Box.AP50))
		ap[2] = append(ap[2], float64(e.Mask.AP))
		ap[3] = append(ap[3], float64(e.Mask.AP50))
	}
	apSeries := []viz.Series{
		{Name: "box AP", X: ex, Y: ap[0]}, {Name: "box AP50", X: ex, Y: ap[1]},
		{Name: "mask AP", X: ex, Y: ap[2]}, {Name: "mask AP50", X: ex, Y: ap[3]},
	}
	return viz.Grid([]image.Image{
		viz.Plot(viz.PlotOptions{Title: "training losses", XLabel: "iteration", Width: 640, Height: 360, LogY: true}, loss...),
		viz.Plot(viz.PlotOptions{Title: "validation AP", XLabel: "iteration", Width: 640, Height: 360}, apSeries...),
	}, 1)
}
