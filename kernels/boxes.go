package kernels

// BoxMode is one of losses.cu's box conversions: a conversion between
// (cx, cy, w, h) and (x1, y1, x2, y2) boxes, as torchvision's box_convert,
// or the backward of one, its transposed linear map.
type BoxMode int

const (
	BoxCxCyWHToXYXY     BoxMode = iota // (cx, cy, w, h) -> (x1, y1, x2, y2)
	BoxCxCyWHToXYXYGrad                // its backward: (dx1, dy1, dx2, dy2) -> (dcx, dcy, dw, dh)
	BoxXYXYToCxCyWH                    // (x1, y1, x2, y2) -> (cx, cy, w, h)
	BoxXYXYToCxCyWHGrad                // its backward: (dcx, dcy, dw, dh) -> (dx1, dy1, dx2, dy2)
)

// BoxConvert writes out, boxes of 4 numbers, from in by mode, box by box
// as losses.cu's box kernels (and torchvision's arithmetic: cx - 0.5*w,
// (x1 + x2)/2).
func BoxConvert[T Float](mode BoxMode, in, out []T) {
	for i := 0; i+4 <= len(in); i += 4 {
		a, b, c, d := in[i], in[i+1], in[i+2], in[i+3]
		o := out[i : i+4]
		switch mode {
		case BoxCxCyWHToXYXY:
			o[0], o[1], o[2], o[3] = a-0.5*c, b-0.5*d, a+0.5*c, b+0.5*d
		case BoxCxCyWHToXYXYGrad:
			o[0], o[1], o[2], o[3] = a+c, b+d, 0.5*(c-a), 0.5*(d-b)
		case BoxXYXYToCxCyWH:
			o[0], o[1], o[2], o[3] = (a+c)/2, (b+d)/2, c-a, d-b
		case BoxXYXYToCxCyWHGrad:
			o[0], o[1], o[2], o[3] = a/2-c, b/2-d, a/2+c, b/2+d
		}
	}
}
