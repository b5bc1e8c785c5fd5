package ops

import (
	"fmt"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// msDeformKernel is one of msdeform.cu's (or msdeform_sm90a.cu's) kernels
// with what its launch needs to know: the channels each lane loads at once
// (msDeformGroup), and whether it takes the queries in the order queryOrder
// computes (the forward's _sorted kernels).
type msDeformKernel struct {
	k      cuda.Kernel[cuda.MSDeformParams]
	vec    int
	sorted bool
}

// msDeformDefaults are the kernels msDeformKernelFor chooses among, by
// dtype: the forward with 16 bytes of channels per lane or one channel,
// queries as given or sorted, and msdeform.cu's backward.
var msDeformDefaults = map[tensor.Dtype]struct {
	fwd, fwdSorted, fwdScalar, fwdScalarSorted, bwd cuda.Kernel[cuda.MSDeformParams]
}{
	tensor.Float32: {cuda.MSDeformFwdV16bOcc5F32, cuda.MSDeformFwdV16bSortedF32,
		cuda.MSDeformFwdScalarF32, cuda.MSDeformFwdScalarSortedF32, cuda.MSDeformBwdAtomicC4Rs4Occ3F32},
	tensor.Float64: {cuda.MSDeformFwdV16bF64, cuda.MSDeformFwdV16bSortedF64,
		cuda.MSDeformFwdScalarF64, cuda.MSDeformFwdScalarSortedF64, cuda.MSDeformBwdAtomicC4Rs4F64},
}

// msDeformQuadBackward is msdeform_sm90a.cu's float32 backward: 4
// consecutive channels per lane, added to grad_value with one 16-byte
// vector reduction per corner (sm_90 only, PTX ISA 8.1). It needs D % 4 == 0
// and value and grad_value 16-byte aligned.
const msDeformQuadBackward = cuda.MSDeformBwdRed4Rs4Occ3F32

// msDeformTuning is what tests and benchmarks may set on a Device in place
// of msdeform's rules (withMSDeformTuning): the zero value keeps them all.
// It lives on the Device (backend.Device.SetValue, under msDeformTuningKey),
// so it is gone when the Device closes and touches no other Device.
type msDeformTuning struct {
	// kernel, when set, picks the kernel variant instead of
	// msDeformKernelFor.
	kernel func(backward bool, dt tensor.Dtype) msDeformKernel
	// order, when not 0, forces the forward's query order on (1) or off
	// (-1) instead of sortsQueries' rule.
	order int
	// bandRows, when positive, sets the rows of level 0 a band of
	// orderGrid's cells spans instead of msDeformOrderBandRows.
	bandRows int
}

// msDeformTuningKey is the key of a Device's msDeformTuning.
type msDeformTuningKey struct{}

// msDeformTuningOf returns the msDeformTuning set on dev, or the zero one.
func msDeformTuningOf(dev *backend.Device) msDeformTuning {
	t, _ := dev.Value(msDeformTuningKey{}).(msDeformTuning)
	return t
}

// kernelFor is msDeformKernelFor unless t picks the kernel.
func (t msDeformTuning) kernelFor(backward bool, dt tensor.Dtype, d int, aligned, quad, sorted bool) (msDeformKernel, error) {
	if t.kernel != nil {
		return t.kernel(backward, dt), nil
	}
	return msDeformKernelFor(backward, dt, d, aligned, quad, sorted)
}

// sortsQueries is s.sortsQueries() unless t forces the order on or off.
func (t msDeformTuning) sortsQueries(s msDeformShape) bool {
	if t.order != 0 {
		return t.order > 0
	}
	return s.sortsQueries()
}

// orderBandRows is the rows of level 0 a band of orderGrid's cells spans.
func (t msDeformTuning) orderBandRows() int {
	if t.bandRows > 0 {
		return t.bandRows
	}
	return msDeformOrderBandRows
}

// msDeformKernelFor picks the kernel (msDeformDefaults). Forward kernels
// load 16 bytes of channels per lane when D and the addresses allow it, and
// share each point's taps across the group with shuffles, queries fastest;
// float32's has registers capped for 5 blocks per SM. Backward kernels take
// 4 channels per lane, a group apart (so a group's atomics still cover
// consecutive floats), and reduce-scatter the location and weight sums of 4
// points at a time across the group (about 3 shuffles per point instead of
// 15), heads fastest (concurrent atomics hit different addresses);
// float32's has registers capped for 3 blocks per SM. Each was the fastest
// of msdeform.cu's variants of its pass on the TARGETS cases
// (BenchmarkGPUMSDeformAttnVariants, on an H200; BENCHMARKS.md also has an
// H100 run where the uncapped forward, msdeform_fwd_v16b_f32, won).
//
// sorted (sortsQueries; forward only) picks the _sorted twin of the forward
// kernel, which takes the queries in spatial order (queryOrder). For
// float32 with 16 bytes per lane that twin has no register cap: with the
// order lookup, the capped one was slower.
//
// quad says whether the GPU runs msdeform_sm90a.cu (msDeformQuad): there the
// float32 backward is msDeformQuadBackward when D and the alignment allow,
// one 16-byte reduction per corner instead of 4 scalar atomics, faster than
// every msdeform.cu backward and than its own variants (other register
// caps, 8 points per reduce-scatter).
func msDeformKernelFor(backward bool, dt tensor.Dtype, d int, aligned, quad, sorted bool) (msDeformKernel, error) {
	ks, ok := msDeformDefaults[dt]
	if !ok {
		return msDeformKernel{}, fmt.Errorf("no kernel for %v", dt)
	}
	if backward {
		if dt == tensor.Float32 && quad && d%4 == 0 && aligned {
			return msDeformKernel{k: msDeformQuadBackward, vec: 4}, nil
		}
		return msDeformKernel{k: ks.bwd, vec: 4}, nil
	}
	vec := 16 / int(dt.Size())
	switch {
	case d%vec != 0 || !aligned:
		if sorted {
			return msDeformKernel{k: ks.fwdScalarSorted, vec: 1, sorted: true}, nil
		}
		return msDeformKernel{k: ks.fwdScalar, vec: 1}, nil
	case sorted:
		return msDeformKernel{k: ks.fwdSorted, vec: vec, sorted: true}, nil
	}
	return msDeformKernel{k: ks.fwd, vec: vec}, nil
}

// msDeformQuad reports whether dev runs msdeform_sm90a.cu's kernels
// (sm90aError).
func msDeformQuad(dev *backend.Device) bool {
	return sm90aError(dev, msDeformQuadBackward.Module(), msDeformQuadBackward.Name()) == nil
}

// msDeformGroup is the number of lanes that share one (n, q, m): the number
// of vec-channel pieces of D, rounded up to a power of two, at most a warp,
// so that groups tile warps exactly.
func msDeformGroup(d, vec int) int {
	pieces := (d + vec - 1) / vec
	g := 1
	for g < pieces && g < 32 {
		g *= 2
	}
	return g
}

// deviceLevels uploads the level table the kernels read when there are more
// levels than travel with the launch: int32 (H, W, first pixel) per level.
// The caller frees it after the launch (the stream orders the free after the
// kernel).
func (s msDeformShape) deviceLevels(op string, dev *backend.Device) (*tensor.Dense, backend.DevicePtr, error) {
	table := make([]int32, 0, 3*len(s.levels))
	start := 0
	for _, lv := range s.levels {
		table = append(table, int32(lv.H), int32(lv.W), int32(start))
		start += lv.H * lv.W
	}
	t, err := dev.ToDevice(tensor.New(tensor.WithShape(len(s.levels), 3), tensor.WithBacking(table)))
	if err != nil {
		return nil, 0, fmt.Errorf("ops: %s: levels: %w", op, err)
	}
	p, err := dev.Ptr(t)
	if err != nil {
		return nil, 0, fmt.Errorf("ops: %s: levels: %w", op, err)
	}
	return t, p, nil
}

// launch runs the forward or backward kernel with args' pointers filled in
// by the caller.
func (s msDeformShape) launch(op string, dev *backend.Device, backward bool, args cuda.MSDeformParams) error {
	if err := fitsInt32(op, namedSize{"N", s.n}, namedSize{"S", s.s}, namedSize{"M", s.m}, namedSize{"D", s.d},
		namedSize{"Lq", s.lq}, namedSize{"L", s.l}, namedSize{"P", s.p},
		// The bytes between two pixels of value (the _rs kernels address
		// pixels with 32x32-bit multiplies).
		namedSize{"M*D*size", s.m * s.d * int(s.dt.Size())}); err != nil {
		return err
	}
	// Vector loads need 16-byte aligned value and output rows (forward),
	// vector reductions a 16-byte aligned grad_value (backward; the other
	// pointer is 0).
	aligned := (args.Value|args.Out|args.GradValue)%16 == 0
	quad := backward && s.dt == tensor.Float32 && s.d%4 == 0 && aligned && msDeformQuad(dev)
	tuning := msDeformTuningOf(dev)
	kv, err := tuning.kernelFor(backward, s.dt, s.d, aligned, quad, !backward && tuning.sortsQueries(s))
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	// Loaded first, so that a kernel this build lacks fails before the
	// sort's launches are queued.
	if _, err := kv.k.Load(dev); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	if kv.sorted {
		order, err := s.queryOrder(op, dev, args.Loc, tuning.orderBandRows())
		if err != nil {
			return err
		}
		// The stream orders the free after the kernel below.
		defer dev.FreeDense(order)
		if args.Order, err = dev.Ptr(order); err != nil {
			return fmt.Errorf("ops: %s: %w", op, err)
		}
	}
	if s.l <= cuda.MSDeformInlineLevels {
		start := 0
		for i, lv := range s.levels {
			args.InlineLevels[3*i], args.InlineLevels[3*i+1], args.InlineLevels[3*i+2] = int32(lv.H), int32(lv.W), int32(start)
			start += lv.H * lv.W
		}
	} else {
		levels, levelsPtr, err := s.deviceLevels(op, dev)
		if err != nil {
			return err
		}
		defer dev.FreeDense(levels)
		args.Levels = levelsPtr
	}
	group := msDeformGroup(s.d, kv.vec)
	args.N, args.S, args.M, args.D = int32(s.n), int32(s.s), int32(s.m), int32(s.d)
	args.Lq, args.L, args.P, args.Group = int32(s.lq), int32(s.l), int32(s.p), int32(group)
	threads := int64(s.n) * int64(s.lq) * int64(s.m) * int64(group)
	blocks := (threads + cuda.MSDeformBlock - 1) / cuda.MSDeformBlock
	if blocks > 1<<31-1 {
		return fmt.Errorf("ops: %s: %d blocks exceed the grid limit", op, blocks)
	}
	cfg := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(blocks), Y: 1, Z: 1},
		Block: backend.Dim3{X: cuda.MSDeformBlock, Y: 1, Z: 1},
	}
	if err := kv.k.Launch(dev, cfg, args); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// forwardDevice is MSDeformAttn's device launcher.
