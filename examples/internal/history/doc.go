// Package history draws and writes what the examples' training runs
// (examples/maskrcnn, examples/detr) record over time: the losses, logged
// every few iterations, and the precisions of the periodic evaluations.
// Curves draws them as curves.png from Series, quantities with names, so
// that each example plots its own losses (Mask R-CNN's six, DETR's three)
// and its own precisions (box AP alone for a box detector); WriteJSON
// writes a run's history as history.json, whose fields each example names.
package history
