// Package train trains and runs the Deformable-DETR of package model: the
// training loop (each iteration's batch and flips from the seed, AdamW in
// the reference's parameter groups with warm-up and step decay, gradient
// clipping, a one-line progress display with the losses and the time
// left), periodic evaluation with COCO-style box AP on a held-out set,
// checkpoints that resume a run exactly (weights, BatchNorm statistics,
// optimiser state, iteration and history), pictures (loss and AP curves,
// predictions on validation images) and an inference mode that writes
// predictions as PNG and COCO-format JSON.
//
// It mirrors examples/maskrcnn/train, and what is not DETR's own comes
// from the packages under examples/internal: data (the split, each
// iteration's batch, resizing), eval (AP and COCO results), viz, history
// (curves.png and history.json), checkpoint (the file), progress, option
// and schedule.
//
// Runs are deterministic: iteration i's batch, flips and dropout masks
// depend only on the seed and i, and the kernels sum in a fixed order, so
// a run resumed from a checkpoint continues exactly as the uninterrupted
// run would have.
package train
