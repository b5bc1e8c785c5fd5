// Package viz draws the Mask R-CNN example's pictures: detections over
// images (boxes, translucent masks, labels), the ground truth the same way,
// and grids and captions of pictures, with the standard library's image
// packages and golang.org/x/image's fixed 7x13 font for text. (The training
// curves are drawn with gonum.org/v1/plot, in package train.)
package viz
