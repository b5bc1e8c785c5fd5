// Package viz draws the Mask R-CNN example's pictures with the standard
// library's image packages: detections over images (boxes, translucent
// masks, labels), line plots of training curves, and grids of pictures;
// text is golang.org/x/image's fixed 7x13 font, drawn with font.Drawer.
package viz
