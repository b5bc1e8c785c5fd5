package ops

import (
	"fmt"
	"math"
	"strings"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
)

// roiAlignArgs mirrors RoIAlignParams in kernels/roialign.cu field for field.
type roiAlignArgs struct {
	Feat, RoIs, Pooled, Status backend.DevicePtr
	Order                      backend.DevicePtr
	SpatialScale               float64
	N, C, H, W, K              int32
	PooledH, PooledW           int32
	SamplingRatio              int32
	Aligned                    int32
	MaxAdaptiveGrid            int32
}

// transposeArgs mirrors TransposeParams in kernels/roialign.cu.
type transposeArgs struct {
	In, Out backend.DevicePtr
	A, B    int32
}

const roiAlignBlock = 256 // kWarps warps of roialign.cu

// roiAlignTileBins is tile_bins in roialign.cu: bins per output tile.
func roiAlignTileBins(dt tensor.Dtype) int {
	if dt == tensor.Float64 {
		return 16
	}
	return 32
}

// transposeLaunch queues the transpose of n planes of a x b elements (NCHW
// to NHWC with a=C, b=H*W; back with a=H*W, b=C).
func transposeLaunch(op string, dev *backend.Device, dt tensor.Dtype, in, out backend.DevicePtr, n, a, b int) error {
	if n == 0 || a == 0 || b == 0 {
		return nil
	}
	k, err := dev.Kernel("roialign", "transpose_"+dtypeSuffix(dt))
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	// Tiles of 32 rows of a by 128 (float32) or 64 (float64) columns of b:
	// kTB in roialign.cu.
	tb := 128
	if dt == tensor.Float64 {
		tb = 64
	}
	cfg := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32((b + tb - 1) / tb), Y: uint32((a + 31) / 32), Z: uint32(n)},
		Block: backend.Dim3{X: 32, Y: 8, Z: 1},
	}
	if err := backend.Launch(k, cfg, transposeArgs{In: in, Out: out, A: int32(a), B: int32(b)}); err != nil {
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

// roiAlignKernel is a forward or backward kernel of roialign.cu. A kernel
// with channels-last input needs the transpose first and takes the RoIs in
// spatial order; one with cpt channels per thread (cpt > 0) reads NCHW x
// directly, a grid of (K, channel blocks), and so does roialign_forward_cols
// (cols), a grid of (K, slices of the channels; 0: colsSlices).
// roialign_forward_sep4 runs blocks of chunk bins of a RoI (0: a tile's
// worth, roiAlignTileBins) and of one of its slices of the channels (0:
// one).
type roiAlignKernel struct {
	name   string
	cpt    int
	cols   bool
	cm     bool // roialign_forward_cols' channel-major kernel (_cm)
	chunk  int
	slices int
}

// String names the kernel and its launch shape, as benchmarks and tests
// name their runs: name[_chunk<chunk>][_slices<slices>].
func (kv roiAlignKernel) String() string {
	s := kv.name
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

// roiAlignColsKernel is roialign_forward_cols for s, the kernel for its
// sampling ratio (_s<ratio>; cm: channel-major, _cm), with the channels in
// slices slices (0: colsSlices).
func roiAlignColsKernel(s roiAlignShape, cm bool, slices int) roiAlignKernel {
	name := fmt.Sprintf("roialign_forward_cols_s%d_", s.cfg.SamplingRatio)
	if cm {
		name += "cm_"
	}
	return roiAlignKernel{name: name + dtypeSuffix(s.dt), cols: true, cm: cm, slices: slices}
}

// roiAlignColsMaxRatio and roiAlignColsMaxRows are kColsMaxS and
// kColsMaxRows of roialign.cu: the largest sampling ratio
// roialign_forward_cols takes, and the most sample rows (PooledH times the
// ratio) its _cm kernels' table holds.
const (
	roiAlignColsMaxRatio = 4
	roiAlignColsMaxRows  = 128
)

// colsFit reports whether roialign_forward_cols takes s: a fixed sampling
// ratio of at most roiAlignColsMaxRatio, a bin row's sample columns
// (PooledW times the ratio) within a warp's 32 lanes, at most
// roiAlignColsMaxRows sample rows, maps of at least 2x2
// (its 2x2 loads stay inside) whose bytes fit 32 bits (its tap offsets).
func (s roiAlignShape) colsFit() bool {
	r := s.cfg.SamplingRatio
	return r >= 1 && r <= roiAlignColsMaxRatio && s.cfg.PooledW*r <= 32 && s.cfg.PooledH*r <= roiAlignColsMaxRows &&
		s.h >= 2 && s.w >= 2 && int64(s.h)*int64(s.w)*int64(s.dt.Size()) <= math.MaxUint32
}

// colsSlices is the number of slices of the channels (grid y) that
// roialign_forward_cols takes them in, for its row-major or channel-major
// (cm) kernel. Blocks run RoI fastest, so the blocks running together read
// one slice of the maps. Both rules ask for at least roiAlignColsBlocks
// blocks in all, a few waves, so that RoIs of unequal cost even out.
//
// Row-major: slices of at most roiAlignColsSliceBytes, which L2 holds.
// H200 (BenchmarkGPURoIAlignVariants, cols_s2_f32, one session, ms):
// box_head_P2 (137 MB of maps, 1024 RoIs) 0.198 / 0.178 / 0.172 / 0.201
// with 4 / 15 (this rule) / 16 / 64 slices; mask_head_P2 (the same maps,
// 256 RoIs) 0.223 / 0.141 / 0.146 / 0.165; infer_1000_P3 (17 MB, 1000
// RoIs) 0.131-0.133 with 4 (this rule), 0.134 with 16, 0.183 with 64. (Two
// slices of 32 channels or more, as a first rule gave, were 0.34 ms on
// box_head.)
//
// Channel-major: slices of about roiAlignColsCMItems (bin row, group of
// channels) items a block, 14 a warp: enough to pay for the block's setup
// (the RoI's geometry and its table of sample rows), few enough that the
// blocks even out. H200, one session, cols_s2_cm, ms (kernels/bench/
// probe_tex.cu with PROBE_SWEEP=1, two runs each): box_head_P2 (7 bin
// rows, 2 channels a warp) 0.181 / 0.172 / 0.161 / 0.163 / 0.167 / 0.210
// with 4 / 6 / 8 (this rule) / 12 / 15 / 32 slices; mask_head_P2 (14 bin
// rows, 1 channel a warp) 0.169 / 0.135 / 0.125 / 0.121 / 0.120 (this
// rule) / 0.145 with 4 / 8 / 15 / 16 / 32 / 64. Through the op, same
// session: box_head 0.165 against 0.175 with 16 slices.
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
	// Maps above this many bytes take roialign_forward_cols' channel-major
	// kernels (roiAlignKernelFor).
	roiAlignColsCMBytes = 64 << 20
)

// roiAlignKernelFor picks the kernel, by BenchmarkGPURoIAlignVariants on
// an H200 (TARGETS.md cases; BENCHMARKS.md has the table). With a fixed
// sampling ratio, forward reads NCHW directly, 4 channels per thread (the
// transpose alone cost a quarter of the channels-last path's time), and
// backward scatters tap by tap into channels-last (but see quad). With
// adaptive sampling, about one sample per pixel, both go channels-last and
// separable, which touches each pixel of a bin once instead of once per tap;
// forward in float32 with C % 4 == 0, with 16-byte loads (sep4Forward).
//
// quad says whether the GPU runs roialign_sm90a.cu (roiAlignQuad): there the
// float32 backward is roiAlignSepQuadBackward when C % 4 == 0, separable
// with any sampling ratio. On an H200 it beat the tap-by-tap
// roiAlignQuadBackward (itself 1-10% faster than the scalar-atomic kernel)
// on every TARGETS.md case: box_head_P2 0.490 -> 0.446 ms, mask_head_P2
// 0.486 -> 0.432, infer_1000_P3 0.303 -> 0.239, adaptive (against the
// scalar separable kernel) 1.91 -> 1.17. Separable one bin at a time (no
// pairs) it was 0.470 / 0.468 / 0.273 / 1.42.
func roiAlignKernelFor(backward bool, s roiAlignShape, quad bool) roiAlignKernel {
	sfx := dtypeSuffix(s.dt)
	switch {
	case s.cfg.SamplingRatio <= 0 && !backward && s.dt == tensor.Float32 && s.c%4 == 0:
		return s.sep4Forward()
	case s.cfg.SamplingRatio <= 0 && !backward:
		return roiAlignKernel{name: "roialign_forward_sep_" + sfx}
	case backward && quad && s.dt == tensor.Float32 && s.c%4 == 0:
		return roiAlignKernel{name: roiAlignSepQuadBackward}
	case s.cfg.SamplingRatio <= 0 && backward:
		return roiAlignKernel{name: "roialign_backward_sep_" + sfx}
	case backward:
		return roiAlignKernel{name: "roialign_backward_" + sfx}
	}
	if s.dt == tensor.Float32 && s.colsFit() {
		// Lanes on sample columns, channel-major (_cm) where the maps are
		// larger than roiAlignColsCMBytes. H200, one session, colsSlices'
		// counts, ms: box_head (137 MB of maps) nchw4_b4 0.207, cols
		// 0.191, cols_cm 0.171; mask_head (137 MB) 0.188 / 0.152 / 0.130;
		// infer (17 MB) 0.167 / 0.129 / 0.135.
		bytes := s.n * s.c * s.h * s.w * int(s.dt.Size())
		cm := bytes > roiAlignColsCMBytes
		return roiAlignColsKernel(s, cm, s.colsSlices(cm))
	}
	if s.dt == tensor.Float32 {
		// Registers capped for 4 blocks per SM instead of 3: box_head
		// 0.236 -> 0.207 ms, mask_head 0.236 -> 0.189, infer 0.187 -> 0.169
		// (H200); for 5 or 6 blocks it spills or loses (BENCHMARKS.md).
		return roiAlignKernel{name: "roialign_forward_nchw4_b4_f32", cpt: 4}
	}
	return roiAlignKernel{name: "roialign_forward_nchw4_" + sfx, cpt: 4}
}

// sep4Forward is the float32 separable forward with 16-byte loads for s
// (C % 4 == 0; roialign_forward_sep4 in roialign.cu), registers capped for
// 4 blocks per SM. The channels go in slices whose part of the
// channels-last input is at most roiAlignForwardSliceBytes (grid z, the
// slowest: the blocks running together read a part that L2 holds), and a
// block takes a whole RoI's bins when its warps' tiles hold them (with
// fewer channel groups than warps, the warps of a group split the bins).
//
// H200, box_head_P2_adaptive (BenchmarkGPURoIAlignVariants, op times
// with the transpose, three sessions): the scalar separable kernel 2.0 ms;
// this kernel with 2 blocks a RoI and no slices 1.03-1.14 (L2 hit rate
// 41%, DRAM 43% busy); 8 slices and a block a RoI 0.66-0.68 (L2 hit rate
// 90%, DRAM 11%); the uncapped kernel (100 registers, 2 blocks per SM)
// 0.86-0.87 with the same launch.
func (s roiAlignShape) sep4Forward() roiAlignKernel {
	groups := ceilDiv(s.c, 32)
	perGroup := s.n * s.h * s.w * 32 * int(s.dt.Size()) // input bytes of 32 channels
	perSlice := max(1, min(groups, roiAlignForwardSliceBytes/max(perGroup, 1)))
	warpsPerGroup := max(1, roiAlignBlock/32/perSlice)
	return roiAlignKernel{
		name:   roiAlignSep4Forward,
		chunk:  min(s.cfg.PooledH*s.cfg.PooledW, roiAlignTileBins(s.dt)*warpsPerGroup),
		slices: ceilDiv(groups, perSlice),
	}
}

// roiAlignForwardSliceBytes bounds a channel slice of sep4Forward's input:
// on an H200 (50 MB of L2), box_head_P2_adaptive's 137 MB read in slices
// of 17 MB (8) took 0.66-0.76 ms, in slices of 34 MB (4) 0.72-0.77.
const roiAlignForwardSliceBytes = 24 << 20

const roiAlignSep4Forward = "roialign_forward_sep4_b4_f32"

// roialign_sm90a.cu's float32 backwards: each lane adds 4 consecutive
// channels of a pixel with one 16-byte vector reduction (sm_90 only, PTX
// ISA 8.1), tap by tap or separably (the taps of two neighbouring bins
// that share a pixel are summed first: 32-51% fewer reductions on
// TARGETS.md's fixed-ratio cases; sep_pair_quad in roialign.cu).
// They need C % 4 == 0 (16-byte aligned pixels in the channels-last
// gradient, which the op allocates).
const (
	roiAlignQuadBackward    = "roialign_backward_q4_f32"
	roiAlignSepQuadBackward = "roialign_backward_sep_q4_f32"
)

// roiAlignModule is the module (kernels/<module>.cu) of a kernel.
func roiAlignModule(name string) string {
	if name == roiAlignQuadBackward || name == roiAlignSepQuadBackward {
		return "roialign_sm90a"
	}
	return "roialign"
}

// roiAlignQuad reports whether dev runs roialign_sm90a.cu's kernels
// (sm90aError).
func roiAlignQuad(dev *backend.Device) bool {
	return sm90aError(dev, roiAlignModule(roiAlignSepQuadBackward), roiAlignSepQuadBackward) == nil
}

// launchRoIAlign runs kernel kv on feat (x, or the channels-last gradient
// being scattered into) and pooled (out, or the gradient of out). zero, if
// not nil, is zeroed first: by roi_order's launch when it runs (its other
// blocks zero while one sorts), else on its own.
func (s roiAlignShape) launchRoIAlign(dev *backend.Device, kv roiAlignKernel, backward bool, feat, rois, pooled backend.DevicePtr, zero *tensor.Dense) error {
	name, kname := "RoIAlign", kv.name
	if backward {
		name = "RoIAlign backward"
	}
	p := s.params()
	if err := fitsInt32(name, map[string]int{"N": p.N, "C": p.C, "K": p.K, "H*W": p.H * p.W, "H*W*C": p.H * p.W * p.C}); err != nil {
		return err
	}
	if p.K == 0 {
		return nil
	}
	if kv.cols && (!s.colsFit() || !strings.HasPrefix(kname, fmt.Sprintf("roialign_forward_cols_s%d_", p.SamplingRatio))) {
		return fmt.Errorf("ops: %s: kernel %s does not take sampling ratio %d with PooledW %d", name, kname, p.SamplingRatio, p.PooledW)
	}
	k, err := dev.Kernel(roiAlignModule(kname), kname)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", name, err)
	}
	statusPtr, err := dev.StatusWord()
	if err != nil {
		return fmt.Errorf("ops: %s: %w", name, err)
	}
	// A bad RoI is reported by the next call that waits for the GPU (or by
	// this launch under STHENO_CUDA_SYNC), not by a round trip per launch.
	dev.WatchStatus(func(code int32) error { return s.statusError(name, code) })
	args := roiAlignArgs{
		Feat: feat, RoIs: rois, Pooled: pooled, Status: statusPtr,
		SpatialScale: p.SpatialScale,
		N:            int32(p.N), C: int32(p.C), H: int32(p.H), W: int32(p.W), K: int32(p.K),
		PooledH: int32(p.PooledH), PooledW: int32(p.PooledW),
		SamplingRatio: int32(p.SamplingRatio), Aligned: boolInt32(p.Aligned),
		MaxAdaptiveGrid: kernels.MaxAdaptiveGrid,
	}
	if !kv.nchw() && p.K >= roiOrderMin && p.K <= roiOrderMax {
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
		Block: backend.Dim3{X: roiAlignBlock, Y: 1, Z: 1},
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
		// roiAlignBlock threads), each group on kv.cpt channels.
		bins := p.PooledH * p.PooledW
		phases := max(1, roiAlignBlock/bins)
		threads := min(ceilDiv(bins*phases, 32)*32, roiAlignBlock)
		cfg.Grid.Y = uint32(ceilDiv(p.C, phases*kv.cpt))
		cfg.Block.X = uint32(threads)
	}
	if err := backend.Launch(k, cfg, args); err != nil {
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
// and mask_head_P2 gained from 2 slices with the tap-by-tap kernels (0.520
// -> 0.501 ms and 0.530 -> 0.484; 8: 0.61 and 0.59); with
// roiAlignSepQuadBackward, which adds fewer times, 1 and 2 slices are
// within 1% (box 0.437 / 0.441, mask 0.433 / 0.430; 4: 0.51). Any slicing
// slows infer_1000_P3's 17 MB (0.238 -> 0.280 with 2).
func (s roiAlignShape) slices() int {
	if roiAlignSlicesOverride > 0 {
		return roiAlignSlicesOverride
	}
	bytes := s.n * s.h * s.w * s.c * int(s.dt.Size())
	return max(1, min(ceilDiv(bytes, roiAlignSliceBytes), ceilDiv(s.c, 32), 65535))
}

// roiAlignSliceBytes bounds a channel slice of the backward's gradient.
const roiAlignSliceBytes = 96 << 20

// roiOrderArgs mirrors RoIOrderParams in kernels/roialign.cu.
type roiOrderArgs struct {
	RoIs, Order  backend.DevicePtr
	SpatialScale float64
	K, _         int32
	Zero         backend.DevicePtr
	ZeroBytes    int64
}

// roiOrderZeroBlocks caps the blocks of roi_order's launch that zero.
const roiOrderZeroBlocks = 256

// The RoI counts for which the kernels take the RoIs in spatial order
// (roi_order in roialign.cu; one block sorts at most kMaxOrder). Below
// roiOrderMin the blocks fit the GPU at once and there is little for the
// order to win (a judgment, not measured).
const (
	roiOrderMin = 64
	roiOrderMax = 4096
)

// roiOrder queues roi_order: a new int32 [K] device tensor, which the
// caller frees, of the RoIs in spatial order. The same launch zeroes zero
// (if not nil) when it can, 16 bytes a store, and says so: one block sorts
// while the others zero (a 137 MB gradient takes ~40 us to zero, the sort
// of 1024 RoIs ~15).
func (s roiAlignShape) roiOrder(op string, dev *backend.Device, rois backend.DevicePtr, zero *tensor.Dense) (order *tensor.Dense, zeroed bool, err error) {
	order, err = dev.NewDense(tensor.Int32, s.k)
	if err != nil {
		return nil, false, fmt.Errorf("ops: %s: RoI order: %w", op, err)
	}
	args := roiOrderArgs{RoIs: rois, SpatialScale: s.cfg.SpatialScale, K: int32(s.k)}
	cfg := backend.LaunchConfig{Grid: backend.Dim3{X: 1, Y: 1, Z: 1}, Block: backend.Dim3{X: 1024, Y: 1, Z: 1}}
	if args.Order, err = dev.Ptr(order); err == nil && zero != nil {
		var zp backend.DevicePtr
		if zp, err = dev.Ptr(zero); err == nil {
			bytes := int64(zero.DataSize()) * int64(zero.Dtype().Size())
			if zp%16 == 0 && bytes%16 == 0 && bytes > 0 {
				args.Zero, args.ZeroBytes, zeroed = zp, bytes, true
				cfg.Grid.X += uint32(min(ceilDiv(int(bytes/16), 1024), roiOrderZeroBlocks))
			}
		}
	}
	if err == nil {
		var k *backend.Kernel
		if k, err = dev.Kernel("roialign", "roi_order_"+dtypeSuffix(s.dt)); err == nil {
			err = backend.Launch(k, cfg, args)
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
	case 1:
		return fmt.Errorf("ops: %s: a RoI has a batch index outside [0, %d) or NaN; its outputs are zero", op, s.n)
	case 2:
		return fmt.Errorf("ops: %s: a RoI needs more than %d samples per bin side with adaptive sampling: use a fixed SamplingRatio", op, kernels.MaxAdaptiveGrid)
	}
	return nil
}

// forwardDevice is RoIAlign's device launcher.
func (op roiAlignShape) forwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "RoIAlign"
	dev, x, rois := a.dev, a.ptr[0], a.ptr[1]
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if op.k == 0 {
		return out, nil
	}
	kv := roiAlignKernelOn(dev, false, op, false)
	if kv.nchw() {
		if err := op.launchRoIAlign(dev, kv, false, x, rois, outPtr, nil); err != nil {
			return nil, err
		}
		return out, nil
	}
	xt, xtPtr, err := op.channelsLast(name, dev)
	if err != nil {
		return nil, err
	}
	// The stream orders this free after the kernels that read xt.
	defer dev.FreeDense(xt)
	if err := transposeLaunch(name, dev, op.dt, x, xtPtr, op.n, op.c, op.h*op.w); err != nil {
		return nil, err
	}
	if err := op.launchRoIAlign(dev, kv, false, xtPtr, rois, outPtr, nil); err != nil {
		return nil, err
	}
	return out, nil
}

// backwardDevice is RoIAlign backward's device launcher.
func (op roiAlignShape) backwardDevice(a *deviceArgs) (*tensor.Dense, error) {
	const name = "RoIAlign backward"
	dev, rois, gy := a.dev, a.ptr[0], a.ptr[1]
	gx, gxPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	if op.k == 0 {
		// Nothing to scatter: the op still owes a zeroed gradient.
		if err := dev.Zero(gx); err != nil {
			return nil, fmt.Errorf("ops: %s: %w", name, err)
		}
		return gx, nil
	}
	// The kernel scatters with atomicAdd into a channels-last gradient the
	// op zeroes itself (callers never pre-zero), then transposes it back.
	gt, gtPtr, err := op.channelsLast(name, dev)
	if err != nil {
		return nil, err
	}
	defer dev.FreeDense(gt)
	quad := op.dt == tensor.Float32 && op.c%4 == 0 && gtPtr%16 == 0 && roiAlignQuad(dev)
	if err := op.launchRoIAlign(dev, roiAlignKernelOn(dev, true, op, quad), true, gtPtr, rois, gy, gt); err != nil {
		return nil, err
	}
	if err := transposeLaunch(name, dev, op.dt, gtPtr, gxPtr, op.n, op.h*op.w, op.c); err != nil {
		return nil, err
	}
	return gx, nil
}

// The params structs must be laid out as the C++ ones: 5 pointers, a
// double and 10 ints; 2 pointers, a double, 2 ints, a pointer and an
// int64; 2 pointers and 2 ints.
var (
	_ [88]byte = [unsafe.Sizeof(roiAlignArgs{})]byte{}
	_ [48]byte = [unsafe.Sizeof(roiOrderArgs{})]byte{}
	_ [24]byte = [unsafe.Sizeof(transposeArgs{})]byte{}
)
