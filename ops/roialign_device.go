package ops

import (
	"fmt"
	"math"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// roiAlignTileBins is tile_bins in roialign.cu: bins per output tile.
func roiAlignTileBins(dt tensor.Dtype) int {
	if dt == tensor.Float64 {
		return cuda.RoIAlignTileBinsF64
	}
	return cuda.RoIAlignTileBinsF32
}

// roiAlignPicker is a picker of kernels/cuda for a float32 / float64 pair
// of RoIAlign kernels (cuda.RoIAlignFwdNHWCSep).
type roiAlignPicker = func(tensor.Dtype) (cuda.Kernel[cuda.RoIAlignParams], error)

// roiAlignPick is pick's kernel for dt. The op takes float32 and float64
// only; for another dtype it returns no kernel, which fails to load.
func roiAlignPick(dt tensor.Dtype, pick roiAlignPicker) cuda.Kernel[cuda.RoIAlignParams] {
	k, _ := pick(dt)
	return k
}

// transposeLaunch queues the transpose of n planes of a x b elements (NCHW
// to NHWC with a=C, b=H*W; back with a=H*W, b=C).
func transposeLaunch(op string, dev *backend.Device, dt tensor.Dtype, in, out backend.DevicePtr, n, a, b int) error {
	if n == 0 || a == 0 || b == 0 {
		return nil
	}
	k, err := cuda.TransposePlanes(dt)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	tb := cuda.TransposeTileColsF32
	if dt == tensor.Float64 {
		tb = cuda.TransposeTileColsF64
	}
	cfg := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(ceilDiv(b, tb)), Y: uint32(ceilDiv(a, cuda.TransposeTileRows)), Z: uint32(n)},
		Block: backend.Dim3{X: cuda.TransposeTileRows, Y: cuda.TransposeBlockY, Z: 1},
	}
	if err := k.Launch(dev, cfg, cuda.TransposeParams{In: in, Out: out, A: int32(a), B: int32(b)}); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// roiAlignKernelKey keys, on a Device, the kernel of roialign.cu that tests
// and benchmarks choose for one direction instead of roiAlignKernelFor's.
type roiAlignKernelKey struct{ backward bool }

// roiAlignKernelOn is the kernel for s on dev: the one chosen for dev, if
// any, else roiAlignKernelFor's.
func roiAlignKernelOn(dev *backend.Device, backward bool, s roiAlignShape, quad bool) roiAlignKernel {
	if kv, ok := dev.Value(roiAlignKernelKey{backward}).(roiAlignKernel); ok {
		return kv
	}
	return roiAlignKernelFor(backward, s, quad)
}

// roiAlignKernel is a forward or backward kernel of roialign.cu (or
// roialign_sm90a.cu) and its launch shape. A kernel with channels-last
// input (nhwc) needs the transpose first and takes the RoIs in spatial
// order; roialign_fwd_nchw_bin_c<cpt> (cpt > 0 channels per thread) reads
// NCHW x directly, a grid of (K, channel blocks), and so does
// roialign_fwd_nchw_cols (cols), a grid of (K, slices of the channels; 0:
// colsSlices). roialign_fwd_nhwc_sep_vec4 runs blocks of chunk bins of a
// RoI (0: a tile's worth, roiAlignTileBins) and of one of its slices of
// the channels (0: one).
type roiAlignKernel struct {
	k      cuda.Kernel[cuda.RoIAlignParams]
	cpt    int
	cols   bool
	cm     bool // roialign_fwd_nchw_cols' channel-major kernel (_cmajor)
	chunk  int
	slices int
}

// String names the kernel and its launch shape, as benchmarks and tests
// name their runs: name[_chunk<chunk>][_slices<slices>].
func (kv roiAlignKernel) String() string {
	s := kv.k.Name()
	if kv.chunk > 0 {
		s += fmt.Sprintf("_chunk%d", kv.chunk)
	}
	if kv.slices > 0 {
		s += fmt.Sprintf("_slices%d", kv.slices)
	}
	return s
}

// nchw reports whether the kernel reads NCHW x directly.
func (kv roiAlignKernel) nchw() bool { return kv.cpt > 0 || kv.cols }

