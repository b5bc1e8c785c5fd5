package ops_test

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// DETR's three losses on two queries: the focal loss of their class logits
// (one object, class 1 of query 0), and the L1 and GIoU losses of the
// matched query's box, predicted as (cx, cy, w, h) and compared in (x1, y1,
// x2, y2) for GIoU; the unmatched query weighs 0. Their sum and its
// gradients with respect to the logits and the boxes (the values
// torchvision's sigmoid_focal_loss, F.l1_loss and generalized_box_iou_loss
// give).
func ExampleSigmoidFocalLoss() {
	g := G.NewGraph()
	mat := func(name string, r, c int, v ...float64) *G.Node {
		return G.NewMatrix(g, tensor.Float64, G.WithShape(r, c), G.WithName(name),
			G.WithValue(tensor.New(tensor.WithShape(r, c), tensor.WithBacking(v))))
	}
	logits := mat("logits", 2, 3, -1, 2, -3, 0.5, -2, -1)
	classes := mat("classes", 2, 3, 0, 1, 0, 0, 0, 0)
	every := mat("every", 2, 3, 1, 1, 1, 1, 1, 1)
	boxes := mat("boxes", 2, 4, 2, 2, 2, 2, 9, 9, 1, 1)           // (cx, cy, w, h)
	targets := mat("targets", 2, 4, 1.5, 1.5, 3, 2.5, 0, 0, 1, 1) // (x1, y1, x2, y2)
	matched := mat("matched", 2, 4, 1, 1, 1, 1, 0, 0, 0, 0)
	rows := G.NewVector(g, tensor.Float64, G.WithShape(2), G.WithName("rows"),
		G.WithValue(tensor.New(tensor.WithShape(2), tensor.WithBacking([]float64{1, 0}))))

	focal := G.Must(ops.SigmoidFocalLoss(logits, classes, every, ops.DefaultFocalAlpha, ops.DefaultFocalGamma))
	xyxy := G.Must(ops.BoxCxCyWHToXYXY(boxes))
	l1 := G.Must(ops.L1Loss(boxes, G.Must(ops.BoxXYXYToCxCyWH(targets)), matched))
	giou := G.Must(ops.GIoULoss(xyxy, targets, rows))
	total := G.Must(ops.SumLosses(focal, l1, giou))
	if _, err := G.Grad(total, logits, boxes); err != nil {
		panic(err)
	}
	var f, l, gi G.Value
	G.Read(focal, &f)
	G.Read(l1, &l)
	G.Read(giou, &gi)
	m := G.NewTapeMachine(g)
	defer m.Close()
	if err := m.RunAll(); err != nil {
		panic(err)
	}
	fmt.Printf("focal %.4f, L1 %.4f, GIoU %.4f, total %.4f\n", f.Data(), l.Data(), gi.Data(), total.Value().Data())
	dl, _ := logits.Grad()
	db, _ := boxes.Grad()
	fmt.Printf("dloss/dlogits: %.4f\n", dl.Data())
	fmt.Printf("dloss/dboxes: %.4f\n", db.Data())
	// Output:
	// focal 0.3189, L1 1.7500, GIoU 0.6250, total 2.6939
	// dloss/dlogits: [0.0394 -0.0012 0.0002 0.3946 0.0037 0.0394]
	// dloss/dboxes: [-1.2969 0.0000 1.0391 1.1875 0.0000 0.0000 0.0000 0.0000]
}
