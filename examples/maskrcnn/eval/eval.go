package eval

import "github.com/stheno-ml/stheno/examples/maskrcnn/data"

// Detection is one predicted instance.
type Detection struct {
	// ImageID is the data.Image's ID.
	ImageID int
	// Class indexes the dataset's Classes.
	Class int
	Score float64
	// Box is [x1, y1, x2, y2] in pixels, exclusive end (as data.Object.Box).
	Box [4]float64
	// Mask is image-sized; only Evaluate with useMasks reads it.
	Mask *data.Mask
}

// Metrics are COCO's headline numbers, in [0, 1].
type Metrics struct {
	// AP averages precision over IoU thresholds 0.50:0.05:0.95 and the
	// classes that have ground truth; AP50 and AP75 are at one threshold.
	AP, AP50, AP75 float64
	// PerClassAP is AP@[.5:.95] of each class; -1 for a class without
	// ground truth (as pycocotools).
	PerClassAP []float64
}

// IoU is the intersection over union of two boxes [x1, y1, x2, y2]; 0 when
// the union is empty.
func IoU(a, b [4]float64) float64 { return 0 }

// MaskIoU is the intersection over union of two masks; 0 when both are empty.
func MaskIoU(a, b *data.Mask) float64 { return 0 }

// Evaluate computes COCO-style AP of dets against gt, with box IoU, or mask
// IoU if useMasks.
func Evaluate(gt *data.Dataset, dets []Detection, useMasks bool) Metrics { return Metrics{} }