// roialign_fwd_nchw_cols' kernels by sampling ratio (1 to
// cuda.RoIAlignColsMaxS), row-major and channel-major.
var (
	roiAlignCols = [cuda.RoIAlignColsMaxS]roiAlignPicker{
		cuda.RoIAlignFwdNCHWColsS1, cuda.RoIAlignFwdNCHWColsS2, cuda.RoIAlignFwdNCHWColsS3, cuda.RoIAlignFwdNCHWColsS4,
	}
	roiAlignColsCMajor = [cuda.RoIAlignColsMaxS]roiAlignPicker{
		cuda.RoIAlignFwdNCHWColsS1CMajor, cuda.RoIAlignFwdNCHWColsS2CMajor, cuda.RoIAlignFwdNCHWColsS3CMajor,
		cuda.RoIAlignFwdNCHWColsS4CMajor,
	}
)

// roiAlignColsKernel is roialign_fwd_nchw_cols for s, which it must fit
// (colsFit): the kernel for its sampling ratio (_s<ratio>; cm:
// channel-major, _cmajor), with the channels in slices slices (0:
// colsSlices).
func roiAlignColsKernel(s roiAlignShape, cm bool, slices int) roiAlignKernel {
	pick := roiAlignCols[s.cfg.SamplingRatio-1]
	if cm {
		pick = roiAlignColsCMajor[s.cfg.SamplingRatio-1]
	}
	return roiAlignKernel{k: roiAlignPick(s.dt, pick), cols: true, cm: cm, slices: slices}
}

// colsFit reports whether roialign_fwd_nchw_cols takes s: a fixed sampling
// ratio of at most cuda.RoIAlignColsMaxS, a bin row's sample columns
// (PooledW times the ratio) within a warp's 32 lanes, at most
// cuda.RoIAlignColsMaxRows sample rows (its _cmajor kernels' table), maps
// of at least 2x2 (its 2x2 loads stay inside) whose bytes fit 32 bits (its
// tap offsets).
func (s roiAlignShape) colsFit() bool {
	r := s.cfg.SamplingRatio
	return r >= 1 && r <= cuda.RoIAlignColsMaxS && s.cfg.PooledW*r <= 32 && s.cfg.PooledH*r <= cuda.RoIAlignColsMaxRows &&
		s.h >= 2 && s.w >= 2 && int64(s.h)*int64(s.w)*int64(s.dt.Size()) <= math.MaxUint32
}

// colsSlices is the number of slices of the channels (grid y) that
// roialign_fwd_nchw_cols takes them in, for its row-major or channel-major
// (cm) kernel. Blocks run RoI fastest, so the blocks running together read
// one slice of the maps. Both rules ask for at least roiAlignColsBlocks
// blocks in all, a few waves, so that RoIs of unequal cost even out.
//
// Row-major: slices of at most roiAlignColsSliceBytes, which L2 holds
// (fewer slices leave the running blocks' maps out of L2, many more make
// too many small blocks).
//
// Channel-major: slices of about roiAlignColsCMItems (bin row, group of
// channels) items a block, 14 a warp: enough to pay for the block's setup
// (the RoI's geometry and its table of sample rows), few enough that the
// blocks even out. (BenchmarkGPURoIAlignVariants times the kernels with
// other counts.)
func (s roiAlignShape) colsSlices(cm bool) int {
	slots := max(1, 32/(s.cfg.PooledW*max(s.cfg.SamplingRatio, 1))) // channels a warp reads at once
	groups := ceilDiv(s.c, slots)
	want := ceilDiv(roiAlignColsBlocks, max(s.k, 1))
	if cm {
		want = max(want, ceilDiv(groups*s.cfg.PooledH, roiAlignColsCMItems))
	} else {
		bytes := s.n * s.c * s.h * s.w * int(s.dt.Size())
		want = max(want, ceilDiv(bytes, roiAlignColsSliceBytes))
	}
	return max(1, min(want, groups, 65535))
}

const (
	roiAlignColsSliceBytes = 9 << 20
	roiAlignColsBlocks     = 3072
	roiAlignColsCMItems    = 112
	// Maps above this many bytes take roialign_fwd_nchw_cols' channel-major
	// kernels (roiAlignKernelFor).
	roiAlignColsCMBytes = 64 << 20
)

