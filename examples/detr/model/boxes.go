package model

import (
	"math"
)

// Box is an axis-aligned box. Targets and predictions are normalised
// (cx, cy, w, h), each in [0, 1] of the image's side; Detection boxes are
// (x1, y1, x2, y2) in pixels.
type Box [4]float64

// XYXY converts a (cx, cy, w, h) box to (x1, y1, x2, y2).
func (b Box) XYXY() Box {
	return Box{b[0] - 0.5*b[2], b[1] - 0.5*b[3], b[0] + 0.5*b[2], b[1] + 0.5*b[3]}
}

// GIoU is the generalized IoU of two (x1, y1, x2, y2) boxes, as the
// reference's generalized_box_iou (no eps: boxes must have positive
// area).
func GIoU(a, b Box) float64 {
	// The builtin min and max, not math's: the matching calls this for
	// every query and object, and they compile to instructions.
	areaA := (a[2] - a[0]) * (a[3] - a[1])
	areaB := (b[2] - b[0]) * (b[3] - b[1])
	iw := max(0, min(a[2], b[2])-max(a[0], b[0]))
	ih := max(0, min(a[3], b[3])-max(a[1], b[1]))
	inter := iw * ih
	union := areaA + areaB - inter
	ew := max(0, max(a[2], b[2])-min(a[0], b[0]))
	eh := max(0, max(a[3], b[3])-min(a[1], b[1]))
	enclosing := ew * eh
	return inter/union - (enclosing-union)/enclosing
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// inverseSigmoid is the reference's inverse_sigmoid (eps 1e-5), the host
// twin of ops.InverseSigmoid.
func inverseSigmoid(x float64) float64 {
	const eps = 1e-5
	x = math.Min(math.Max(x, 0), 1)
	return math.Log(math.Max(x, eps) / math.Max(1-x, eps))
}

// RefineBox is the box a decoder layer predicts from its box head's output
// delta and its reference, as the graph computes it: with a reference of
// two values (a point, the first layer's or every layer's without
// BoxRefine)
//
//	box = sigmoid(delta + (inverse_sigmoid(rx), inverse_sigmoid(ry), 0, 0))
//
// and with four (the previous layer's box, under BoxRefine)
//
//	box = sigmoid(delta + inverse_sigmoid(ref))
//
// It is the host twin of the graph's refinement, for tests and readers.
func RefineBox(delta Box, ref []float64) Box {
	var out Box
	for i := range out {
		v := delta[i]
		if i < len(ref) {
			v += inverseSigmoid(ref[i])
		}
		out[i] = sigmoid(v)
	}
	return out
}
