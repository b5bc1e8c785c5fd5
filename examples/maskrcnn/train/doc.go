// Package train trains and runs the Mask R-CNN of package model: the
// training loop (data sampling and augmentation, an AdamW optimiser with
// warm-up and step decay, a one-line progress display), periodic evaluation
// with COCO-style box and mask AP on a held-out set, checkpoints that
// resume a run exactly (weights, BatchNorm statistics, optimiser state,
// iteration and history), pictures (loss and AP curves, predictions on
// validation images) and an inference mode that writes predictions as PNG
// and COCO-format JSON.
//
// What is not Mask R-CNN's own comes from the packages under
// examples/internal, which examples/detr shares: data (the split, each
// iteration's batch, resizing), eval (AP and COCO results), viz, history
// (curves.png and history.json), checkpoint (the file), progress, option
// and schedule.
//
// Runs are deterministic: iteration i's batch, flips and sampling depend
// only on the seed and i, and the kernels sum in a fixed order, so a run
// resumed from a checkpoint continues exactly as the uninterrupted run
// would have.
package train