// roiAlignKernelFor picks the kernel, by BenchmarkGPURoIAlignVariants on
// an H200 (TARGETS.md cases; BENCHMARKS.md has the table). With a fixed
// sampling ratio, forward reads NCHW directly (the transpose alone cost a
// quarter of the channels-last path's time): lanes on sample columns where
// a bin row's samples fit a warp (float32), else a thread a bin and 4
// channels; backward scatters tap by tap into channels-last (but see
// quad). With adaptive sampling, about one sample per pixel, both go
// channels-last and separable, which touches each pixel of a bin once
// instead of once per tap; forward in float32 with C % 4 == 0, with
// 16-byte loads (sepVec4Forward).
//
// quad says whether the GPU runs roialign_sm90a.cu (roiAlignQuad): there
// the float32 backward is roialign_bwd_nhwc_sep_red4_f32 when C % 4 == 0,
// separable with any sampling ratio: it beat the tap-by-tap
// roialign_bwd_nhwc_taps_red4_f32 (itself faster than scalar atomics) on
// every TARGETS.md case, and so did its pairs of bins against one bin at a
// time.
func roiAlignKernelFor(backward bool, s roiAlignShape, quad bool) roiAlignKernel {
	adaptive := s.cfg.SamplingRatio <= 0
	switch {
	case adaptive && !backward && s.dt == tensor.Float32 && s.c%4 == 0:
		return s.sepVec4Forward()
	case adaptive && !backward:
		return roiAlignKernel{k: roiAlignPick(s.dt, cuda.RoIAlignFwdNHWCSep)}
	case backward && quad && s.dt == tensor.Float32 && s.c%4 == 0:
		return roiAlignKernel{k: cuda.RoIAlignBwdNHWCSepRed4F32}
	case adaptive && backward:
		return roiAlignKernel{k: roiAlignPick(s.dt, cuda.RoIAlignBwdNHWCSepAtomic)}
	case backward:
		return roiAlignKernel{k: roiAlignPick(s.dt, cuda.RoIAlignBwdNHWCTapsAtomic)}
	}
	if s.dt == tensor.Float32 && s.colsFit() {
		// Lanes on sample columns, channel-major (_cmajor) where the maps
		// are larger than roiAlignColsCMBytes (there its bin rows' shared
		// pixel rows are still in L1; on smaller maps row-major was as
		// fast or faster).
		bytes := s.n * s.c * s.h * s.w * int(s.dt.Size())
		cm := bytes > roiAlignColsCMBytes
		return roiAlignColsKernel(s, cm, s.colsSlices(cm))
	}
	if s.dt == tensor.Float32 {
		// Registers capped for 4 blocks per SM instead of 3 (faster); for 5
		// or 6 blocks it spills or loses (BENCHMARKS.md).
		return roiAlignKernel{k: cuda.RoIAlignFwdNCHWBinC4Occ4F32, cpt: 4}
	}
	return roiAlignKernel{k: cuda.RoIAlignFwdNCHWBinC4F64, cpt: 4}
}

// sepVec4Forward is the float32 separable forward with 16-byte loads for s
// (C % 4 == 0; roialign_fwd_nhwc_sep_vec4_occ4_f32), registers capped for
// 4 blocks per SM (the uncapped kernel, 2 blocks per SM, was slower). The
// channels go in slices whose part of the channels-last input is at most
// roiAlignForwardSliceBytes (grid z, the slowest: the blocks running
// together read a part that L2 holds, where without slices most reads went
// to DRAM), and a block takes a whole RoI's bins when its warps' tiles hold
// them (with fewer channel groups than warps, the warps of a group split
// the bins).
func (s roiAlignShape) sepVec4Forward() roiAlignKernel {
	groups := ceilDiv(s.c, 32)
	perGroup := s.n * s.h * s.w * 32 * int(s.dt.Size()) // input bytes of 32 channels
	perSlice := max(1, min(groups, roiAlignForwardSliceBytes/max(perGroup, 1)))
	warpsPerGroup := max(1, cuda.RoIAlignWarps/perSlice)
	return roiAlignKernel{
		k:      cuda.RoIAlignFwdNHWCSepVec4Occ4F32,
		chunk:  min(s.cfg.PooledH*s.cfg.PooledW, roiAlignTileBins(s.dt)*warpsPerGroup),
		slices: ceilDiv(groups, perSlice),
	}
}

// roiAlignForwardSliceBytes bounds a channel slice of sepVec4Forward's
// input, well within an H200's 50 MB of L2 (on box_head_P2_adaptive,
// slices of 17 MB were faster than slices of 34 MB).
const roiAlignForwardSliceBytes = 24 << 20

