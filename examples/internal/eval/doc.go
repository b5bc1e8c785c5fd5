// Package eval scores detections against ground truth the way the COCO
// benchmark does, following pycocotools' COCOeval step by step (evaluateImg,
// accumulate, summarize) for the "all" area range:
//
//   - Per image and class, detections are sorted by descending score (ties
//     keep their input order) and only the first 100 are kept, as
//     pycocotools' maxDets=100, which applies per image and category.
//   - At each IoU threshold 0.50, 0.55, ..., 0.95 every detection, best score
//     first, is matched to the unmatched ground truth object with the
//     highest IoU, provided the IoU is at least the threshold. Unmatched
//     detections are false positives; a second detection of the same object
//     is one too.
//   - Per class, detections of all images are ranked by score; precision is
//     made monotone (each precision is the best at that recall or higher)
//     and read at the 101 recall levels 0, 0.01, ..., 1 (0 past the highest
//     recall reached). Their mean is the class's AP at that threshold.
//   - AP averages over thresholds and over the classes that have ground
//     truth; a class without ground truth is left out (its PerClassAP is -1),
//     and a class with ground truth but no detections scores 0.
//
// Crowd regions (data.Object.Crowd) are handled as pycocotools does: they
// count neither as objects to find nor against detections, a detection's
// overlap with one is its intersection over the detection's own area, and
// detections matched to one are ignored.
//
// Detections whose ImageID is not in the ground truth, or whose Class is
// outside its classes, are ignored (pycocotools refuses the former).
//
// Evaluate scores boxes or masks. Box AP reads no mask, so a box detector's
// detections, and ground truth without masks, score box AP alone:
// examples/detr reports box AP, examples/maskrcnn box and mask AP.
package eval
