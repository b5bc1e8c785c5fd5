package history

import (
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"gonum.org/v1/plot/plotter"

	"github.com/stheno-ml/stheno/examples/internal/viz"
)

// lossNames and apNames are Mask R-CNN's losses and precisions.
var (
	lossNames = []string{"total", "rpn_obj", "rpn_box", "cls", "box", "mask"}
	apNames   = []string{"box AP", "box AP50", "mask AP", "mask AP50"}
)

// fakeRun is a run of iters iterations logged every 20 and evaluated every
// 200, with Mask R-CNN's losses and precisions: losses falling from about 3
// towards 0.05, AP rising.
func fakeRun(iters int) (losses, aps Series) {
	losses.Names, aps.Names = lossNames, apNames
	for it := 20; it <= iters; it += 20 {
		f := math.Exp(-float64(it) / 400)
		losses.Add(it, 3*f+0.3, 0.6*f+0.02, 0.3*f+0.03, 0.9*f+0.1, 0.5*f+0.05, 0.7*f+0.1)
		if it%200 == 0 {
			g := 1 - f
			aps.Add(it, 0.7*g, 0.95*g, 0.65*g, 0.9*g)
		}
	}
	return losses, aps
}

func TestCurves(t *testing.T) {
	nan := math.NaN()
	all := func(n int) []bool { return slices.Repeat([]bool{true}, n) }
	nLoss := len(lossNames)

	undefinedLosses, undefined := fakeRun(1000)
	undefined.Values[1][0] = nan // a gap in box AP
	for i := range undefined.Values {
		undefined.Values[i][3] = nan // no mask AP50 at all
	}
	undefined.Values[0][1] = nan

	odd, oddAPs := fakeRun(1000)
	odd.Values[3][4], odd.Values[4][4] = 0, -1
	odd.Values[5][5] = nan
	odd.Values[6][3] = math.Inf(1)
	for i := range odd.Values {
		odd.Values[i][2] = 0 // never drawable on a log axis
	}
	odd.Values[7] = odd.Values[7][:5] // a row without its last loss

	noEvals, _ := fakeRun(1000)
	full, fullAPs := fakeRun(1000)

	one := Series{Names: lossNames}
	one.Add(20, 1, 0.2, 0.2, 0.2, 0.2, 0.2)
	oneAP := Series{Names: apNames}
	oneAP.Add(20, 0.1, 0.3, 0.5, 0.7)

	// A box detector's: three losses, box AP and AP50.
	boxLosses, boxAPs := Series{Names: []string{"total", "class", "giou"}}, Series{Names: []string{"box AP", "box AP50"}}
	for i, row := range full.Values {
		boxLosses.Add(full.Iters[i], row[0], row[3], row[4])
	}
	for i, row := range fullAPs.Values {
		boxAPs.Add(fullAPs.Iters[i], row[0], row[1])
	}

	for _, tc := range []struct {
		name        string
		losses, aps Series
		loss, ap    []bool // which series should show in the data areas
	}{
		{"full", full, fullAPs, all(nLoss), all(4)},
		{"undefined AP", undefinedLosses, undefined, all(nLoss), []bool{true, true, true, false}},
		{"losses <= 0, NaN, Inf", odd, oddAPs, []bool{true, true, false, true, true, true}, all(4)},
		{"no evaluations", noEvals, Series{Names: apNames}, all(nLoss), make([]bool, 4)},
		{"empty", Series{Names: lossNames}, Series{Names: apNames}, make([]bool, nLoss), make([]bool, 4)},
		// A single loss point is no line; a single evaluation is a dot.
		{"one point", one, oneAP, make([]bool, nLoss), all(4)},
		{"box only", boxLosses, boxAPs, all(3), all(2)},
	} {
		var img *image.RGBA
		var lay curvesLayout
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("%s: panic: %v", tc.name, r)
				}
			}()
			img, lay = drawCurves(tc.losses, tc.aps)
		}()
		if img.Bounds() != image.Rect(0, 0, curvesWidth, curvesHeight) {
			t.Fatalf("%s: bounds %v", tc.name, img.Bounds())
		}
		for p, want := range [][]bool{tc.loss, tc.ap} {
			data, legend := lay.data[p], lay.legend[p]
			if data.Dx() < 300 || data.Dy() < 200 {
				t.Errorf("%s: panel %d: data area %v is small", tc.name, p, data)
			}
			// The legends sit beside the data, inside the picture.
			if !legend.In(img.Bounds()) || legend.Overlaps(lay.data[0]) || legend.Overlaps(lay.data[1]) {
				t.Errorf("%s: panel %d: legend %v overlaps the data areas %v or leaves the picture", tc.name, p, legend, lay.data)
			}
			for k, shown := range want {
				c := viz.Colour(k)
				if n := count(img, legend, c); n < 5 {
					t.Errorf("%s: panel %d: series %d has %d pixels of its colour %v in the legend", tc.name, p, k, n, c)
				}
				n := count(img, data, c)
				if shown && n < 5 { // a dot of one evaluation has about 10
					t.Errorf("%s: panel %d: series %d has %d pixels of its colour %v in the data area", tc.name, p, k, n, c)
				}
				if !shown && n != 0 {
					t.Errorf("%s: panel %d: series %d, which has nothing to draw, has %d pixels in the data area", tc.name, p, k, n)
				}
			}
			// Nothing dark (text: legend, labels, ticks) inside the data
			// area, so no text hides a line.
			inner := data.Inset(2)
			for y := inner.Min.Y; y < inner.Max.Y; y++ {
				for x := inner.Min.X; x < inner.Max.X; x++ {
					if c := img.RGBAAt(x, y); c.R < 64 && c.G < 64 && c.B < 64 {
						t.Fatalf("%s: panel %d: dark pixel %v at (%d,%d) inside the data area %v", tc.name, p, c, x, y, data)
					}
				}
			}
		}
		// Series colours appear only in the data areas (with room for the
		// dots' radius) and the legends.
		var allowed []image.Rectangle
		for p := range 2 {
			allowed = append(allowed, lay.data[p].Inset(-5), lay.legend[p])
		}
		for y := range curvesHeight {
			for x := range curvesWidth {
				c := img.RGBAAt(x, y)
				if k := slices.IndexFunc(palette(nLoss), func(p color.RGBA) bool { return p == c }); k >= 0 &&
					!slices.ContainsFunc(allowed, func(r image.Rectangle) bool { return image.Pt(x, y).In(r) }) {
					t.Fatalf("%s: colour of series %d at (%d,%d), outside the data areas and legends %v", tc.name, k, x, y, allowed)
				}
			}
		}
	}
}

