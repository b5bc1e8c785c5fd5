package train

import (
	"fmt"

	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
	"github.com/stheno-ml/stheno/examples/internal/infer"
	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
)

// InferOptions configure Infer.
type InferOptions = infer.Options

// Infer loads a checkpoint, predicts on every image of opt.Images (resized
// to the model's input size, predictions mapped back to the image's own
// size), and writes into opt.Out a picture of each image's detections and
// predictions.json, the detections in COCO's results format (masks as
// compressed RLE). Its category_id is the COCO file's own id of the class
// when opt.Images is one (whose categories must have the checkpoint's class
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
			return func(images []*data.Image) ([]eval.Detection, error) { return predictOriginal(net, images) }, free, nil
		},
		Score: func(ds *data.Dataset, dets []eval.Detection) fmt.Stringer {
			return Metrics{Box: eval.Evaluate(ds, dets, false), Mask: eval.Evaluate(ds, dets, true)}
		},
	})
}

// predictOriginal predicts on images of any size: each is resized to the
// model's input, and its detections are mapped back, boxes scaled and masks
// pasted at the image's own resolution.
func predictOriginal(net *model.Net, images []*data.Image) ([]eval.Detection, error) {
	size := net.Config().ImageSize
	var out []eval.Detection
	n := net.Batch()
	for start := 0; start < len(images); start += n {
		batch := make([][]float32, n)
		for i := range n {
			batch[i] = data.Resize(images[min(start+i, len(images)-1)], size).Pix
		}
		dets, masks, err := net.Predict(batch)
		if err != nil {
			return nil, fmt.Errorf("train: predicting images %d..: %w", start, err)
		}
		for i := range min(n, len(images)-start) {
			img := images[start+i]
			sx, sy := float64(img.W)/float64(size), float64(img.H)/float64(size)
			for j, d := range dets[i] {
				b := model.Box{d.Box[0] * sx, d.Box[1] * sy, d.Box[2] * sx, d.Box[3] * sy}
				out = append(out, eval.Detection{ImageID: img.ID, Class: d.Class, Score: d.Score, Box: b,
					Mask: model.PasteMask(masks[i][j].Probs, masks[i][j].Size, b, img.W, img.H)})
			}
		}
	}
	return out, nil
}
