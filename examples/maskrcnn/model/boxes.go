package model

import (
	"cmp"
	"math"
	"slices"
)

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
// limit boxes are kept (no limit when limit <= 0).
func NMS(boxes []Box, scores []float64, thresh float64, limit int) []int {
	order := make([]int, len(boxes))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(scores[b], scores[a]) })
	// The kept boxes' corners and areas side by side, which the inner loop
	// reads in order: IoU's arithmetic without its calls. A box with a NaN
	// corner overlaps nothing (IoU 0): it is kept as an empty box at
	// infinity, and skips the loop.
	var keep []int
	var kx1, ky1, kx2, ky2, karea []float64
	inf := math.Inf(1)
	for _, i := range order {
		if limit > 0 && len(keep) == limit {
			break
		}
		b := boxes[i]
		if math.IsNaN(b[0] + b[1] + b[2] + b[3]) {
			keep = append(keep, i)
			kx1, ky1, kx2, ky2 = append(kx1, inf), append(ky1, inf), append(kx2, -inf), append(ky2, -inf)
			karea = append(karea, 0)
			continue
		}
		area := Area(b)
		ok := true
		for j := range keep {
			// min and max, for boxes without NaN.
			x1, y1, x2, y2 := b[0], b[1], b[2], b[3]
			if kx1[j] > x1 {
				x1 = kx1[j]
			}
			if kx2[j] < x2 {
				x2 = kx2[j]
			}
			iw := x2 - x1
			if !(iw > 0) {
				continue
			}
			if ky1[j] > y1 {
				y1 = ky1[j]
			}
			if ky2[j] < y2 {
				y2 = ky2[j]
			}
			ih := y2 - y1
			if !(ih > 0) {
				continue
			}
			inter := iw * ih
			union := area + karea[j] - inter
			if union > 0 && inter/union > thresh {
				ok = false
				break
			}
		}
		if ok {
			keep = append(keep, i)
			kx1, ky1, kx2, ky2 = append(kx1, b[0]), append(ky1, b[1]), append(kx2, b[2]), append(ky2, b[3])
			karea = append(karea, area)
		}
	}
	return keep
}
