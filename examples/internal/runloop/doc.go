// Package runloop is the training loop both examples run: the schedule,
// the iterations with their progress line and ETA, the loss curves'
// averages, the periodic evaluations with their pictures of predictions,
// history.json, curves.png and checkpoint.gob, and the interruption that
// finishes the iteration under way and saves it. What differs between the
// examples (the network's training step, its losses and metrics, its
// history and checkpoint types) comes in through Hooks.
package runloop
