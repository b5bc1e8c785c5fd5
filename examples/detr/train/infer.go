package train

import (
	"fmt"

	"github.com/stheno-ml/stheno/examples/detr/model"
	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
	"github.com/stheno-ml/stheno/examples/internal/infer"
)

// InferOptions configure Infer.
type InferOptions = infer.Options

// Infer loads a checkpoint, predicts on every image of opt.Images (resized
// to the model's input size, boxes mapped back to the image's own size:
// the top MaxDetections of queries x classes, the reference's
// post-processing), and writes into opt.Out a picture of each image's
// detections and predictions.json, the detections in COCO's results
// format. Its category_id is the COCO file's own id of the class when
// opt.Images is one (whose categories must have the checkpoint's class
// names, in the same id order), and otherwise the id the class had in the
// training data (the synthetic dataset's are 1, 2, 3).
func Infer(opt InferOptions) error {
	var ckpt *Checkpoint
	return infer.Run(opt, infer.Hooks{
		MaxBatch: maxBatch,
		Load: func() ([]string, []int, error) {
			var err error
			if ckpt, err = LoadCheckpoint(opt.Checkpoint); err != nil {
				return nil, nil, err
			}
			return ckpt.Classes, ckpt.CategoryIDs, nil
		},
		Build: func() (func([]*data.Image) ([]eval.Detection, error), func(), error) {
			params := model.NewParams(ckpt.Run.Seed, opt.Device)
			net, err := model.Build(ckpt.Run.Model, params, model.Infer, opt.Batch)
			if err != nil {
				params.Free()
				return nil, nil, err
			}
			free := func() { net.Close(); params.Free() }
			if err := ckpt.Restore(params, nil); err != nil {
				free()
				return nil, nil, err
			}
			return func(images []*data.Image) ([]eval.Detection, error) { return Predict(net, images) }, free, nil
		},
		Score: func(ds *data.Dataset, dets []eval.Detection) fmt.Stringer {
			return Metrics{Box: eval.Evaluate(ds, dets, false)}
		},
	})
}