// roiAlignQuad reports whether dev runs roialign_sm90a.cu's kernels
// (sm90aError): float32 backwards where each lane adds 4 consecutive
// channels of a pixel with one 16-byte vector reduction (sm_90 only, PTX
// ISA 8.1), tap by tap or separably (the taps of two neighbouring bins
// that share a pixel are summed first: fewer reductions; sep_pair_quad in
// roialign.cu). They need C % 4 == 0 (16-byte aligned pixels in the
// channels-last gradient, which the op allocates).
func roiAlignQuad(dev *backend.Device) bool {
	k := cuda.RoIAlignBwdNHWCSepRed4F32
	return sm90aError(dev, k.Module(), k.Name()) == nil
}

// launchRoIAlign runs kernel kv on feat (x, or the channels-last gradient
// being scattered into) and pooled (out, or the gradient of out). zero, if
// not nil, is zeroed first: by roialign_sort_rois' launch when it runs (its
// other blocks zero while one sorts), else on its own.
func (s roiAlignShape) launchRoIAlign(dev *backend.Device, kv roiAlignKernel, backward bool, feat, rois, pooled backend.DevicePtr, zero *tensor.Dense) error {
	name := s.opName(backward)
	p := s.params()
	if err := fitsInt32(name, namedSize{"N", p.N}, namedSize{"C", p.C}, namedSize{"K", p.K}, namedSize{"H*W", p.H * p.W}, namedSize{"H*W*C", p.H * p.W * p.C}); err != nil {
		return err
	}
	if p.K == 0 {
		return nil
	}
	if kv.cols && (!s.colsFit() || roiAlignColsKernel(s, kv.cm, 0).k != kv.k) {
		return fmt.Errorf("ops: %s: kernel %s does not take sampling ratio %d with PooledW %d", name, kv.k.Name(), p.SamplingRatio, p.PooledW)
	}
	statusPtr, err := dev.StatusWord()
	if err != nil {
		return fmt.Errorf("ops: %s: %w", name, err)
	}
	// A bad RoI is reported by the next call that waits for the GPU (or by
	// this launch under STHENO_CUDA_SYNC), not by a round trip per launch.
	dev.WatchStatus(func(code int32) error { return s.statusError(name, code) })
	args := cuda.RoIAlignParams{
		Feat: feat, RoIs: rois, Pooled: pooled, Status: statusPtr,
		SpatialScale: p.SpatialScale,
		N:            int32(p.N), C: int32(p.C), H: int32(p.H), W: int32(p.W), K: int32(p.K),
		PooledH: int32(p.PooledH), PooledW: int32(p.PooledW),
		SamplingRatio: int32(p.SamplingRatio), Aligned: boolInt32(p.Aligned),
		MaxAdaptiveGrid: kernels.MaxAdaptiveGrid,
	}
	if s.level != nil {
		args.LevelFilter, args.LevelLo, args.LevelHi = 1, s.level.Lo, s.level.Hi
	}
	if !kv.nchw() && p.K >= roiOrderMin && p.K <= cuda.RoIAlignSortMax {
		order, zeroed, err := s.roiOrder(name, dev, rois, zero)
		if err != nil {
			return err
		}
		// The stream orders the free after the kernel below.
		defer dev.FreeDense(order)
		if args.Order, err = dev.Ptr(order); err != nil {
			return fmt.Errorf("ops: %s: %w", name, err)
		}
		if zeroed {
			zero = nil
		}
	}
	if zero != nil {
		if err := dev.Zero(zero); err != nil {
			return fmt.Errorf("ops: %s: %w", name, err)
		}
	}
	// Channels-last: blocks (RoI, chunk of bins) whose warps share out the
	// channels; a chunk is a tile of the kernel's output staging.
	cfg := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(p.K), Y: uint32(ceilDiv(p.PooledH*p.PooledW, roiAlignTileBins(s.dt))), Z: 1},
		Block: backend.Dim3{X: cuda.RoIAlignThreads, Y: 1, Z: 1},
	}
	if backward {
		cfg.Grid.Z = uint32(s.slices())
	} else {
		if kv.chunk > 0 {
			cfg.Grid.Y = uint32(ceilDiv(p.PooledH*p.PooledW, kv.chunk))
		}
		if kv.slices > 0 {
			cfg.Grid.Z = uint32(kv.slices)
		}
	}
	if kv.cols {
		// Blocks of (RoI, slice of the channels), 8 warps.
		slices := kv.slices
		if slices <= 0 {
			slices = s.colsSlices(kv.cm)
		}
		cfg.Grid.Y, cfg.Grid.Z = uint32(slices), 1
	}
	if kv.cpt > 0 {
		// NCHW: blocks of whole groups of bins (phases of them, up to
		// cuda.RoIAlignThreads threads), each group on kv.cpt channels.
		bins := p.PooledH * p.PooledW
		phases := max(1, cuda.RoIAlignThreads/bins)
		threads := min(ceilDiv(bins*phases, 32)*32, cuda.RoIAlignThreads)
		cfg.Grid.Y = uint32(ceilDiv(p.C, phases*kv.cpt))
		cfg.Block.X = uint32(threads)
	}
	if err := kv.k.Launch(dev, cfg, args); err != nil {
		return fmt.Errorf("ops: %s: %w", name, err)
	}
	return nil
}

