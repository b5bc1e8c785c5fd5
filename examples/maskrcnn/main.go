// Command maskrcnn trains a Mask R-CNN from Go, on the CPU or a GPU, evaluates it and
// draws its predictions; with -infer it predicts with a trained checkpoint,
// and with -export-synthetic it writes the synthetic dataset in COCO format.
//
// With no flags it trains on a synthetic dataset of circles, squares and
// triangles (64x64 images, generated on the fly, no download) for 3200
// iterations of 4 images, evaluating box and mask AP on 200 held-out images
// every 800 iterations, and writes into out/maskrcnn:
//
//	checkpoint.gob     the run's options, weights, BatchNorm statistics,
//	                   optimiser state, iteration and history
//	curves.png         training losses and validation AP over time
//	val_NNNNNN.png     ground truth and predictions on validation images
//	history.json       the numbers behind curves.png
//
// Usage:
//
//	go run ./examples/maskrcnn [flags]                    # train
//	go run ./examples/maskrcnn -checkpoint out/maskrcnn/checkpoint.gob
//	                                                      # resume an interrupted run
//	go run ./examples/maskrcnn -checkpoint out/maskrcnn/checkpoint.gob -iters 4000
//	                                                      # resume, train longer
//	go run ./examples/maskrcnn -infer -checkpoint out/maskrcnn/checkpoint.gob \
//	    -images dir-or-annotations.json [-out out/predictions]
//	go run ./examples/maskrcnn -export-synthetic out/synthetic
//	go run -tags stheno_cuda ./examples/maskrcnn -device cuda [-v]
//	                                                      # train on the first GPU
//	go run ./examples/maskrcnn -data out/synthetic/annotations.json
//
// Resuming takes the options that shape the run (data, model, schedule,
// seed) from the checkpoint; giving one with another value is refused with
// the list of differences, except -iters, which may be raised. Output goes
// beside the checkpoint unless -out says otherwise. An interrupt (Ctrl-C,
// SIGTERM) finishes the iteration under way, saves the checkpoint and
// prints the command that resumes; a second one quits at once.
//
// -data trains on a COCO-format dataset instead: an annotations JSON file
// with its images in an images/ directory beside it (data.WriteCOCO's
// layout) or in its own directory; its last tenth is held out for
// evaluation. Images of another size are resized to -size.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/examples/internal/cli"
	"github.com/stheno-ml/stheno/examples/internal/device"
	"github.com/stheno-ml/stheno/examples/internal/option"
	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
	"github.com/stheno-ml/stheno/examples/maskrcnn/train"
	"github.com/stheno-ml/stheno/kernels"
)

func main() {
	ctx, stop := program.InterruptContext()
	defer stop()
	os.Exit(program.ExitCode(run(ctx, os.Args[1:], os.Stdout, os.Stderr), os.Stderr))
}

// program is how the command names itself in its messages.
var program = cli.Program{Name: "maskrcnn", Pkg: "./examples/maskrcnn"}

