package train

import (
	"errors"
	"fmt"

	"github.com/stheno-ml/stheno/examples/detr/model"
	"github.com/stheno-ml/stheno/examples/internal/checkpoint"
	"github.com/stheno-ml/stheno/examples/internal/data"
)

// checkpointVersion changes whenever Checkpoint's meaning does.
const checkpointVersion = 1

// Checkpoint is everything a run needs to continue exactly where it
// stopped, or to predict: the options that shaped the run (the model's
// configuration among them), the classes and their COCO category ids, the
// weights and BatchNorm statistics, the optimiser's state, the iteration
// and the history of losses and AP for the plots. Params, BNStats and Adam
// are a checkpoint.State.
type Checkpoint struct {
	Version     int
	Run         RunConfig // Run.Model.NumClasses is len(Classes)
	Classes     []string
	CategoryIDs []int // COCO category id of each class
	Iter        int   // iterations done
	Params      []NamedTensor
	BNStats     []NamedTensor // "<layer>.mean" and "<layer>.var"
	Adam        AdamState
	History     History
}

// NamedTensor is a float32 tensor with its name and shape.
type NamedTensor = checkpoint.NamedTensor

// AdamState is AdamW's step count and moments.
type AdamState = checkpoint.AdamState

// snapshot captures a run on the training set ds after iter iterations:
// params, and the optimiser of the training graph net (nil: none). Weights
// that are not finite numbers are refused: such a run is lost, and the
// previous checkpoint is worth more than this one.
func snapshot(run RunConfig, ds *data.Dataset, iter int, params *model.Params, net *model.Net, h History) (*Checkpoint, error) {
	ids := make([]int, len(ds.Classes))
	for k := range ids {
		ids[k] = ds.CategoryID(k)
	}
	st, err := checkpoint.Snapshot(params, optimizer(net))
	if nf := (*checkpoint.NotFiniteError)(nil); errors.As(err, &nf) {
		return nil, fmt.Errorf("train: after iteration %d the weights of %s are not finite (%v): not saving them; try a lower -lr", iter, nf.Name, nf.Value)
	}
	if err != nil {
		return nil, err
	}
	return &Checkpoint{
		Version: checkpointVersion, Run: run, Classes: ds.Classes, CategoryIDs: ids, Iter: iter,
		Params: st.Params, BNStats: st.BNStats, Adam: st.Adam, History: h,
	}, nil
}

// optimizer is net as a checkpoint.Optimizer (nil if net is).
func optimizer(net *model.Net) checkpoint.Optimizer {
	if net == nil {
		return nil
	}
	return net
}

// restore copies the checkpoint's weights and statistics into params
// (whose tensors the graphs share), wherever they live, and its optimiser
// state into the training graph net's optimiser (if net is not nil). Every
// tensor of params must be in the checkpoint with its shape.
func (c *Checkpoint) restore(params *model.Params, net *model.Net) error {
	st := checkpoint.State{Params: c.Params, BNStats: c.BNStats, Adam: c.Adam}
	return st.Restore(params, optimizer(net))
}

// Save writes c to path with checkpoint.Save: atomically and durably, so
// that a crash at any moment leaves the previous checkpoint or this one.
func (c *Checkpoint) Save(path string) error { return checkpoint.Save(path, c) }

// LoadCheckpoint reads a checkpoint written by Save.
func LoadCheckpoint(path string) (*Checkpoint, error) {
	var c Checkpoint
	if err := checkpoint.Load(path, &c); err != nil {
		return nil, err
	}
	if c.Version != checkpointVersion {
		return nil, fmt.Errorf("train: checkpoint %s has version %d, this program reads %d", path, c.Version, checkpointVersion)
	}
	return &c, nil
}

// Restore copies the checkpoint's weights and BatchNorm statistics into
// params, whose tensors must all be in the checkpoint: build the graphs
// first (Build creates the tensors), then restore.
func (c *Checkpoint) Restore(params *model.Params) error { return c.restore(params, nil) }
