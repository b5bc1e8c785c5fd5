package data

import (
	"fmt"
	"math"
	"slices"
)

// RasterizePolygon rasterises a COCO polygon [x1, y1, x2, y2, ...] (pixel
// coordinates, pixel x covering [x, x+1)) into a w x h mask.
//
// A pixel is set when its centre (x+0.5, y+0.5) is inside the polygon by the
// even-odd rule. A centre exactly on an edge counts as inside on the left and
// top edges of the filled span and outside on the right and bottom ones, so
// polygons that share an edge never both claim a pixel and an axis-aligned
// rectangle [x0, x1] x [y0, y1] with integer corners sets exactly the pixels
// x0 <= x < x1, y0 <= y < y1.
//
// This is the rule pycocotools (maskApi.c rleFrPoly) implements, except that
// pycocotools first snaps vertices to a 1/5-pixel grid and walks the edges on
// that grid, so it can disagree on pixels whose centre lies within about 0.2
// px of an edge. COCO ground truth polygons are drawn by hand at far coarser
// precision than that.
func RasterizePolygon(poly []float64, w, h int) (*Mask, error) {
	if len(poly)%2 != 0 || len(poly) < 6 {
		return nil, fmt.Errorf("data: polygon needs at least 3 points as x,y pairs, got %d numbers", len(poly))
	}
	for i, v := range poly {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("data: polygon coordinate %d is %v", i, v)
		}
	}
	if w < 0 || h < 0 {
		return nil, fmt.Errorf("data: mask size %dx%d is negative", w, h)
	}
	m := NewMask(w, h)
	fillPolygon(m, poly)
	return m, nil
}

// fillPolygon sets the pixels of m whose centre is inside poly (even-odd),
// leaving the others as they are, so that calling it for several polygons
// makes their union. Scanline: each row's centre line crosses the edges at
// sorted x positions, and the pixels whose centres lie in [x0, x1) of each
// (x0, x1) pair of crossings are inside.
func fillPolygon(m *Mask, poly []float64) {
	n := len(poly) / 2
	var xs []float64
	for y := range m.H {
		yc := float64(y) + 0.5
		xs = xs[:0]
		for i := range n {
			j := (i + 1) % n
			x0, y0 := poly[2*i], poly[2*i+1]
			x1, y1 := poly[2*j], poly[2*j+1]
			// Half-open in y: an edge counts when its lower end is at or
			// below the centre line and its upper end above it, so a vertex
			// on the line is crossed once, not twice or never, and
			// horizontal edges are never crossed.
			if (y0 <= yc) == (y1 <= yc) {
				continue
			}
			xs = append(xs, x0+(yc-y0)*(x1-x0)/(y1-y0))
		}
		slices.Sort(xs)
		row := m.Bits[y*m.W : (y+1)*m.W]
		for k := 0; k+1 < len(xs); k += 2 {
			// Centres x+0.5 in [xs[k], xs[k+1]).
			lo := max(0, int(math.Ceil(xs[k]-0.5)))
			hi := min(m.W, int(math.Ceil(xs[k+1]-0.5)))
			for x := lo; x < hi; x++ {
				row[x] = true
			}
		}
	}
}
