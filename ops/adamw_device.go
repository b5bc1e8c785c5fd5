// The device side of AdamW: kernels/adamw.cu.

package ops

import (
	"fmt"
	"math"
	"slices"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// The CPU twins cut the tensors into chunks and add in the kernels' order
// only if both sides agree on the geometry.
var (
	_ = [1]struct{}{}[kernels.AdamWChunkElems-cuda.AdamWChunkElems]
	_ = [1]struct{}{}[kernels.AdamWThreads-cuda.AdamWThreads]
	_ = [1]struct{}{}[kernels.AdamWMaxGroups-cuda.AdamWMaxGroups]
	_ = [1]struct{}{}[kernels.AdamWTensorWords-cuda.AdamWTensorWords]
)

// adamwDevice is AdamW's state on a GPU besides the moments: the table of
// the tensors (int64 words, as adamw.cu reads them) sized for every
// parameter, the chunks' partial sums of squares, and [norm, coef].
type adamwDevice struct {
	table   *tensor.Dense
	partial *tensor.Dense
	norm    *tensor.Dense
	// rows are the tensors' rows the table holds now, and chunks its
	// chunks: a step with the same rows copies nothing.
	rows   [][kernels.AdamWTensorWords]int64
	chunks int
}

func (a *AdamW) makeDeviceState() (err error) {
	dev := a.dev
	var made []*tensor.Dense
	defer func() {
		if err != nil {
			for _, t := range made {
				dev.FreeDense(t)
			}
		}
	}()
	newDense := func(what string, dt tensor.Dtype, shape ...int) (*tensor.Dense, error) {
		t, err := dev.NewDense(dt, shape...)
		if err != nil {
			return nil, fmt.Errorf("ops: %s: %s: %w", adamwName, what, err)
		}
		made = append(made, t)
		return t, nil
	}
	lengths := make([]int, len(a.params))
	for i, p := range a.params {
		if p.m, err = newDense("first moment of "+p.name, a.dt, p.shape...); err != nil {
			return err
		}
		if p.v, err = newDense("second moment of "+p.name, a.dt, p.shape...); err != nil {
			return err
		}
		for _, t := range []*tensor.Dense{p.m, p.v} {
			if err := dev.Zero(t); err != nil {
				return fmt.Errorf("ops: %s: %w", adamwName, err)
			}
		}
		if p.mPtr, err = dev.Ptr(p.m); err != nil {
			return fmt.Errorf("ops: %s: %w", adamwName, err)
		}
		if p.vPtr, err = dev.Ptr(p.v); err != nil {
			return fmt.Errorf("ops: %s: %w", adamwName, err)
		}
		lengths[i] = p.shape.TotalSize()
	}
	chunks := len(kernels.AdamWChunks(lengths))
	if chunks > math.MaxInt32 {
		return fmt.Errorf("ops: %s: %d chunks of %d elements: more than a grid holds", adamwName, chunks, kernels.AdamWChunkElems)
	}
	s := &adamwDevice{}
	if s.table, err = newDense("table", tensor.Int64, len(a.params)*kernels.AdamWTensorWords+chunks); err != nil {
		return err
	}
	if s.partial, err = newDense("partial sums", tensor.Float64, max(chunks, 1)); err != nil {
		return err
	}
	if s.norm, err = newDense("norm", tensor.Float64, 2); err != nil {
		return err
	}
	a.onDev = s
	return nil
}

// checkDeviceState checks that no Scope has freed the state (its End
// empties the tensors it frees).
func (a *AdamW) checkDeviceState() error {
	s := a.onDev
	for _, t := range []*tensor.Dense{s.table, s.partial, s.norm} {
		if len(t.Raw) == 0 {
			return fmt.Errorf("ops: %s: %w", adamwName, errAdamWFreed)
		}
	}
	for _, p := range a.params {
		if p.shape.TotalSize() > 0 && (len(p.m.Raw) == 0 || len(p.v.Raw) == 0) {
			return fmt.Errorf("ops: %s: %s: %w", adamwName, p.name, errAdamWFreed)
		}
	}
	return nil
}

func (a *AdamW) freeDevice() error {
	var errs []error
	s := a.onDev
	ts := []*tensor.Dense{s.table, s.partial, s.norm}
	for _, p := range a.params {
		ts = append(ts, p.m, p.v)
	}
	for _, t := range ts {
		if t != nil && len(t.Raw) > 0 {
			if err := a.dev.FreeDense(t); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("ops: %s: Free: %v", adamwName, errs)
	}
	return nil
}

// deviceNorm reads the norm of the last clipped step.
func (a *AdamW) deviceNorm() (float64, error) {
	if err := a.checkDeviceState(); err != nil {
		return 0, err
	}
	h, err := a.dev.ToHost(a.onDev.norm)
	if err != nil {
		return 0, fmt.Errorf("ops: %s: GradNorm: %w", adamwName, err)
	}
	return h.Float64s()[0], nil
}

// stepDevice is Step on the GPU: the table copied to the device if any
// address changed, then norm_partial and norm_finalize when clipping, and
// the step, all queued on the device's stream.
func (a *AdamW) stepDevice(ps []adamwStepParam) error {
	dev, s := a.dev, a.onDev
	rows := make([][kernels.AdamWTensorWords]int64, len(ps))
	for i, p := range ps {
		rows[i] = [kernels.AdamWTensorWords]int64{int64(p.seenVal.ptr), int64(p.seenGrad.ptr), int64(p.mPtr), int64(p.vPtr), int64(p.shape.TotalSize()), int64(p.group)}
	}
	if !slices.Equal(rows, s.rows) {
		words, chunks := kernels.AdamWTable(rows)
		if chunks > 0 {
			host := tensor.New(tensor.WithBacking(words))
			// An asynchronous copy on the stream, after the kernels that
			// read the table before: the driver stages the host slice
			// before the call returns.
			if err := dev.Engine().Memcpy(s.table, host); err != nil {
				s.rows = nil
				return fmt.Errorf("ops: %s: copying the table: %w", adamwName, err)
			}
		}
		s.rows, s.chunks = rows, chunks
	}
	chunks := s.chunks
	if chunks == 0 {
		return nil
	}
	table, err := dev.Ptr(s.table)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", adamwName, err)
	}
	normPtr, err := dev.Ptr(s.norm)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", adamwName, err)
	}
	grid := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(chunks), Y: 1, Z: 1},
		Block: backend.Dim3{X: cuda.AdamWThreads, Y: 1, Z: 1},
	}
	clip := a.cfg.MaxGradNorm > 0
	if clip {
		partial, err := dev.Ptr(s.partial)
		if err != nil {
			return fmt.Errorf("ops: %s: %w", adamwName, err)
		}
		np := cuda.AdamWNormParams{Table: table, Partial: partial, Norm: normPtr, Tensors: int64(len(ps)),
			MaxNorm: a.cfg.MaxGradNorm, Chunks: int32(chunks)}
		k, err := cuda.AdamWNormPartial(a.dt)
		if err == nil {
			err = k.Launch(dev, grid, np)
		}
		if err == nil {
			one := grid
			one.Grid.X = 1
			err = cuda.AdamWNormFinalize.Launch(dev, one, np)
		}
		if err != nil {
			return fmt.Errorf("ops: %s: gradient norm: %w", adamwName, err)
		}
		a.normed = true
	}
	sp := cuda.AdamWStepParams{Table: table, Norm: normPtr, Tensors: int64(len(ps)),
		Beta1: a.cfg.Beta1, OneMinusBeta1: 1 - a.cfg.Beta1, Beta2: a.cfg.Beta2, OneMinusBeta2: 1 - a.cfg.Beta2,
		Eps: a.cfg.Eps, Chunks: int32(chunks), Clip: boolInt32(clip), ZeroGrad: boolInt32(!a.cfg.KeepGrads)}
	for g, sc := range a.stepScalars() {
		sp.BC2Sqrt = sc.BC2Sqrt
		sp.Decay[g], sp.StepSize[g] = sc.Decay, sc.StepSize
	}
	k, err := cuda.AdamWStep(a.dt)
	if err == nil {
		err = k.Launch(dev, grid, sp)
	}
	if err != nil {
		return fmt.Errorf("ops: %s: step: %w", adamwName, err)
	}
	return nil
}