// Flags of each mode besides training's.
var (
	inferFlags  = []string{"infer", "checkpoint", "images", "score", "out", "device", "tf32"}
	exportFlags = []string{"export-synthetic", "train-images", "val-images", "size", "seed"}
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	def := train.DefaultOptions()
	fs := flag.NewFlagSet("maskrcnn", flag.ContinueOnError)
	// The flag package would print parse errors itself; they are returned
	// and printed once, by exitCode.
	fs.SetOutput(io.Discard)
	iters := fs.Int("iters", def.Iters, "training iterations in all (when resuming, may be raised to train longer); at least 1")
	batch := fs.Int("batch", def.Batch, "images per iteration, in [2, 1024] (BatchNorm needs 2)")
	size := fs.Int("size", def.Model.ImageSize, "image size the model takes: a multiple of 16 in [32, 2048]; images are resized to it")
	lr := fs.Float64("lr", def.LR, "peak learning rate of AdamW, in (0, 1]")
	warmup := fs.Int("warmup", def.Warmup, "iterations of linear learning-rate warm-up, at least 0")
	steps := fs.String("steps", cli.JoinFloats(def.Steps), "increasing fractions of -iters in (0, 1) where the learning rate drops tenfold; \"\" for none")
	wd := fs.Float64("wd", def.WeightDecay, "weight decay (decoupled, on weights only), in [0, 1)")
	clip := fs.Float64("clip", def.ClipNorm, "gradients' global norm is clipped to this; >= 0, 0 for no clipping")
	width := fs.Int("width", def.Model.Width, "backbone width in [1, 512]: stem channels (stages have 2x, 4x, 8x)")
	depth := fs.Int("depth", def.Model.Depth, "residual blocks per backbone stage, in [1, 32]")
	dataPath := fs.String("data", "", "COCO annotations file to train on (default: the synthetic dataset)")
	nTrain := fs.Int("train-images", def.TrainImages, "synthetic training images, at least 1")
	nVal := fs.Int("val-images", def.ValImages, "synthetic validation images; 0 trains without evaluations")
	evalEvery := fs.Int("eval-every", def.EvalEvery, "iterations between evaluations and checkpoints, at least 1")
	out := fs.String("out", "", "output directory (default out/maskrcnn; the checkpoint's directory when resuming; out/predictions with -infer)")
	seed := fs.Uint64("seed", def.Seed, "random seed: data, initialisation, sampling")
	ckptPath := fs.String("checkpoint", "", "checkpoint to resume training from, or to predict with (-infer)")
	infer := fs.Bool("infer", false, "predict with -checkpoint on -images instead of training")
	images := fs.String("images", "", "with -infer: a directory of PNG/JPEG images or a COCO annotations file")
	scoreMin := fs.Float64("score", 0.5, "with -infer: lowest score drawn in the pictures, in [0, 1] (all go to the JSON)")
	preset := fs.String("preset", "", `"r50fpn": torchvision's maskrcnn_resnet50_fpn layer for layer (ResNet-50, FPN P2-P6, its RPN and head counts), 512x512 images, batch 8, lr 1e-4; other flags given change it`)
	deviceSpec := fs.String("device", "cpu", device.Usage)
	tf32 := fs.Bool("tf32", true, "with a GPU, cuBLAS's matrix products and the convolutions round their operands to TF32 on tensor cores; false: both in full float32")
	verbose := fs.Bool("v", false, "with a GPU, print the device's memory (in use, high-water mark, cached, reserved) and how many stretches of launches were replayed as CUDA graphs every 100 iterations")
	export := fs.String("export-synthetic", "", "write the synthetic dataset (-train-images then -val-images images of -size) to this directory in COCO format, and exit")
	fs.Usage = func() {} // printed below for -h only
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, "usage: maskrcnn [flags]   (see go doc ./examples/maskrcnn)")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return nil
		}
		return cli.UsageError{Err: err}
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected arguments %q", fs.Args())
	}
	// A value of STHENO_CPU_KERNELS this CPU cannot take stops the program
	// before any work: it would run on other kernels than asked for.
	if _, err := kernels.CPUKernels(); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if _, _, err := device.Parse(*deviceSpec); err != nil {
		return cli.UsageError{Err: err}
	}
	// openDevice opens the GPU -device names (nil for the CPU), once the
	// other flags are known to be good and before any work.
	openDevice := func() (*backend.Device, func(), error) {
		return program.OpenDevice(*deviceSpec, *tf32)
	}
	only := func(mode string, allowed []string) error { return cli.Only(given, mode, allowed) }

	switch {
	case *infer:
		if err := only("-infer", inferFlags); err != nil {
			return err
		}
		if *ckptPath == "" || *images == "" {
			return cli.Usagef("-infer needs -checkpoint and -images")
		}
		if !(*scoreMin >= 0 && *scoreMin <= 1) {
			return cli.UsageError{Err: &option.Error{Option: "score", Value: *scoreMin, Allowed: "must be a number in [0, 1]"}}
		}
		dir := *out
		if dir == "" {
			dir = filepath.Join("out", "predictions")
		}
		dev, closeDev, err := openDevice()
		if err != nil {
			return err
		}
		defer closeDev()
		return train.Infer(train.InferOptions{Checkpoint: *ckptPath, Images: *images, Out: dir,
			Batch: def.EvalBatch, ScoreMin: *scoreMin, Log: stdout, Device: dev})
	case given["export-synthetic"]:
		if err := only("-export-synthetic", exportFlags); err != nil {
			return err
		}
		opt := def
		opt.TrainImages, opt.ValImages, opt.Model.ImageSize, opt.Seed = *nTrain, *nVal, *size, *seed
		if err := opt.Validate(); err != nil {
			return cli.UsageError{Err: err}
		}
		if *export == "" {
			return cli.Usagef("-export-synthetic needs a directory")
		}
		n, err := train.ExportSynthetic(*export, opt.RunConfig)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %d images (%d for training, then %d for validation) to %s\ntrain on them with: go run ./examples/maskrcnn -data %s\n",
			n, opt.TrainImages, opt.ValImages, *export, filepath.Join(*export, "annotations.json"))
		return nil
	}
	for _, name := range []string{"images", "score"} {
		if given[name] {
			return cli.Usagef("-%s goes only with -infer", name)
		}
	}

	opt := def
	switch *preset {
	case "":
	case "r50fpn":
		if *ckptPath != "" {
			return cli.Usagef("-preset does not go with -checkpoint: a resumed run keeps its checkpoint's model")
		}
		if given["depth"] {
			return cli.Usagef("-depth does not go with -preset r50fpn: ResNet-50's stages have 3, 4, 6 and 3 blocks")
		}
		opt.Model = model.R50FPNConfig(opt.Model.NumClasses, 512)
		opt.Batch, opt.LR = 8, 1e-4
	default:
		return cli.Usagef(`-preset %q: the presets are "r50fpn" (or none)`, *preset)
	}
	if *ckptPath != "" {
		// Resuming: what the command line does not say, the checkpoint does.
		ckpt, err := train.LoadCheckpoint(*ckptPath)
		if err != nil {
			return err
		}
		opt.RunConfig = ckpt.Run
		if *out == "" {
			*out = filepath.Dir(*ckptPath)
		}
	}
	// A flag not given keeps the default (the preset's) or the checkpoint's
	// value: the flag variables hold the plain defaults.
	set := func(name string, apply func()) {
		if given[name] || (*ckptPath == "" && *preset == "") {
			apply()
		}
	}
	set("iters", func() { opt.Iters = *iters })
	set("batch", func() { opt.Batch = *batch })
	set("size", func() { opt.Model.ImageSize = *size })
	set("lr", func() { opt.LR = *lr })
	set("warmup", func() { opt.Warmup = *warmup })
	set("wd", func() { opt.WeightDecay = *wd })
	set("clip", func() { opt.ClipNorm = *clip })
	set("width", func() { opt.Model.Width = *width })
	set("depth", func() { opt.Model.Depth = *depth })
	set("data", func() { opt.Data = *dataPath })
	set("train-images", func() { opt.TrainImages = *nTrain })
	set("val-images", func() { opt.ValImages = *nVal })
	set("seed", func() { opt.Seed = *seed })
	var errs []error
	set("steps", func() {
		var err error
		if opt.Steps, err = cli.ParseFloats(*steps); err != nil {
			errs = append(errs, &option.Error{Option: "steps", Value: strconv.Quote(*steps), Allowed: "must be comma-separated numbers"})
		}
	})
	if opt.Data != "" && (given["train-images"] || given["val-images"]) {
		errs = append(errs, errors.New("-train-images and -val-images count synthetic images; with -data, the last tenth of its images is held out"))
	}
	if opt.Data != "" {
		opt.TrainImages, opt.ValImages = 0, 0 // the data decides
	}
	opt.EvalEvery, opt.Resume = *evalEvery, *ckptPath
	if *out != "" {
		opt.Out = *out
	}
	if err := opt.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return cli.UsageError{Err: errors.Join(errs...)}
	}
	dev, closeDev, err := openDevice()
	if err != nil {
		return err
	}
	defer closeDev()
	opt.Log, opt.Device, opt.Verbose = stdout, dev, *verbose
	res, err := train.Run(ctx, opt)
	if err != nil {
		return err
	}
	if !res.Evaluated {
		fmt.Fprintf(stdout, "final: %d iterations, not evaluated (no validation images) | %v\n", res.Iters, res.Wall.Round(1e9))
		return nil
	}
	fmt.Fprintf(stdout, "final: %v | %v\n", res.Final, res.Wall.Round(1e9))
	return nil
}
