package model

import "math"

// Box is [x1, y1, x2, y2] in image pixels with an exclusive end, as
// data.Object.Box: width x2-x1, height y2-y1.
type Box = [4]float64

// Area is the box's area, 0 for an empty or inverted box.
func Area(b Box) float64 {
	return max(b[2]-b[0], 0) * max(b[3]-b[1], 0)
}

// IoU is the intersection over union of a and b, 0 when the union is empty.
func IoU(a, b Box) float64 {
	iw := min(a[2], b[2]) - max(a[0], b[0])
	ih := min(a[3], b[3]) - max(a[1], b[1])
	if !(iw > 0 && ih > 0) {
		return 0
	}
	inter := iw * ih
	union := Area(a) + Area(b) - inter
	if !(union > 0) {
		return 0
	}
	return inter / union
}

// BoxCoder encodes a box relative to a reference box as the deltas a
// detector regresses, (dx, dy, dw, dh) = (Wx*(cx-rcx)/rw, Wy*(cy-rcy)/rh,
// Ww*log(w/rw), Wh*log(h/rh)), and decodes them back, as torchvision's
// BoxCoder. The weights scale the deltas to unit-ish variance: (1, 1, 1, 1)
// for the RPN, (10, 10, 5, 5) for the box head.
type BoxCoder struct{ Wx, Wy, Ww, Wh float64 }

var (
	rpnCoder = BoxCoder{1, 1, 1, 1}
	boxCoder = BoxCoder{10, 10, 5, 5}
)

// maxDeltaLog caps decoded log-scale deltas, so that a wild prediction
// cannot overflow exp: a box grows at most 1000/16 times.
var maxDeltaLog = math.Log(1000.0 / 16)

// Encode returns the deltas that take ref to b. Both must have positive
// width and height.
func (c BoxCoder) Encode(b, ref Box) [4]float64 {
	rw, rh := ref[2]-ref[0], ref[3]-ref[1]
	rx, ry := ref[0]+0.5*rw, ref[1]+0.5*rh
	w, h := b[2]-b[0], b[3]-b[1]
	x, y := b[0]+0.5*w, b[1]+0.5*h
	return [4]float64{c.Wx * (x - rx) / rw, c.Wy * (y - ry) / rh, c.Ww * math.Log(w/rw), c.Wh * math.Log(h/rh)}
}

// Decode applies deltas d to ref.
func (c BoxCoder) Decode(d [4]float64, ref Box) Box {
	rw, rh := ref[2]-ref[0], ref[3]-ref[1]
	rx, ry := ref[0]+0.5*rw, ref[1]+0.5*rh
	dw := min(d[2]/c.Ww, maxDeltaLog)
	dh := min(d[3]/c.Wh, maxDeltaLog)
	x, y := d[0]/c.Wx*rw+rx, d[1]/c.Wy*rh+ry
	w, h := math.Exp(dw)*rw, math.Exp(dh)*rh
	return Box{x - 0.5*w, y - 0.5*h, x + 0.5*w, y + 0.5*h}
}

// Clip limits b to a size x size image.
func Clip(b Box, size float64) Box {
	for i := range b {
		b[i] = min(max(b[i], 0), size)
	}
	return b
}

// NMS returns the indices of the boxes greedy non-maximum suppression
// keeps, best score first: a box is dropped when its IoU with a kept,
// better-scored box exceeds thresh. Ties keep the earlier box. At most
// limit boxes are kept (no limit when limit <= 0). A box with a NaN corner
// overlaps nothing (IoU 0).
//
// A box is compared only with the kept boxes near it: boxes are binned by
// their top-left corner into square cells, and a box looks in the cells
// its suppressors' corners can lie in (nmsGrid.reach). The result is that
// of comparing with every kept box (a box is kept when no kept box
// suppresses it, whatever the order of the comparisons), at a cost that
// grows with the boxes rather than their square: the RPN's thousands of
// proposals per level are the longest host step otherwise.
func NMS(boxes []Box, scores []float64, thresh float64, limit int) []int {
	order := rankOrder(scores[:len(boxes)])
	g := newNMSGrid(boxes, thresh)
	var keep []int
	for _, i := range order {
		if limit > 0 && len(keep) == limit {
			break
		}
		b := boxes[i]
		c := g.cells[i]
		if c < 0 {
			keep = append(keep, i) // overlaps nothing, and nothing finds it
			continue
		}
		area := Area(b)
		// The box's own cell first: its likeliest suppressors are there.
		ok := !g.suppressed(int(c), b, area, thresh)
		x0, y0, x1, y1 := g.near(b)
		for y := y0; ok && y <= y1; y++ {
			for x := x0; ok && x <= x1; x++ {
				if cx := y*g.nx + x; cx != int(c) {
					ok = !g.suppressed(cx, b, area, thresh)
				}
			}
		}
		if ok {
			keep = append(keep, i)
			g.slots[g.start[c]+g.fill[c]] = nmsBox{b, area}
			g.fill[c]++
		}
	}
	return keep
}

