// Package infer is the -infer flow both examples share: read the images
// to predict on (a directory, or a COCO file whose categories must be the
// checkpoint's classes), predict at each image's own size, draw each
// image's detections, write predictions.json in COCO's results format and,
// when the images are annotated, print their AP. The checkpoint, the
// network and the metrics are the example's, passed in as Hooks.
package infer
