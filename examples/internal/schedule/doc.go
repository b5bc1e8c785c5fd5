// Package schedule holds the learning-rate schedules of the examples'
// training runs (examples/maskrcnn, examples/detr): WarmupMultiStep, a
// linear warm-up then steps down at milestones. Mask R-CNN trains with it;
// Deformable-DETR's step decay is the case of no warm-up and one
// milestone.
package schedule
