package viz

import (
	"image"
	"image/color"
	"image/draw"
	"math"
	"strconv"
	"strings"
)

// Series is one line of a plot: the points (X[i], Y[i]). Points with a NaN
// or infinite coordinate (or Y <= 0 on a log axis) are skipped and break the
// line.
type Series struct {
	Name string
	X, Y []float64
}

// PlotOptions configures Plot.
type PlotOptions struct {
	Title          string
	XLabel, YLabel string
	// Width and Height are the picture's size (defaults 480 x 320).
	Width, Height int
	// LogY draws the y axis on a log scale (for losses spanning decades).
	LogY bool
}

// PlotLines draws series as lines on linear axes; see Plot.
func PlotLines(title string, width, height int, series ...Series) *image.RGBA {
	return Plot(PlotOptions{Title: title, Width: width, Height: height}, series...)
}

var (
	white     = color.RGBA{255, 255, 255, 255}
	black     = color.RGBA{0, 0, 0, 255}
	gridGrey  = color.RGBA{228, 228, 228, 255}
	frameGrey = color.RGBA{160, 160, 160, 255}
)

// Plot draws series as lines, series k in Colour(k), on a white picture with
// a title, axes with ticks and numbers, light grid lines at the ticks and a
// legend in the top-right corner. The x axis spans the data; the y axis is
// widened to the nearest ticks.
func Plot(opt PlotOptions, series ...Series) *image.RGBA {
	if opt.Width <= 0 {
		opt.Width = 480
	}
	if opt.Height <= 0 {
		opt.Height = 320
	}
	out := image.NewRGBA(image.Rect(0, 0, opt.Width, opt.Height))
	draw.Draw(out, out.Bounds(), image.NewUniform(white), image.Point{}, draw.Src)

	// Data ranges (y in log10 space on a log axis).
	ty := func(y float64) float64 { return y }
	if opt.LogY {
		ty = math.Log10
	}
	ok := func(x, y float64) bool {
		return !math.IsNaN(x) && !math.IsInf(x, 0) && !math.IsNaN(ty(y)) && !math.IsInf(ty(y), 0)
	}
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for i := range min(len(s.X), len(s.Y)) {
			if x, y := s.X[i], s.Y[i]; ok(x, y) {
				xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
				ymin, ymax = math.Min(ymin, ty(y)), math.Max(ymax, ty(y))
			}
		}
	}
	if xmin > xmax { // no data
		xmin, xmax, ymin, ymax = 0, 1, 0, 1
	}
	xmin, xmax = widen(xmin, xmax)
	ymin, ymax = widen(ymin, ymax)

	var yt []tick
	if opt.LogY {
		yt = logTicks(ymin, ymax)
	} else {
		yt = linearTicks(ymin, ymax)
	}
	// The y axis ends on ticks, so that its ends are labelled.
	ymin, ymax = math.Min(ymin, yt[0].v), math.Max(ymax, yt[len(yt)-1].v)
	xt := linearTicks(xmin, xmax)

	// Layout: room for the title, the y tick labels and the x tick labels.
	labelW := 0
	for _, t := range yt {
		w, _ := TextSize(t.label, 1)
		labelW = max(labelW, w)
	}
	top := 8
	if opt.Title != "" {
		top += lineHeight + 4
	}
	if opt.YLabel != "" {
		top += lineHeight
	}
	bottom := 8 + lineHeight + 4
	if opt.XLabel != "" {
		bottom += lineHeight + 2
	}
	area := image.Rect(labelW+12, top, opt.Width-12, opt.Height-bottom)
	if area.Dx() < 10 || area.Dy() < 10 {
		return out // too small to draw anything readable
	}
	px := func(x float64) float64 {
		return float64(area.Min.X) + (x-xmin)/(xmax-xmin)*float64(area.Dx()-1)
	}
	py := func(y float64) float64 {
		return float64(area.Max.Y-1) - (y-ymin)/(ymax-ymin)*float64(area.Dy()-1)
	}

	// Grid lines and tick labels.
	for _, t := range yt {
		y := int(math.Round(py(t.v)))
		if y < area.Min.Y || y >= area.Max.Y {
			continue
		}
		fillRect(out, image.Rect(area.Min.X, y, area.Max.X, y+1), gridGrey)
		fillRect(out, image.Rect(area.Min.X-4, y, area.Min.X, y+1), black)
		w, _ := TextSize(t.label, 1)
		DrawText(out, area.Min.X-6-w, y-3, t.label, black, 1)
	}
	for _, t := range xt {
		x := int(math.Round(px(t.v)))
		if x < area.Min.X || x >= area.Max.X {
			continue
		}
		fillRect(out, image.Rect(x, area.Min.Y, x+1, area.Max.Y), gridGrey)
		fillRect(out, image.Rect(x, area.Max.Y, x+1, area.Max.Y+4), black)
		w, _ := TextSize(t.label, 1)
		DrawText(out, min(max(0, x-w/2), opt.Width-w), area.Max.Y+6, t.label, black, 1)
	}
	// Axes.
	fillRect(out, image.Rect(area.Min.X-1, area.Min.Y, area.Min.X, area.Max.Y+1), black)
	fillRect(out, image.Rect(area.Min.X-1, area.Max.Y, area.Max.X, area.Max.Y+1), black)

	// Lines, clipped to the plot area.
	clip := out.SubImage(area).(*image.RGBA)
	for k, s := range series {
		c := Colour(k)
		prevOK := false
		var x0, y0 float64
		n := min(len(s.X), len(s.Y))
		for i := range n {
			x, y := s.X[i], s.Y[i]
			if !ok(x, y) {
				prevOK = false
				continue
			}
			x1, y1 := px(x), py(ty(y))
			if prevOK {
				drawLine(clip, x0, y0, x1, y1, c)
			} else if i+1 >= n || !ok(s.X[i+1], s.Y[i+1]) {
				// An isolated point: a dot, or it would not show.
				fillRect(clip, image.Rect(int(x1)-1, int(y1)-1, int(x1)+2, int(y1)+2), c)
			}
			x0, y0, prevOK = x1, y1, true
		}
	}

	// Title, axis labels, legend.
	if opt.Title != "" {
		w, _ := TextSize(opt.Title, 1)
		DrawText(out, max(0, (opt.Width-w)/2), 6, opt.Title, black, 1)
	}
	if opt.YLabel != "" {
		DrawText(out, 4, area.Min.Y-lineHeight-2, opt.YLabel, black, 1)
	}
	if opt.XLabel != "" {
		w, _ := TextSize(opt.XLabel, 1)
		DrawText(out, area.Min.X+(area.Dx()-w)/2, opt.Height-lineHeight-2, opt.XLabel, black, 1)
	}
	drawLegend(out, area, series)
	return out
}

