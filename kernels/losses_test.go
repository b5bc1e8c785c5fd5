package kernels

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// Each box map's backward is its transpose: <F(x), y> = <x, F^T(y)> for
// random boxes x and gradients y, in float64 (the maps only halve, add and
// subtract).
func TestBoxConvertBackwardIsTranspose(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 10))
	const n = 50
	x, y := make([]float64, 4*n), make([]float64, 4*n)
	for i := range x {
		x[i], y[i] = rng.Float64()*8-4, rng.Float64()*2-1
	}
	dot := func(a, b []float64) (s float64) {
		for i := range a {
			s += a[i] * b[i]
		}
		return s
	}
	for _, m := range []BoxMode{BoxCxCyWHToXYXY, BoxXYXYToCxCyWH} {
		fx, fty := make([]float64, 4*n), make([]float64, 4*n)
		BoxConvert(m, x, fx)
		BoxConvert(m+1, y, fty)
		if a, b := dot(fx, y), dot(x, fty); math.Abs(a-b) > 1e-12*math.Abs(a) {
			t.Errorf("mode %d: <F x, y> = %v, <x, F^T y> = %v", m, a, b)
		}
	}
	// And the two conversions undo each other.
	xyxy, back := make([]float64, 4*n), make([]float64, 4*n)
	BoxConvert(BoxCxCyWHToXYXY, x, xyxy)
	BoxConvert(BoxXYXYToCxCyWH, xyxy, back)
	for i := range x {
		if math.Abs(back[i]-x[i]) > 1e-14 {
			t.Fatalf("element %d: %v back as %v", i, x[i], back[i])
		}
	}
}

// GIoU of a box with itself is 1 (loss 0 up to eps), of overlapping boxes
// the ratio of areas; the gradient of apart boxes (the enclosing term
// alone) matches central differences.
func TestGIoUHandValues(t *testing.T) {
	a := []float64{0, 0, 2, 2}
	if g := giouOf(a, a); math.Abs(g.loss) > 1e-7 {
		t.Errorf("GIoU loss of a box with itself: %v", g.loss)
	}
	// [0 0 2 2] against [1 1 3 3]: inter 1, union 7, enclosing 9.
	b := []float64{1, 1, 3, 3}
	want := 1 - (1/(7+giouEps) - 2/(9+giouEps))
	if g := giouOf(a, b); math.Abs(g.loss-want) > 1e-15 {
		t.Errorf("loss %v, want %v", g.loss, want)
	}
	// Apart boxes: the IoU term is 0 and the gradient is the enclosing
	// term's alone: loss = 1 + (C - U)/C with C the enclosing area.
	c := []float64{3, 0, 4, 1}
	d := []float64{0, 0, 1, 1}
	dx := make([]float64, 4)
	giouGrad(c, d, 1, dx)
	h := 1e-7
	for k := range 4 {
		up, down := append([]float64(nil), c...), append([]float64(nil), c...)
		up[k] += h
		down[k] -= h
		fd := (giouOf(up, d).loss - giouOf(down, d).loss) / (2 * h)
		if math.Abs(fd-dx[k]) > 1e-6 {
			t.Errorf("apart boxes: d/dc[%d] = %v, differences %v", k, dx[k], fd)
		}
	}
}

// A bad class label and a NaN weight are errors of the host twins.
func TestLossTwinErrors(t *testing.T) {
	p := LossParams{Kind: LossCE, N: 2, C: 3}
	x := []float32{1, 2, 3, 4, 5, 6}
	if _, err := LossForward(p, x, []float32{0, 3}, []float32{1, 0}); err == nil || !strings.Contains(err.Error(), "row 1: label 3") {
		t.Errorf("bad label: %v", err)
	}
	dx := make([]float32, 6)
	if err := LossBackward(p, x, []float32{0, 1.5}, []float32{1, 1}, 1, dx); err == nil || !strings.Contains(err.Error(), "row 1: label 1.5") {
		t.Errorf("fractional label: %v", err)
	}
	e := LossParams{Kind: LossL1, N: 2}
	if _, err := LossForward(e, []float64{1, 2}, []float64{0, 0}, []float64{math.NaN(), 1}); err == nil || !strings.Contains(err.Error(), "weight 0 is NaN") {
		t.Errorf("NaN weight: %v", err)
	}
}
