// Package data holds the detection data that the examples train on:
// images with boxed and masked objects, a deterministic synthetic dataset
// of circles, squares and triangles, and COCO-format reading and writing;
// and what a run does with them: Load splits them into training and
// validation sets at the model's input size, Batch draws each iteration's
// images (shuffled per epoch, mirrored at random, from the seed and the
// iteration alone, so that a resumed run sees the same batches), and
// ReadImages reads what a trained model predicts on.
//
// examples/maskrcnn and examples/detr both import it, so that both train
// and evaluate on the same images; a box detector such as Deformable-DETR
// reads the boxes and leaves the masks alone.
//
// Conventions, used by every package of the examples:
//   - Pixel (x, y) covers the square [x, x+1) x [y, y+1); its centre is
//     (x+0.5, y+0.5).
//   - A box is [x1, y1, x2, y2] in pixels with an exclusive end, so the box of
//     a single pixel (x, y) is [x, y, x+1, y+1] and its area is 1. This is
//     COCO's [x, y, w, h] with x2 = x+w, y2 = y+h.
//   - Class indices start at 0 with the first real class; there is no
//     background class (the model adds its own). COCO category ids, which
//     start at 1 and may have gaps, are mapped to indices in increasing id
//     order.
//   - Masks are image-sized, row-major; image pixels are planar RGB float32
//     in [0, 1].
//
// Polygons read from COCO files are rasterised at pixel centres with the
// even-odd rule, the convention pycocotools approximates (see RasterizePolygon).
// Masks are written as COCO's compressed RLE strings and both RLE forms are
// read (see EncodeRLE and DecodeRLE).
package data
