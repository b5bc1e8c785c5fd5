// Package hostop runs a Go function as one node of a Gorgonia graph: a
// step of a detector that is not differentiable (Mask R-CNN's proposals,
// RoI sampling and NMS, DETR's Hungarian matching) but depends on values
// computed earlier in the same run. Both examples' models use it.
package hostop
