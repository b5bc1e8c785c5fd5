// Package progress draws a training run's progress: on a terminal, one bar
// that redraws itself in place, with the caller's line (losses, learning
// rate, images per second, ETA) beside it; in a log file or a pipe, the
// same line every 10 seconds. Lines of their own (an evaluation's results)
// print above the bar without breaking it.
//
// examples/maskrcnn/train uses it, and examples/detr's training is meant
// to: both show the same bar, each with its own losses on the line.
package progress