// rankOrder returns the indices of scores best first, ties in index
// order: a stable sort's order. It sorts the scores' descending rankKey64
// by radix, a byte at a time from the lowest, each pass stable; passes
// over a byte all keys share are skipped.
func rankOrder(scores []float64) []int {
	n := len(scores)
	keys, idx := make([]uint64, n), make([]int, n)
	var counts [8][256]int
	for i, s := range scores {
		keys[i], idx[i] = ^rankKey64(s), i
		for d := range 8 {
			counts[d][byte(keys[i]>>(8*d))]++
		}
	}
	keys2, idx2 := make([]uint64, n), make([]int, n)
	for d := range 8 {
		c := &counts[d]
		if n == 0 || c[byte(keys[0]>>(8*d))] == n {
			continue
		}
		sum := 0
		for b, v := range c {
			c[b] = sum
			sum += v
		}
		for i, key := range keys {
			o := &c[byte(key>>(8*d))]
			keys2[*o], idx2[*o] = key, idx[i]
			*o++
		}
		keys, keys2, idx, idx2 = keys2, keys, idx2, idx
	}
	return idx
}

// rankKey maps scores to integers in cmp.Compare's order: NaN lowest
// (all NaNs equal), then -Inf up to +Inf, -0 equal to +0. Flipping the
// sign bit of a non-negative float and every bit of a negative one makes
// its bits order as its value; the flip is a mask, not a branch on the
// sign, which would be mispredicted half the time on scores of both signs.
func rankKey(s float32) uint32 {
	switch {
	case s != s:
		return 0
	case s == 0:
		s = 0 // -0
	}
	b := math.Float32bits(s)
	return b ^ (uint32(int32(b)>>31) | 1<<31)
}

// rankKey64 is rankKey for float64 scores.
func rankKey64(s float64) uint64 {
	switch {
	case s != s:
		return 0
	case s == 0:
		s = 0 // -0
	}
	b := math.Float64bits(s)
	return b ^ (uint64(int64(b)>>63) | 1<<63)
}

// unplaced reports whether NMS keeps b without comparing it: a box with a
// NaN corner overlaps nothing, and one with an infinite top-left corner
// has no cell.
func unplaced(b Box) bool {
	return math.IsNaN(b[0]+b[1]+b[2]+b[3]) || math.IsInf(b[0]+b[1], 0)
}

// nmsBox is a box NMS kept, with its area.
type nmsBox struct {
	box  Box
	area float64
}

// nmsGrid bins boxes by their top-left corner into square cells, nx by ny
// of them over the boxes' extent, and holds the boxes NMS kept by cell:
// cell c's are slots[start[c]:start[c]+fill[c]], room for every box of
// the cell, so that a cell's kept boxes lie side by side in memory.
type nmsGrid struct {
	thresh float64
	// bound is the reach of every box: (1-thresh) times the largest side
	// of all, a hair more, or the largest side for a thresh outside (0, 1).
	bound       float64
	side        float64 // the cells'
	cx0, cy0    float64 // the first cell's indices, floor(corner/side)
	nx, ny      int
	cells       []int32 // each box's cell, -1 for the boxes unplaced keeps
	start, fill []int32
	slots       []nmsBox
}