// drawLegend lists the named series in the top-right corner of area: a
// short line in the series' colour, then its name.
func drawLegend(dst *image.RGBA, area image.Rectangle, series []Series) {
	w, n := 0, 0
	for _, s := range series {
		if s.Name != "" {
			tw, _ := TextSize(s.Name, 1)
			w, n = max(w, tw), n+1
		}
	}
	if n == 0 {
		return
	}
	const sample = 14
	box := image.Rect(0, 0, sample+w+12, n*lineHeight+6)
	box = box.Add(image.Pt(area.Max.X-box.Dx()-4, area.Min.Y+4))
	fillRect(dst, box, white)
	drawBox(dst, box, frameGrey, 1)
	y := box.Min.Y + 4
	for k, s := range series {
		if s.Name == "" {
			continue
		}
		c := Colour(k)
		fillRect(dst, image.Rect(box.Min.X+4, y+3, box.Min.X+4+sample, y+5), c)
		DrawText(dst, box.Min.X+8+sample, y, s.Name, black, 1)
		y += lineHeight
	}
}

// drawLine draws a line two pixels wide from (x0, y0) to (x1, y1) by
// stepping along its longer axis.
func drawLine(dst *image.RGBA, x0, y0, x1, y1 float64, c color.RGBA) {
	steps := int(math.Ceil(math.Max(math.Abs(x1-x0), math.Abs(y1-y0))))
	for i := 0; i <= steps; i++ {
		t := 0.0
		if steps > 0 {
			t = float64(i) / float64(steps)
		}
		x := int(math.Round(x0 + t*(x1-x0)))
		y := int(math.Round(y0 + t*(y1-y0)))
		fillRect(dst, image.Rect(x, y, x+2, y+2).Intersect(dst.Bounds()), c)
	}
}

// widen gives an empty range some room.
func widen(lo, hi float64) (float64, float64) {
	if hi > lo {
		return lo, hi
	}
	d := math.Max(math.Abs(lo)*0.1, 0.5)
	return lo - d, hi + d
}

type tick struct {
	v     float64 // position on the axis (log10 of the value on a log axis)
	label string
}

// linearTicks returns about five ticks at multiples of 1, 2 or 5 times a
// power of ten, from the last multiple at or below lo to the first at or
// above hi.
func linearTicks(lo, hi float64) []tick {
	step := niceStep((hi - lo) / 5)
	first := math.Floor(lo/step + 1e-9)
	last := math.Ceil(hi/step - 1e-9)
	var ts []tick
	for i := first; i <= last; i++ {
		v := i * step
		ts = append(ts, tick{v, formatTick(v, step)})
	}
	return ts
}

// logTicks returns ticks for a log axis spanning log10 values [lo, hi]: the
// powers of ten (every second or fifth one if there are many), or, within a
// decade or so, linear ticks of the values themselves.
func logTicks(lo, hi float64) []tick {
	if hi-lo < 1.5 {
		var ts []tick
		for _, t := range linearTicks(math.Pow(10, lo), math.Pow(10, hi)) {
			if t.v > 0 {
				ts = append(ts, tick{math.Log10(t.v), t.label})
			}
		}
		if len(ts) >= 2 {
			return ts
		}
	}
	e0, e1 := math.Floor(lo), math.Ceil(hi)
	every := math.Max(1, niceStep((e1-e0)/6))
	e0 = math.Floor(e0/every) * every
	var ts []tick
	for e := e0; e <= e1+1e-9; e += every {
		ts = append(ts, tick{e, formatTick(math.Pow(10, e), math.Pow(10, e))})
	}
	if len(ts) < 2 {
		ts = append(ts, tick{e0 + every, formatTick(math.Pow(10, e0+every), math.Pow(10, e0+every))})
	}
	return ts
}

// niceStep rounds a raw step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if !(raw > 0) || math.IsInf(raw, 0) {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	switch f := raw / mag; {
	case f <= 1:
		return mag
	case f <= 2:
		return 2 * mag
	case f <= 5:
		return 5 * mag
	}
	return 10 * mag
}

// formatTick writes v with as many decimals as the tick step needs, so that
// 0.1+0.2 prints as 0.3; very large or small numbers use exponents.
func formatTick(v, step float64) string {
	if math.Abs(v) < step*1e-9 {
		return "0"
	}
	if a := math.Abs(v); a >= 1e6 || a < 1e-4 {
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
	dec := max(0, int(math.Ceil(-math.Log10(step)-1e-9)))
	s := strconv.FormatFloat(v, 'f', dec, 64)
	if strings.Contains(s, ".") { // 1.0 -> 1, 0.50 -> 0.5
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}