// roiAlignSlicesOverride, when positive (benchmarks), sets the channel
// slices of the backward scatters instead of slices.
var roiAlignSlicesOverride int

// slices is the number of channel slices (grid z) the backward scatter
// kernels take the channels in: blocks of slice z run after those of
// slice z-1, so the part of the channels-last gradient being scattered into
// at once is 1/slices of it, at most roiAlignSliceBytes. On an H200 (50 MB
// of L2; BenchmarkGPURoIAlignSlices) the 137 MB gradients of box_head_P2
// and mask_head_P2 gained from 2 slices with the tap-by-tap kernels, lost
// with more, and roialign_bwd_nhwc_sep_red4_f32, which adds fewer times,
// is as fast with 1 or 2; any slicing slows infer_1000_P3's 17 MB.
func (s roiAlignShape) slices() int {
	if roiAlignSlicesOverride > 0 {
		return roiAlignSlicesOverride
	}
	bytes := s.n * s.h * s.w * s.c * int(s.dt.Size())
	return max(1, min(ceilDiv(bytes, roiAlignSliceBytes), ceilDiv(s.c, 32), 65535))
}

// roiAlignSliceBytes bounds a channel slice of the backward's gradient.
const roiAlignSliceBytes = 96 << 20

// roiOrderZeroBlocks caps the blocks of roialign_sort_rois' launch that
// zero.
const roiOrderZeroBlocks = 256

// roiOrderMin is the fewest RoIs for which the channels-last kernels take
// them in spatial order (roialign_sort_rois; one block sorts at most
// cuda.RoIAlignSortMax). Below it the blocks fit the GPU at once and there
// is little for the order to win (a judgment, not measured).
const roiOrderMin = 64

// roiOrder queues roialign_sort_rois: a new int32 [K] device tensor, which
// the caller frees, of the RoIs in spatial order. The same launch zeroes
// zero (if not nil) when it can, 16 bytes a store, and says so: one block
// sorts while the others zero (one launch instead of a memset and then the
// sort).
func (s roiAlignShape) roiOrder(op string, dev *backend.Device, rois backend.DevicePtr, zero *tensor.Dense) (order *tensor.Dense, zeroed bool, err error) {
	order, err = dev.NewDense(tensor.Int32, s.k)
	if err != nil {
		return nil, false, fmt.Errorf("ops: %s: RoI order: %w", op, err)
	}
	args := cuda.RoIOrderParams{RoIs: rois, SpatialScale: s.cfg.SpatialScale, K: int32(s.k)}
	cfg := backend.LaunchConfig{Grid: backend.Dim3{X: 1, Y: 1, Z: 1}, Block: backend.Dim3{X: cuda.RoIAlignSortThreads, Y: 1, Z: 1}}
	if args.Order, err = dev.Ptr(order); err == nil && zero != nil {
		var zp backend.DevicePtr
		if zp, err = dev.Ptr(zero); err == nil {
			bytes := int64(zero.DataSize()) * int64(zero.Dtype().Size())
			if zp%16 == 0 && bytes%16 == 0 && bytes > 0 {
				args.Zero, args.ZeroBytes, zeroed = zp, bytes, true
				cfg.Grid.X += uint32(min(ceilDiv(int(bytes/16), cuda.RoIAlignSortThreads), roiOrderZeroBlocks))
			}
		}
	}
	if err == nil {
		var k cuda.Kernel[cuda.RoIOrderParams]
		if k, err = cuda.RoIAlignSortRoIs(s.dt); err == nil {
			err = k.Launch(dev, cfg, args)
		}
	}
	if err != nil {
		_ = dev.FreeDense(order)
		return nil, false, fmt.Errorf("ops: %s: RoI order: %w", op, err)
	}
	return order, zeroed, nil
}

