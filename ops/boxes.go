package ops

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels"
)

// BoxCxCyWHToXYXY converts boxes from (cx, cy, w, h) to (x1, y1, x2, y2),
// as torchvision's box_convert(boxes, "cxcywh", "xyxy"):
//
//	x1 = cx - 0.5*w, y1 = cy - 0.5*h, x2 = cx + 0.5*w, y2 = cy + 0.5*h
//
// boxes has any rank from 1 and a last dimension of 4; the output has its
// shape. Differentiable (a linear map: its backward is the transposed map,
// and that one's backward the conversion again, so derivatives of any
// order exist). DETR predicts (cx, cy, w, h) and takes its GIoULoss on
// this conversion.
func BoxCxCyWHToXYXY(boxes *G.Node) (*G.Node, error) {
	return boxConvert("BoxCxCyWHToXYXY", boxes, kernels.BoxCxCyWHToXYXY)
}

// BoxXYXYToCxCyWH converts boxes from (x1, y1, x2, y2) to (cx, cy, w, h),
// as torchvision's box_convert(boxes, "xyxy", "cxcywh"):
//
//	cx = (x1 + x2)/2, cy = (y1 + y2)/2, w = x2 - x1, h = y2 - y1
//
// Shapes and gradients as BoxCxCyWHToXYXY's.
func BoxXYXYToCxCyWH(boxes *G.Node) (*G.Node, error) {
	return boxConvert("BoxXYXYToCxCyWH", boxes, kernels.BoxXYXYToCxCyWH)
}

func boxConvert(op string, boxes *G.Node, mode kernels.BoxMode) (*G.Node, error) {
	if boxes == nil {
		return nil, fmt.Errorf("ops: %s: boxes is nil", op)
	}
	bs := boxes.Shape()
	if bs.Dims() < 1 || bs[bs.Dims()-1] != 4 {
		return nil, fmt.Errorf("ops: %s: boxes must have shape [... 4], got %v", op, bs)
	}
	if err := positiveSizes(op, "boxes", bs); err != nil {
		return nil, err
	}
	dt, err := floatDtype(op, "boxes", boxes)
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(boxOp(boxShape{mode: mode, shape: bs.Clone(), dt: dt}), boxes)
}

// boxShape is one of the box maps (kernels.BoxMode) on boxes of a shape.
type boxShape struct {
	mode  kernels.BoxMode
	shape tensor.Shape
	dt    tensor.Dtype
}

// name names the map in errors: the public op's name, or its backward's.
func (s boxShape) name() string {
	return [...]string{
		kernels.BoxCxCyWHToXYXY:     "BoxCxCyWHToXYXY",
		kernels.BoxCxCyWHToXYXYGrad: "BoxCxCyWHToXYXY backward",
		kernels.BoxXYXYToCxCyWH:     "BoxXYXYToCxCyWH",
		kernels.BoxXYXYToCxCyWHGrad: "BoxXYXYToCxCyWH backward",
	}[s.mode]
}

// transposed is the map's transpose: its backward.
func (s boxShape) transposed() boxShape {
	t := s
	t.mode = s.mode ^ 1 // the modes pair up: a conversion, then its backward
	return t
}

func (s boxShape) String() string { return fmt.Sprintf("boxes=%v,%v", s.shape, s.dt) }

// boxOp applies the map: boxes -> boxes.
func boxOp(s boxShape) *specOp {
	return newOp(&opSpec{
		name: s.name(), config: s.String(),
		inputs: []argSpec{{name: "boxes", shape: s.shape}}, out: s.shape, dtype: s.dt,
		cpu:     floatTwin(s, boxForward[float32], boxForward[float64]),
		device:  s.device,
		diffWRT: []bool{true},
		grad: func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			d, err := G.ApplyOp(boxOp(s.transposed()), grad)
			if err != nil {
				return nil, fmt.Errorf("ops: %s backward: %w", s.name(), err)
			}
			return G.Nodes{d}, nil
		},
	})
}

func boxForward[T kernels.Float](s boxShape, in [][]T, out []T) error {
	kernels.BoxConvert(s.mode, in[0], out)
	return nil
}