func (s msDeformShape) forwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	args := cuda.MSDeformParams{Value: a.ptr[0], Loc: a.ptr[1], Weight: a.ptr[2], Out: outPtr}
	if err := s.launch(msDeformName, a.dev, false, args); err != nil {
		return nil, err
	}
	return out, nil
}

// msDeformOrderBandRows is the rows of level 0 a band of the query
// order's cells spans: bands of 8 rows give the 32 queries of a forward
// block a region about as tall as it is wide. Of 2, 4, 8 and 16 rows, 8
// timed best on seed_full (BenchmarkGPUMSDeformAttnQueryOrder), if only by
// a little, in every session that compared them.
const msDeformOrderBandRows = 8

// msDeformOrderMin is the fewest queries per image for which the forward
// takes them in spatial order. The sort costs three launches, about as
// long whatever the count; it paid on seed_full's 15422 queries (see
// sortsQueries). Below it the forward is short and its blocks are few
// enough to be resident at once, so there is little for the order to win:
// detr_decoder's 300 queries ran slower sorted.
const msDeformOrderMin = 4096

// sortsQueries reports whether the forward takes each image's queries in
// spatial order (msdeform_sort_cells): with Lq >= msDeformOrderMin, unless
// every pixel is a query (Lq == S: an encoder's self-attention, whose
// queries come in pixel order already, and ran slower sorted by the op).
// seed_full's queries (reference points uniform over the map) ran faster
// sorted by the op, the sort included (BenchmarkGPUMSDeformAttnQueryOrder).
// The backward gained nothing from presorted queries and does not sort.
func (s msDeformShape) sortsQueries() bool {
	return s.lq >= msDeformOrderMin && s.lq != s.s
}

