// Package viz draws the examples' pictures (examples/maskrcnn and
// examples/detr): detections over images (boxes, translucent masks where
// there are masks, labels), the ground truth the same way, and grids and
// captions of pictures, with the standard library's image packages and
// golang.org/x/image's fixed 7x13 font for text. (The training curves are
// drawn with gonum.org/v1/plot, in package history.)
package viz
