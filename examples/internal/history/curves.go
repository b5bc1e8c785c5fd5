package history

import (
	"image"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/stheno-ml/stheno/examples/internal/viz"
)

// curves.png's size: two panels of about 640x360 pixels, stacked.
const (
	curvesWidth, curvesHeight = 640, 720 // pixels
	curvesDPI                 = 96
)

// Curves draws curves.png: above, the training losses on a log scale, the
// first (the total) thicker than its parts; below, the evaluations'
// precisions on [0, 1], a dot at each evaluation; both against the
// iteration, on one x range. Series k of each panel takes viz.Colour(k).
// Each panel's legend sits in a column to the right of its data, so it
// never hides a line.
//
// Points that cannot be drawn are left out and break their line rather
// than being bridged: an undefined AP (NaN, when no validation class has
// ground truth), and a loss that is not positive (a log axis has no place
// for 0, and gonum's LogScale panics on it) or not finite, or missing from
// its row of Values. Empty series (no losses yet, or no evaluations, as in
// a run without validation images) give the same picture with empty
// panels.
func Curves(losses, precisions Series) *image.RGBA {
	img, _ := drawCurves(losses, precisions)
	return img
}

// curvesLayout is where drawCurves put each panel's data area and legend,
// in pixels of its image (for the tests).
type curvesLayout struct {
	data, legend [2]image.Rectangle
}

func drawCurves(losses, precisions Series) (*image.RGBA, curvesLayout) {
	loss, lossLegend := lossPanel(losses)
	ap, apLegend := apPanel(precisions)
	// One x range for both panels, so an evaluation sits under the losses
	// of the same iteration.
	xmax := 1.0
	for _, s := range []Series{losses, precisions} {
		if n := len(s.Iters); n > 0 {
			xmax = max(xmax, float64(s.Iters[n-1]))
		}
	}
	for _, p := range []*plot.Plot{loss, ap} {
		p.X.Min, p.X.Max = 0, xmax
	}

	canvas := vgimg.NewWith(vgimg.UseWH(pixels(curvesWidth), pixels(curvesHeight)), vgimg.UseDPI(curvesDPI))
	dc := draw.New(canvas)
	pad := pixels(8)
	legends := []plot.Legend{lossLegend, apLegend}
	var legendW vg.Length
	for i := range legends {
		legendW = max(legendW, legends[i].Rectangle(dc).Size().X)
	}
	// The plots share the canvas left of the legend column; plot.Align
	// lines up their data areas.
	plots := draw.Crop(dc, 0, -(legendW + 2*pad), 0, 0)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: pad, PadBottom: pad, PadLeft: pad, PadY: 2 * pad}
	cells := plot.Align([][]*plot.Plot{{loss}, {ap}}, tiles, plots)
	var lay curvesLayout
	for i, p := range []*plot.Plot{loss, ap} {
		p.Draw(cells[i][0])
		data := p.DataCanvas(cells[i][0])
		col := draw.Canvas{Canvas: dc, Rectangle: vg.Rectangle{
			Min: vg.Point{X: plots.Max.X + pad, Y: data.Min.Y},
			Max: vg.Point{X: dc.Max.X - pad, Y: data.Max.Y},
		}}
		legends[i].Draw(col)
		lay.data[i] = pixelRect(data.Rectangle)
		// Where Draw puts a legend with Left and Top set: at col's top-left
		// corner. (Legend.Rectangle would put it at the right edge: it
		// reads Left the other way round.)
		size := legends[i].Rectangle(col).Size()
		lay.legend[i] = pixelRect(vg.Rectangle{
			Min: vg.Point{X: col.Min.X, Y: col.Max.Y - size.Y},
			Max: vg.Point{X: col.Min.X + size.X, Y: col.Max.Y},
		})
	}
	return canvas.Image().(*image.RGBA), lay
}