// channelsLast returns a scratch device tensor [N,H,W,C] for the kernels.
func (s roiAlignShape) channelsLast(op string, dev *backend.Device) (*tensor.Dense, backend.DevicePtr, error) {
	t, err := dev.NewDense(s.dt, s.n, s.h, s.w, s.c)
	if err != nil {
		return nil, 0, fmt.Errorf("ops: %s: channels-last scratch: %w", op, err)
	}
	p, err := dev.Ptr(t)
	if err != nil {
		return nil, 0, fmt.Errorf("ops: %s: %w", op, err)
	}
	return t, p, nil
}

// statusError explains the status code roialign.cu raises for bad RoIs
// (Status in bilinear.cuh).
func (s roiAlignShape) statusError(op string, code int32) error {
	switch code {
	case cuda.RoIAlignStatusBadBatchIndex:
		return fmt.Errorf("ops: %s: a RoI has a batch index outside [0, %d) or NaN; its outputs are zero", op, s.n)
	case cuda.RoIAlignStatusAdaptiveGridTooLarge:
		return fmt.Errorf("ops: %s: a RoI needs more than %d samples per bin side with adaptive sampling: use a fixed SamplingRatio", op, kernels.MaxAdaptiveGrid)
	}
	return nil
}

// forwardDevice is RoIAlign's device launcher.
func (op roiAlignShape) forwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if err := op.forwardInto(a.dev, a.ptr[0], a.ptr[1], outPtr); err != nil {
		return nil, err
	}
	return out, nil
}

// forwardInto queues the forward of op from x and rois into out.
func (op roiAlignShape) forwardInto(dev *backend.Device, x, rois, out backend.DevicePtr) error {
	name := op.opName(false)
	if op.k == 0 {
		return nil
	}
	kv := roiAlignKernelOn(dev, false, op, false)
	if kv.nchw() {
		return op.launchRoIAlign(dev, kv, false, x, rois, out, nil)
	}
	xt, xtPtr, err := op.channelsLast(name, dev)
	if err != nil {
		return err
	}
	// The stream orders this free after the kernels that read xt.
	defer dev.FreeDense(xt)
	if err := transposeLaunch(name, dev, op.dt, x, xtPtr, op.n, op.c, op.h*op.w); err != nil {
		return err
	}
	return op.launchRoIAlign(dev, kv, false, xtPtr, rois, out, nil)
}

// backwardDevice is RoIAlign backward's device launcher.
func (op roiAlignShape) backwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	gx, gxPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if err := op.backwardInto(a.dev, a.ptr[0], a.ptr[1], gx, gxPtr); err != nil {
		return nil, err
	}
	return gx, nil
}

// backwardInto queues the backward of op from rois and gy into gx (at
// gxPtr), which it zeroes first.
func (op roiAlignShape) backwardInto(dev *backend.Device, rois, gy backend.DevicePtr, gx *tensor.Dense, gxPtr backend.DevicePtr) error {
	name := op.opName(true)
	if op.k == 0 {
		// Nothing to scatter: the op still owes a zeroed gradient.
		if err := dev.Zero(gx); err != nil {
			return fmt.Errorf("ops: %s: %w", name, err)
		}
		return nil
	}
	// The kernel scatters with atomicAdd into a channels-last gradient the
	// op zeroes itself (callers never pre-zero), then transposes it back.
	gt, gtPtr, err := op.channelsLast(name, dev)
	if err != nil {
		return err
	}
	defer dev.FreeDense(gt)
	quad := op.dt == tensor.Float32 && op.c%4 == 0 && gtPtr%16 == 0 && roiAlignQuad(dev)
	if err := op.launchRoIAlign(dev, roiAlignKernelOn(dev, true, op, quad), true, gtPtr, rois, gy, gt); err != nil {
		return err
	}
	return transposeLaunch(name, dev, op.dt, gtPtr, gxPtr, op.n, op.h*op.w, op.c)
}
