package checkpoint

import (
	"errors"
	"fmt"
)

// Run is a training run's checkpoint, everything it needs to continue
// exactly where it stopped, or to predict: the options that shaped the run
// (R, the model's configuration among them), the classes and their COCO
// category ids, the weights and BatchNorm statistics, the optimiser's
// state, the iteration and the history of losses and AP for the plots (H).
// Both examples' train.Checkpoint are a Run of their own options and
// history; the file is the gob of these fields, by name.
type Run[R, H any] struct {
	Version     int
	Run         R
	Classes     []string
	CategoryIDs []int // COCO category id of each class
	Iter        int   // iterations done
	Params      []NamedTensor
	BNStats     []NamedTensor // "<layer>.mean" and "<layer>.var"
	Adam        AdamState
	History     H
}

// NewRun captures a run after iter iterations: the store's tensors, and
// opt's state (nil: none), with version, the run's options, its classes
// and their category ids, and its history. Weights that are not finite
// numbers are refused: such a run is lost, and the previous checkpoint is
// worth more than this one.
func NewRun[R, H any](version int, run R, classes []string, categoryIDs []int, iter int, s Store, opt Optimizer, h H) (*Run[R, H], error) {
	st, err := Snapshot(s, opt)
	if nf := (*NotFiniteError)(nil); errors.As(err, &nf) {
		return nil, fmt.Errorf("train: after iteration %d the weights of %s are not finite (%v): not saving them; try a lower -lr", iter, nf.Name, nf.Value)
	}
	if err != nil {
		return nil, err
	}
	return &Run[R, H]{
		Version: version, Run: run, Classes: classes, CategoryIDs: categoryIDs, Iter: iter,
		Params: st.Params, BNStats: st.BNStats, Adam: st.Adam, History: h,
	}, nil
}

// Restore copies the checkpoint's weights and statistics into the store
// (whose tensors the graphs share), wherever they live, and its optimiser
// state into opt (when not nil). Every tensor of the store must be in the
// checkpoint with its shape: build the graphs first (building creates the
// tensors), then restore.
func (c *Run[R, H]) Restore(s Store, opt Optimizer) error {
	return State{Params: c.Params, BNStats: c.BNStats, Adam: c.Adam}.Restore(s, opt)
}

// Save writes c to path with Save: atomically and durably, so that a crash
// at any moment leaves the previous checkpoint or this one.
func (c *Run[R, H]) Save(path string) error { return Save(path, c) }

// LoadRun reads a checkpoint written by Run.Save, which must have the
// given version.
func LoadRun[R, H any](path string, version int) (*Run[R, H], error) {
	var c Run[R, H]
	if err := Load(path, &c); err != nil {
		return nil, err
	}
	if c.Version != version {
		return nil, fmt.Errorf("train: checkpoint %s has version %d, this program reads %d", path, c.Version, version)
	}
	return &c, nil
}