// lossPanel plots each loss of s, in viz.Colour order, on a log axis
// spanning whole decades.
func lossPanel(s Series) (*plot.Plot, plot.Legend) {
	// Two lines: in one, the label would be longer than the panel is high,
	// and gonum would shrink the data area to fit it.
	p := newPanel("training losses", "loss (mean over the\nlogging interval)")
	leg := newLegend()
	lo, hi := math.Inf(1), math.Inf(-1)
	for k, name := range s.Names {
		x, y := s.series(k)
		style := lineStyle(k)
		if k == 0 {
			style.Width *= 1.5 // the total, the sum of the others
		}
		for _, seg := range segments(x, y, func(v float64) bool { return v > 0 && !math.IsInf(v, 0) }) {
			l := &plotter.Line{XYs: seg, LineStyle: style}
			p.Add(l)
			for _, pt := range seg {
				lo, hi = min(lo, pt.Y), max(hi, pt.Y)
			}
		}
		leg.Add(name, &plotter.Line{LineStyle: style})
	}
	if lo > hi { // nothing to draw: any decade will do
		lo, hi = 0.1, 1
	}
	// The axis spans whole decades, at least one, so that it always has
	// two labelled ticks.
	e0, e1 := int(math.Floor(math.Log10(lo))), int(math.Ceil(math.Log10(hi)))
	e1 = max(e1, e0+1)
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = decadeTicks(e0, e1)
	p.Y.Min, p.Y.Max = math.Pow10(e0), math.Pow10(e1)
	return p, leg
}

// decadeTicks marks a log axis from 10^e0 to 10^e1: each power of ten
// labelled, and 2..9 times it unlabelled. (plot.LogTicks would do, but it
// truncates log10 of the axis minimum toward zero, and math.Log10(0.1) is
// -0.9999999999999999: an axis from 0.1 to 1 would have only "1" labelled.)
func decadeTicks(e0, e1 int) plot.ConstantTicks {
	var ts plot.ConstantTicks
	for e := e0; e <= e1; e++ {
		v := math.Pow10(e)
		ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
		for k := 2; k <= 9 && e < e1; k++ {
			ts = append(ts, plot.Tick{Value: float64(k) * v})
		}
	}
	return ts
}

// apPanel plots the precisions of s, as lines with a dot at each
// evaluation, on [0, 1].
func apPanel(s Series) (*plot.Plot, plot.Legend) {
	title := "validation AP"
	if len(s.Iters) == 0 {
		title = "validation AP (no evaluations)"
	}
	p := newPanel(title, "average precision")
	leg := newLegend()
	for k, name := range s.Names {
		x, y := s.series(k)
		l := &plotter.Line{LineStyle: lineStyle(k)}
		dots := &plotter.Scatter{GlyphStyle: draw.GlyphStyle{Color: viz.Colour(k), Radius: vg.Points(2.5), Shape: draw.CircleGlyph{}}}
		for _, seg := range segments(x, y, func(v float64) bool { return !math.IsNaN(v) }) {
			p.Add(&plotter.Line{XYs: seg, LineStyle: l.LineStyle}, &plotter.Scatter{XYs: seg, GlyphStyle: dots.GlyphStyle})
		}
		leg.Add(name, l, dots)
	}
	p.Y.Min, p.Y.Max = 0, 1
	var ticks plot.ConstantTicks
	for i := 0; i <= 10; i++ {
		t := plot.Tick{Value: float64(i) / 10}
		if i%2 == 0 {
			t.Label = strconv.FormatFloat(t.Value, 'f', 1, 64)
		}
		ticks = append(ticks, t)
	}
	p.Y.Tick.Marker = ticks
	return p, leg
}

func newPanel(title, ylabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "iteration"
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	return p
}

func newLegend() plot.Legend {
	l := plot.NewLegend()
	l.Top, l.Left = true, true
	return l
}

func lineStyle(k int) draw.LineStyle {
	return draw.LineStyle{Color: viz.Colour(k), Width: vg.Points(1.5)}
}

// segments splits the points (x[i], y[i]) into runs of points whose y
// keep accepts, dropping the others.
func segments(x, y []float64, keep func(float64) bool) []plotter.XYs {
	var out []plotter.XYs
	var cur plotter.XYs
	for i := range min(len(x), len(y)) {
		if !keep(y[i]) {
			if len(cur) > 0 {
				out = append(out, cur)
			}
			cur = nil
			continue
		}
		cur = append(cur, plotter.XY{X: x[i], Y: y[i]})
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// pixels is the length of n pixels of curves.png.
func pixels(n float64) vg.Length { return vg.Length(n) * vg.Inch / curvesDPI }

// pixelRect converts a rectangle of the canvas (points, y up) to the
// pixels of its image (y down).
func pixelRect(r vg.Rectangle) image.Rectangle {
	px := func(l vg.Length) int { return int(math.Round(float64(l / vg.Inch * curvesDPI))) }
	return image.Rect(px(r.Min.X), curvesHeight-px(r.Max.Y), px(r.Max.X), curvesHeight-px(r.Min.Y))
}
