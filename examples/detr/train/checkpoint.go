package train

import (
	"fmt"
	"math"

	"gorgonia.org/tensor"

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

// AdamState is AdamW's step count and moments.
type AdamState struct {
	Step int
	M, V []NamedTensor
}

// snapshot captures a run on the training set ds after iter iterations:
// params, and the optimiser of the training graph net (nil: none). Weights
// that are not finite numbers are refused: such a run is lost, and the
// previous checkpoint is worth more than this one.
func snapshot(run RunConfig, ds *data.Dataset, iter int, params *model.Params, net *model.Net, h History) (*Checkpoint, error) {
	ids := make([]int, len(ds.Classes))
	for k := range ids {
		ids[k] = ds.CategoryID(k)
	}
	c := &Checkpoint{Version: checkpointVersion, Run: run, Classes: ds.Classes, CategoryIDs: ids, Iter: iter, History: h}
	var moments map[string][2]*tensor.Dense
	if net != nil {
		var err error
		if c.Adam.Step, moments, err = net.OptimizerState(); err != nil {
			return nil, err
		}
	}
	for _, name := range params.Names() {
		t, err := params.HostValue(name)
		if err != nil {
			return nil, err
		}
		for _, v := range t.Float32s() {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				return nil, fmt.Errorf("train: after iteration %d the weights of %s are not finite (%v): not saving them; try a lower -lr", iter, name, v)
			}
		}
		c.Params = append(c.Params, checkpoint.Named(name, t))
		if mv, ok := moments[name]; ok {
			c.Adam.M = append(c.Adam.M, checkpoint.Named(name, mv[0]))
			c.Adam.V = append(c.Adam.V, checkpoint.Named(name, mv[1]))
		}
	}
	for _, name := range params.BatchNorms() {
		mean, variance, err := params.HostRunningStats(name)
		if err != nil {
			return nil, err
		}
		c.BNStats = append(c.BNStats, checkpoint.Named(name+".mean", mean), checkpoint.Named(name+".var", variance))
	}
	return c, nil
}

// restore copies the checkpoint's weights and statistics into params
// (whose tensors the graphs share), wherever they live, and its optimiser
// state into the training graph net's optimiser (if net is not nil). Every
// tensor of params must be in the checkpoint with its shape.
func (c *Checkpoint) restore(params *model.Params, net *model.Net) error {
	byName := map[string]NamedTensor{}
	for _, t := range append(append([]NamedTensor{}, c.Params...), c.BNStats...) {
		byName[t.Name] = t
	}
	find := func(name string, shape tensor.Shape) ([]float32, error) {
		t, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("train: checkpoint has no tensor %s", name)
		}
		return t.Values(shape)
	}
	for _, name := range params.Names() {
		d, err := find(name, params.Value(name).Shape())
		if err == nil {
			err = params.SetValue(name, d)
		}
		if err != nil {
			return err
		}
	}
	for _, name := range params.BatchNorms() {
		mean, _ := params.RunningStats(name)
		m, err := find(name+".mean", mean.Shape())
		if err != nil {
			return err
		}
		v, err := find(name+".var", mean.Shape())
		if err != nil {
			return err
		}
		if err := params.SetRunningStats(name, m, v); err != nil {
			return err
		}
	}
	if net == nil {
		return nil
	}
	moments := map[string][2]*tensor.Dense{}
	if len(c.Adam.M) != len(c.Adam.V) {
		return fmt.Errorf("train: checkpoint has %d first and %d second moments", len(c.Adam.M), len(c.Adam.V))
	}
	for i, m := range c.Adam.M {
		v := c.Adam.V[i]
		if v.Name != m.Name {
			return fmt.Errorf("train: checkpoint's moments %d are of %s and %s", i, m.Name, v.Name)
		}
		moments[m.Name] = [2]*tensor.Dense{m.Dense(), v.Dense()}
	}
	if c.Adam.Step == 0 && len(moments) == 0 {
		return nil // saved before any step: the optimiser is as new
	}
	return net.SetOptimizerState(c.Adam.Step, moments)
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
