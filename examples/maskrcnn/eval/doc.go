// Package eval scores detections against ground truth the way the COCO
// benchmark does (pycocotools' COCOeval): average precision over IoU
// thresholds 0.50:0.05:0.95 with 101-point interpolated precision, for boxes
// or masks.
package eval
