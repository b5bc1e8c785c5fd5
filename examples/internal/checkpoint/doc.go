// Package checkpoint writes and reads the checkpoints of the examples'
// training runs (examples/maskrcnn, examples/detr): any gob-encodable
// value, saved so that a crash at any moment leaves the previous
// checkpoint or the new one, never a torn file, and the named float32
// tensors (weights, statistics, optimiser moments) such a value holds.
// State is those tensors together: Snapshot takes them from a model's
// parameter store and optimiser (the small Store and Optimizer
// interfaces, which both examples' model.Params and model.Net satisfy)
// through the host, and Restore puts them back.
//
// What a checkpoint holds, and its version, is each example's own: this
// package knows only files, tensors and the interfaces above.
package checkpoint