// orderGrid is the grid of cells the query order sorts by: bands of rows
// rows of level 0 (msDeformOrderBandRows unless a test or benchmark says
// otherwise: msDeformTuning.orderBandRows) and one column per pixel,
// columns merged in pairs (then bands, if ever needed) until it has at most
// cuda.MSDeformOrderCells cells (msdeform_sort_scan's shared memory).
func (s msDeformShape) orderGrid(rows int) (bands, cols int) {
	bands, cols = max(1, ceilDiv(s.levels[0].H, rows)), max(1, s.levels[0].W)
	for bands*cols > cuda.MSDeformOrderCells {
		if cols > 1 {
			cols = ceilDiv(cols, 2)
		} else {
			bands = ceilDiv(bands, 2)
		}
	}
	return bands, cols
}

// queryOrder queues msdeform_sort_cells, _scan and _place: a new int32
// device tensor, which the caller frees, whose first N*Lq elements hold,
// for each image, the order in which the forward takes its queries (the
// rest is the sort's scratch: each query's cell, each cell's next free
// position). The cells are orderGrid(rows)'s.
func (s msDeformShape) queryOrder(op string, dev *backend.Device, loc backend.DevicePtr, rows int) (*tensor.Dense, error) {
	if err := fitsInt32(op, namedSize{"Lq", s.lq}, namedSize{"M*L*P*2", s.m * s.l * s.p * 2}); err != nil {
		return nil, err
	}
	cells, err := cuda.MSDeformSortCells(s.dt)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: query order: %w", op, err)
	}
	queries := int64(s.n) * int64(s.lq)
	blocks := (queries + cuda.MSDeformBlock - 1) / cuda.MSDeformBlock
	if blocks > 1<<31-1 {
		return nil, fmt.Errorf("ops: %s: query order: %d blocks exceed the grid limit", op, blocks)
	}
	bands, cols := s.orderGrid(rows)
	t, err := dev.NewDense(tensor.Int32, 2*s.n*s.lq+s.n*bands*cols)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: query order: %w", op, err)
	}
	args := cuda.MSDeformOrderParams{Loc: loc, N: int32(s.n), Lq: int32(s.lq), Stride: int32(s.m * s.l * s.p * 2),
		Bands: int32(bands), Cols: int32(cols)}
	perQuery := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(blocks), Y: 1, Z: 1},
		Block: backend.Dim3{X: cuda.MSDeformBlock, Y: 1, Z: 1},
	}
	perImage := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(s.n), Y: 1, Z: 1},
		Block: backend.Dim3{X: cuda.MSDeformOrderThreads, Y: 1, Z: 1},
	}
	if args.Order, err = dev.Ptr(t); err == nil {
		args.Cells = args.Order + backend.DevicePtr(4*queries)
		args.Starts = args.Cells + backend.DevicePtr(4*queries)
		for _, l := range []struct {
			k   cuda.Kernel[cuda.MSDeformOrderParams]
			cfg backend.LaunchConfig
		}{{cells, perQuery}, {cuda.MSDeformSortScan, perImage}, {cuda.MSDeformSortPlace, perQuery}} {
			if err = l.k.Launch(dev, l.cfg, args); err != nil {
				break
			}
		}
	}
	if err != nil {
		_ = dev.FreeDense(t)
		return nil, fmt.Errorf("ops: %s: query order: %w", op, err)
	}
	return t, nil
}

// backwardDevice is MSDeformAttn backward's device launcher: the packed
// output's three parts are the kernel's three gradients.
func (s msDeformShape) backwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = msDeformGradName
	packed, packedPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	args := cuda.MSDeformParams{Value: a.ptr[0], Loc: a.ptr[1], Weight: a.ptr[2], GradOut: a.ptr[3]}
	size := backend.DevicePtr(s.dt.Size())
	nv, nl := s.valueShape().TotalSize(), s.locShape().TotalSize()
	args.GradValue = packedPtr
	args.GradLoc = packedPtr + backend.DevicePtr(nv)*size
	args.GradWeight = args.GradLoc + backend.DevicePtr(nl)*size
	// Only the value gradient is a scatter that needs zeroing: the kernel
	// writes every location and weight gradient.
	var zero any = float64(0)
	if s.dt == tensor.Float32 {
		zero = float32(0)
	}
	if err := a.dev.Engine().Memset(backend.Memory{Ptr: packedPtr, Size: int64(nv) * int64(size)}, zero); err != nil {
		return nil, fmt.Errorf("ops: %s: %w", name, err)
	}
	if err := s.launch(name, a.dev, true, args); err != nil {
		return nil, err
	}
	return packed, nil
}
