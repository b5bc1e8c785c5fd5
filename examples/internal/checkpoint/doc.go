// Package checkpoint writes and reads the checkpoints of the examples'
// training runs (examples/maskrcnn, examples/detr): any gob-encodable
// value, saved so that a crash at any moment leaves the previous
// checkpoint or the new one, never a torn file, and the named float32
// tensors (weights, statistics, optimiser moments) such a value holds.
//
// What a checkpoint holds, and its version, is each example's own: this
// package knows only files and tensors.
package checkpoint
