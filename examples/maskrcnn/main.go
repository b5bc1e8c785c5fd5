// Command maskrcnn trains a Mask R-CNN from Go on the CPU, evaluates it and
// draws its predictions; with -infer it predicts with a trained checkpoint.
//
// With no flags it trains on an embedded synthetic dataset of circles,
// squares and triangles (64x64 images, generated on the fly, no download)
// for 3200 iterations of 4 images, about ten minutes on two cores,
// evaluating box and mask AP on 200 held-out images every 800 iterations,
// and writes into out/maskrcnn:
//
//	checkpoint.gob     weights, BatchNorm statistics, optimiser state, iteration
//	curves.png         training losses and validation AP over time
//	val_NNNNNN.png     ground truth and predictions on validation images
//	history.json       the numbers behind curves.png
//
// Usage:
//
//	go run ./examples/maskrcnn [flags]                      # train
//	go run ./examples/maskrcnn -checkpoint out/maskrcnn/checkpoint.gob -iters 3000
//	                                                        # resume, train longer
//	go run ./examples/maskrcnn -infer -checkpoint out/maskrcnn/checkpoint.gob \
//	    -images dir-or-annotations.json [-out out/predictions]
//
// -data trains on a COCO-format dataset instead: an annotations JSON file
// with its images in an images/ directory beside it (data.WriteCOCO's
// layout) or in its own directory; its last tenth is held out for
// evaluation. Images of another size are resized to -size.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/stheno-ml/stheno/examples/maskrcnn/train"
)

func main() {
	if err := run(os.Args[1:]); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "maskrcnn:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	def := train.DefaultOptions()
	fs := flag.NewFlagSet("maskrcnn", flag.ContinueOnError)
	iters := fs.Int("iters", def.Iters, "training iterations (in all, when resuming)")
	batch := fs.Int("batch", def.Batch, "images per iteration (at least 2, for BatchNorm)")
	size := fs.Int("size", def.Model.ImageSize, "image size the model takes (a multiple of 16); images are resized to it")
	lr := fs.Float64("lr", def.LR, "peak learning rate (AdamW)")
	warmup := fs.Int("warmup", def.Warmup, "iterations of linear learning-rate warm-up")
	steps := fs.String("steps", joinFloats(def.Steps), "fractions of -iters where the learning rate drops tenfold")
	wd := fs.Float64("wd", def.WeightDecay, "weight decay (decoupled, on weights only)")
	width := fs.Int("width", def.Model.Width, "backbone width: stem channels (stages have 2x, 4x, 8x)")
	depth := fs.Int("depth", def.Model.Depth, "residual blocks per backbone stage")
	dataPath := fs.String("data", "", "COCO annotations file to train on (default: the synthetic dataset)")
	nTrain := fs.Int("train-images", def.TrainImages, "synthetic training images")
	nVal := fs.Int("val-images", def.ValImages, "synthetic validation images")
	evalEvery := fs.Int("eval-every", def.EvalEvery, "iterations between evaluations and checkpoints")
	out := fs.String("out", "", "output directory (default out/maskrcnn, or out/predictions with -infer)")
	seed := fs.Uint64("seed", def.Seed, "random seed: data, initialisation, sampling")
	ckpt := fs.String("checkpoint", "", "checkpoint to resume training from, or to predict with (-infer)")
	infer := fs.Bool("infer", false, "predict with -checkpoint on -images instead of training")
	images := fs.String("images", "", "with -infer: a directory of PNG/JPEG images or a COCO annotations file")
	scoreMin := fs.Float64("score", 0.5, "with -infer: lowest score drawn in the pictures (all go to the JSON)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}

	if *infer {
		if *ckpt == "" || *images == "" {
			return fmt.Errorf("-infer needs -checkpoint and -images")
		}
		dir := *out
		if dir == "" {
			dir = filepath.Join("out", "predictions")
		}
		return train.Infer(train.InferOptions{Checkpoint: *ckpt, Images: *images, Out: dir,
			Batch: def.EvalBatch, ScoreMin: *scoreMin, Log: os.Stdout})
	}

	opt := def
	opt.Iters, opt.Batch, opt.LR, opt.Warmup, opt.WeightDecay = *iters, *batch, *lr, *warmup, *wd
	opt.Data, opt.TrainImages, opt.ValImages, opt.EvalEvery, opt.Seed, opt.Resume = *dataPath, *nTrain, *nVal, *evalEvery, *seed, *ckpt
	opt.Model.ImageSize, opt.Model.Width, opt.Model.Depth = *size, *width, *depth
	if *out != "" {
		opt.Out = *out
	}
	var err error
	if opt.Steps, err = parseFloats(*steps); err != nil {
		return fmt.Errorf("-steps: %w", err)
	}
	res, err := train.Run(opt)
	if err != nil {
		return err
	}
	f := res.Final
	fmt.Printf("final: box AP %.3f AP50 %.3f AP75 %.3f | mask AP %.3f AP50 %.3f AP75 %.3f | %v\n",
		f.Box.AP, f.Box.AP50, f.Box.AP75, f.Mask.AP, f.Mask.AP50, f.Mask.AP75, res.Wall.Round(1e9))
	return nil
}

func parseFloats(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func joinFloats(v []float64) string {
	s := make([]string, len(v))
	for i, f := range v {
		s[i] = strconv.FormatFloat(f, 'g', -1, 64)
	}
	return strings.Join(s, ",")
}
