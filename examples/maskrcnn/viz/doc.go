// Package viz draws the Mask R-CNN example's pictures with the standard
// library alone: detections over images (boxes, translucent masks, labels),
// line plots of training curves, and grids of pictures, with a built-in 5x7
// bitmap font for text.
package viz
