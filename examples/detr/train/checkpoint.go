package train

import (
	"github.com/stheno-ml/stheno/examples/detr/model"
	"github.com/stheno-ml/stheno/examples/internal/checkpoint"
	"github.com/stheno-ml/stheno/examples/internal/data"
)

// checkpointVersion changes whenever Checkpoint's meaning does.
const checkpointVersion = 1

// Checkpoint is a run's checkpoint (checkpoint.Run): its options (the
// model's configuration among them; Run.Model.NumClasses is
// len(Classes)), classes, weights, BatchNorm statistics, AdamW's state,
// iteration and history. Restore(params, nil) loads the weights and
// statistics into a model built for prediction.
type Checkpoint = checkpoint.Run[RunConfig, History]

// NamedTensor is a float32 tensor with its name and shape.
type NamedTensor = checkpoint.NamedTensor

// AdamState is AdamW's step count and moments.
type AdamState = checkpoint.AdamState

// snapshot captures a run on the training set ds after iter iterations:
// params, and the optimiser of the training graph net (nil: none).
func snapshot(run RunConfig, ds *data.Dataset, iter int, params *model.Params, net *model.Net, h History) (*Checkpoint, error) {
	ids := make([]int, len(ds.Classes))
	for k := range ids {
		ids[k] = ds.CategoryID(k)
	}
	return checkpoint.NewRun(checkpointVersion, run, ds.Classes, ids, iter, params, optimizer(net), h)
}

// optimizer is net as a checkpoint.Optimizer (nil if net is).
func optimizer(net *model.Net) checkpoint.Optimizer {
	if net == nil {
		return nil
	}
	return net
}

// LoadCheckpoint reads a checkpoint written by Save.
func LoadCheckpoint(path string) (*Checkpoint, error) {
	return checkpoint.LoadRun[RunConfig, History](path, checkpointVersion)
}