// newNMSGrid is the grid of boxes for NMS at thresh. Its cells are as wide
// as the boxes' mean reach, so that a box looks in a few cells around its
// own. It widens them when the boxes would need far more cells than there
// are boxes (a few small boxes far apart): wider cells only bring more
// boxes near each other, so NMS's result is the same, and the grid stays
// small.
func newNMSGrid(boxes []Box, thresh float64) *nmsGrid {
	g := &nmsGrid{thresh: thresh, nx: 1, ny: 1, cells: make([]int32, len(boxes))}
	x0, y0 := math.Inf(1), math.Inf(1)
	x1, y1 := math.Inf(-1), math.Inf(-1)
	placed := 0
	for _, b := range boxes {
		if !unplaced(b) {
			x0, x1 = min(x0, b[0]), max(x1, b[0])
			y0, y1 = min(y0, b[1]), max(y1, b[1])
			g.bound = max(g.bound, b[2]-b[0], b[3]-b[1])
			placed++
		}
	}
	if thresh > 0 && thresh < 1 {
		// A hair more than (1-thresh) of it, for the rounding of IoU.
		g.bound *= (1 - thresh) * (1 + 1e-9)
	}
	g.side = 0
	for _, b := range boxes {
		if !unplaced(b) {
			rx, ry := g.reach(b)
			g.side += (rx + ry) / float64(2*placed)
		}
	}
	limit := float64(4*len(boxes) + 64)
	for placed > 0 && g.side > 0 && !math.IsInf(g.side, 1) {
		g.cx0, g.cy0 = math.Floor(x0/g.side), math.Floor(y0/g.side)
		nx, ny := math.Floor(x1/g.side)-g.cx0+1, math.Floor(y1/g.side)-g.cy0+1
		if cells := nx * ny; cells <= limit {
			g.nx, g.ny = int(nx), int(ny)
			break
		} else if !(cells < math.Inf(1)) {
			break // corners/side overflow: one cell
		}
		g.side *= math.Sqrt(nx*ny/limit) * 1.01
	}
	g.start = make([]int32, g.nx*g.ny+1)
	g.fill = make([]int32, g.nx*g.ny)
	for i, b := range boxes {
		switch {
		case unplaced(b):
			g.cells[i] = -1
			continue
		case g.nx*g.ny == 1:
			g.cells[i] = 0
		default:
			x, y := int(math.Floor(b[0]/g.side)-g.cx0), int(math.Floor(b[1]/g.side)-g.cy0)
			g.cells[i] = int32(y*g.nx + x)
		}
		g.start[g.cells[i]+1]++
	}
	for c := range g.nx * g.ny {
		g.start[c+1] += g.start[c]
	}
	g.slots = make([]nmsBox, g.start[g.nx*g.ny])
	return g
}

// reach bounds how far from b's top-left corner, in x and in y, the corner
// of a box that suppresses b lies. Boxes of IoU above thresh overlap by
// more than thresh of either's width, so their widths are within a factor
// thresh of each other and their left edges less than (1-thresh) times
// the wider width apart: less than (1-thresh)/thresh times b's width, and
// less than bound; likewise heights and top edges. A hair more covers the
// rounding of the widths and of the corners' differences, which grows
// with the corners' distance from the origin. An inverted box, which
// nothing suppresses, reaches nowhere but its own cell.
func (g *nmsGrid) reach(b Box) (rx, ry float64) {
	rx, ry = g.bound, g.bound
	if t := g.thresh; t > 0 && t < 1 {
		rx = min(rx, (1-t)/t*(b[2]-b[0])*(1+1e-9))
		ry = min(ry, (1-t)/t*(b[3]-b[1])*(1+1e-9))
	}
	rx = max(rx, 0) + 1e-12*(math.Abs(b[0])+math.Abs(b[2]))
	ry = max(ry, 0) + 1e-12*(math.Abs(b[1])+math.Abs(b[3]))
	return rx, ry
}

// near returns the cells, [x0, x1] by [y0, y1], within b's reach.
func (g *nmsGrid) near(b Box) (x0, y0, x1, y1 int) {
	if g.nx*g.ny == 1 {
		return 0, 0, 0, 0
	}
	rx, ry := g.reach(b)
	// The floors are monotonic, as the cells' are: a corner within reach
	// is in a cell of the range. Clamped as floats: reaches can be
	// infinite.
	at := func(v, c0 float64, n int) int {
		return int(min(max(math.Floor(v/g.side)-c0, 0), float64(n-1)))
	}
	return at(b[0]-rx, g.cx0, g.nx), at(b[1]-ry, g.cy0, g.ny), at(b[0]+rx, g.cx0, g.nx), at(b[1]+ry, g.cy0, g.ny)
}

// suppressed reports whether a box of cell c's kept boxes suppresses b,
// of the given area: IoU's arithmetic (IoU(k, b) > thresh), for boxes
// without NaN.
func (g *nmsGrid) suppressed(c int, b Box, area, thresh float64) bool {
	kept := g.slots[g.start[c] : g.start[c]+g.fill[c]]
	for i := range kept {
		k := &kept[i]
		iw := min(b[2], k.box[2]) - max(b[0], k.box[0])
		ih := min(b[3], k.box[3]) - max(b[1], k.box[1])
		if !(iw > 0 && ih > 0) {
			continue
		}
		inter := iw * ih
		if union := area + k.area - inter; union > 0 && inter/union > thresh {
			return true
		}
	}
	return false
}