func palette(n int) []color.RGBA {
	var p []color.RGBA
	for k := range n {
		p = append(p, viz.Colour(k))
	}
	return p
}

// count is the number of pixels of colour c in r.
func count(img *image.RGBA, r image.Rectangle, c color.RGBA) int {
	n := 0
	r = r.Intersect(img.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			if img.RGBAAt(x, y) == c {
				n++
			}
		}
	}
	return n
}

// curves.png as train writes it: a PNG of the intended size.
func TestCurvesPNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "curves.png")
	if err := viz.SavePNG(path, Curves(fakeRun(3200))); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if got := img.Bounds().Size(); got != image.Pt(curvesWidth, curvesHeight) {
		t.Errorf("curves.png is %v, want %dx%d", got, curvesWidth, curvesHeight)
	}
	if out := os.Getenv("CURVES_PNG"); out != "" { // to look at it
		if err := viz.SavePNG(out, img); err != nil {
			t.Error(err)
		}
	}
}

func TestDecadeTicks(t *testing.T) {
	for _, tc := range []struct {
		e0, e1 int
		labels []string
	}{
		{-1, 0, []string{"0.1", "1"}},
		{-3, 1, []string{"0.001", "0.01", "0.1", "1", "10"}},
		{0, 2, []string{"1", "10", "100"}},
	} {
		ts := decadeTicks(tc.e0, tc.e1)
		var labels []string
		for i, tk := range ts {
			if tk.Label != "" {
				labels = append(labels, tk.Label)
			}
			if i > 0 && !(tk.Value > ts[i-1].Value) {
				t.Errorf("decadeTicks(%d, %d): tick %d at %v after %v", tc.e0, tc.e1, i, tk.Value, ts[i-1].Value)
			}
		}
		if !slices.Equal(labels, tc.labels) {
			t.Errorf("decadeTicks(%d, %d) labels %v, want %v", tc.e0, tc.e1, labels, tc.labels)
		}
		if want := 9*(tc.e1-tc.e0) + 1; len(ts) != want {
			t.Errorf("decadeTicks(%d, %d): %d ticks, want %d", tc.e0, tc.e1, len(ts), want)
		}
		if lo, hi := ts[0].Value, ts[len(ts)-1].Value; lo != math.Pow10(tc.e0) || hi != math.Pow10(tc.e1) {
			t.Errorf("decadeTicks(%d, %d) spans [%v, %v]", tc.e0, tc.e1, lo, hi)
		}
	}
}

func TestSegments(t *testing.T) {
	nan := math.NaN()
	positive := func(v float64) bool { return v > 0 }
	for _, tc := range []struct {
		y    []float64
		want string
	}{
		{nil, "[]"},
		{[]float64{1, 2, 3}, "[[0 1 2]]"},
		{[]float64{1, nan, 3, 4}, "[[0] [2 3]]"},
		{[]float64{0, -1, nan}, "[]"},
		{[]float64{nan, 2, 0, 0, 5}, "[[1] [4]]"},
	} {
		x := make([]float64, len(tc.y))
		for i := range x {
			x[i] = float64(i)
		}
		if got := xsOf(segments(x, tc.y, positive)); got != tc.want {
			t.Errorf("segments of %v = %s, want %s", tc.y, got, tc.want)
		}
	}
}

// xsOf writes the x coordinates of segments as "[[0 1] [3]]".
func xsOf(segs []plotter.XYs) string {
	s := "["
	for i, seg := range segs {
		if i > 0 {
			s += " "
		}
		s += "["
		for j, p := range seg {
			if j > 0 {
				s += " "
			}
			s += strconv.FormatFloat(p.X, 'g', -1, 64)
		}
		s += "]"
	}
	return s + "]"
}
