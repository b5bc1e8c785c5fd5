package train

import (
	"fmt"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/examples/internal/checkpoint"
	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
)

// checkpointVersion changes whenever Checkpoint's meaning does.
const checkpointVersion = 2

// Checkpoint is everything a run needs to continue exactly where it
// stopped, or to predict: the options that shaped the run (the model's
// configuration among them), the classes and their COCO category ids, the
// weights and BatchNorm statistics, the optimiser's state, the iteration
// and the history of losses and AP for the plots.
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

// AdamState is Adam's step count and moments.
type AdamState struct {
	Step int
	M, V []NamedTensor
}

// snapshot captures a run on the training set ds after iter iterations:
// params and the optimiser.
func snapshot(run RunConfig, ds *data.Dataset, iter int, params *model.Params, adam *Adam, h History) *Checkpoint {
	ids := make([]int, len(ds.Classes))
	for k := range ids {
		ids[k] = ds.CategoryID(k)
	}
	c := &Checkpoint{Version: checkpointVersion, Run: run, Classes: ds.Classes, CategoryIDs: ids, Iter: iter, History: h}
	for _, name := range params.Names() {
		c.Params = append(c.Params, checkpoint.Named(name, params.Value(name)))
		if adam != nil && adam.M[name] != nil {
			shape := params.Value(name).Shape()
			c.Adam.M = append(c.Adam.M, NamedTensor{Name: name, Shape: shape, Data: append([]float32(nil), adam.M[name]...)})
			c.Adam.V = append(c.Adam.V, NamedTensor{Name: name, Shape: shape, Data: append([]float32(nil), adam.V[name]...)})
		}
	}
	if adam != nil {
		c.Adam.Step = adam.Step
	}
	for _, name := range params.BatchNorms() {
		mean, variance := params.RunningStats(name)
		c.BNStats = append(c.BNStats, checkpoint.Named(name+".mean", mean), checkpoint.Named(name+".var", variance))
	}
	return c
}

// restore copies the checkpoint's weights and statistics into params
// (whose tensors the graphs share) and its moments into adam (if not nil).
// Every tensor of params must be in the checkpoint with its shape.
func (c *Checkpoint) restore(params *model.Params, adam *Adam) error {
	byName := map[string]NamedTensor{}
	for _, t := range append(append([]NamedTensor{}, c.Params...), c.BNStats...) {
		byName[t.Name] = t
	}
	load := func(name string, dst *tensor.Dense) error {
		t, ok := byName[name]
		if !ok {
			return fmt.Errorf("train: checkpoint has no tensor %s", name)
		}
		return t.CopyTo(dst)
	}
	for _, name := range params.Names() {
		if err := load(name, params.Value(name)); err != nil {
			return err
		}
	}
	for _, name := range params.BatchNorms() {
		mean, variance := params.RunningStats(name)
		if err := load(name+".mean", mean); err != nil {
			return err
		}
		if err := load(name+".var", variance); err != nil {
			return err
		}
	}
	if adam != nil {
		adam.Step = c.Adam.Step
		adam.M, adam.V = map[string][]float32{}, map[string][]float32{}
		for i, m := range c.Adam.M {
			adam.M[m.Name] = append([]float32(nil), m.Data...)
			adam.V[m.Name] = append([]float32(nil), c.Adam.V[i].Data...)
		}
	}
	return nil
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
