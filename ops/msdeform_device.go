package ops

import (
	"fmt"
	"strings"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// msDeformArgs mirrors MSDeformParams in kernels/msdeform.cu field for field.
type msDeformArgs struct {
	Value, Loc, Weight, Out                 backend.DevicePtr
	GradOut, GradValue, GradLoc, GradWeight backend.DevicePtr
	Levels                                  backend.DevicePtr
	N, S, M, D, Lq, L, P                    int32
	Group                                   int32
	InlineLevels                            [3 * msDeformInlineLevels]int32
	Order                                   backend.DevicePtr
}

// msDeformInlineLevels is how many levels travel inside the launch
// parameters; more are uploaded as a table.
const msDeformInlineLevels = 16

var _ [112 + 4*3*msDeformInlineLevels]byte = [unsafe.Sizeof(msDeformArgs{})]byte{}

const msDeformBlock = 256

// msDeformKernel is one variant of msdeform.cu's (or msdeform_sm90a.cu's)
// kernels: its name and the channels each lane loads at once.
type msDeformKernel struct {
	name string
	vec  int
}

// ordered reports whether the kernel takes the queries in the order
// queryOrder computes (the forward's _o kernels).
func (k msDeformKernel) ordered() bool { return strings.HasSuffix(k.name, "_o") }

// msDeformQuadBackward is msdeform_sm90a.cu's float32 backward: 4
// consecutive channels per lane, added to grad_value with one 16-byte
// vector reduction per corner (sm_90 only, PTX ISA 8.1). It needs D % 4 == 0
// and value and grad_value 16-byte aligned.
const msDeformQuadBackward = "msdeform_backward_f32_q4_r4_h_b3"

// msDeformModule is the module (kernels/<module>.cu) of a kernel: the _q4
// kernels are msdeform_sm90a.cu's.
func msDeformModule(name string) string {
	if strings.Contains(name, "_q4_") {
		return "msdeform_sm90a"
	}
	return "msdeform"
}

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
func (t msDeformTuning) kernelFor(backward bool, dt tensor.Dtype, d int, aligned, quad, ordered bool) msDeformKernel {
	if t.kernel != nil {
		return t.kernel(backward, dt)
	}
	return msDeformKernelFor(backward, dt, d, aligned, quad, ordered)
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

// msDeformKernelFor picks the kernel variant. Forward kernels load 16 bytes
// of channels per lane when D and the addresses allow it, and share each
// point's taps across the group with shuffles (_s), queries fastest.
// Backward kernels take 4 channels per lane, G apart (so a group's atomics
// still cover G consecutive floats), and reduce-scatter the location and
// weight sums of 4 points at a time across the group (about 3 shuffles per
// point instead of 15), heads fastest (concurrent atomics hit different
// addresses). Chosen on an H200 against the other variants of msdeform.cu
// (BenchmarkGPUMSDeformAttnVariants, encoder case): forward v4_s_b5 (v4_s
// with registers for 5 blocks per SM) 0.252 ms, v4_s 0.257 (seed_full 0.546
// vs 0.560), v4_u1 0.35, v1_s 0.71; backward v4_r4_h 1.40-1.50 ms, v4_r8_h 1.51,
// v4_r8 1.52, v2_r16_h 1.49-1.56, v4_r4_h_b3 (v4_r4_h with registers for
// 3 blocks per SM, the float32 default) 1.41, r8_h 1.70, r4_h 1.71, r16_h 1.82-1.93,
// u1_h (one channel per lane, 15 shuffles per point) 2.65, s_h 3.43.
//
// ordered (sortsQueries; forward only) picks the _o twin of the forward
// kernel, which takes the queries in spatial order (queryOrder). For float32
// with 4 channels per lane that is v4_s_o, without the register cap: with
// the order lookup, the capped kernel (v4_s_b5_o) was slower than the
// uncapped one (seed_full 0.555 vs 0.506 ms, sort included).
//
// quad says whether the GPU runs msdeform_sm90a.cu (msDeformQuad): there the
// float32 backward is msDeformQuadBackward when D and the alignment allow,
// one 16-byte reduction per corner instead of 4 scalar atomics: encoder
// 0.84-0.86 ms against v4_r4_h_b3's 1.41 on the same H200 (q4_r4_h 0.87,
// q4_r8_h_b3 0.97, q4_r4_h_b4 1.18 spilling, q4_r2_h_b3 0.88, q4_r4_b3
// queries fastest 1.01).
func msDeformKernelFor(backward bool, dt tensor.Dtype, d int, aligned, quad, ordered bool) msDeformKernel {
	sfx := dtypeSuffix(dt)
	if backward {
		if dt == tensor.Float32 && quad && d%4 == 0 && aligned {
			return msDeformKernel{msDeformQuadBackward, 4}
		}
		if dt == tensor.Float32 {
			return msDeformKernel{"msdeform_backward_f32_v4_r4_h_b3", 4}
		}
		return msDeformKernel{"msdeform_backward_" + sfx + "_v4_r4_h", 4}
	}
	o := ""
	if ordered {
		o = "_o"
	}
	vec := 16 / int(dt.Size())
	if d%vec != 0 || !aligned {
		return msDeformKernel{"msdeform_forward_" + sfx + "_v1_s" + o, 1}
	}
	if dt == tensor.Float32 && !ordered {
		return msDeformKernel{"msdeform_forward_f32_v4_s_b5", vec}
	}
	return msDeformKernel{fmt.Sprintf("msdeform_forward_%s_v%d_s%s", sfx, vec, o), vec}
}

// msDeformQuad reports whether dev runs msdeform_sm90a.cu's kernels
// (sm90aError).
func msDeformQuad(dev *backend.Device) bool {
	return sm90aError(dev, msDeformModule(msDeformQuadBackward), msDeformQuadBackward) == nil
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

// launch runs msdeform_{forward,backward}_{f32,f64} with args' pointers
// filled in by the caller.
func (s msDeformShape) launch(op string, dev *backend.Device, backward bool, args msDeformArgs) error {
	if err := fitsInt32(op, map[string]int{"N": s.n, "S": s.s, "M": s.m, "D": s.d, "Lq": s.lq, "L": s.l, "P": s.p,
		// The bytes between two pixels of value (the r kernels address
		// pixels with 32x32-bit multiplies).
		"M*D*size": s.m * s.d * int(s.dt.Size())}); err != nil {
		return err
	}
	// Vector loads need 16-byte aligned value and output rows (forward),
	// vector reductions a 16-byte aligned grad_value (backward; the other
	// pointer is 0).
	aligned := (args.Value|args.Out|args.GradValue)%16 == 0
	quad := backward && s.dt == tensor.Float32 && s.d%4 == 0 && aligned && msDeformQuad(dev)
	tuning := msDeformTuningOf(dev)
	kv := tuning.kernelFor(backward, s.dt, s.d, aligned, quad, !backward && tuning.sortsQueries(s))
	k, err := dev.Kernel(msDeformModule(kv.name), kv.name)
	if err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	if kv.ordered() {
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
	if s.l <= msDeformInlineLevels {
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
	blocks := (threads + msDeformBlock - 1) / msDeformBlock
	if blocks > 1<<31-1 {
		return fmt.Errorf("ops: %s: %d blocks exceed the grid limit", op, blocks)
	}
	cfg := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(blocks), Y: 1, Z: 1},
		Block: backend.Dim3{X: msDeformBlock, Y: 1, Z: 1},
	}
	if err := backend.Launch(k, cfg, args); err != nil {
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
	args := msDeformArgs{Value: a.ptr[0], Loc: a.ptr[1], Weight: a.ptr[2], Out: outPtr}
	if err := s.launch(msDeformName, a.dev, false, args); err != nil {
		return nil, err
	}
	return out, nil
}

// msDeformOrderArgs mirrors MSDeformOrderParams in kernels/msdeform.cu.
type msDeformOrderArgs struct {
	Loc, Cells, Starts, Order backend.DevicePtr
	N, Lq, Stride             int32
	Bands, Columns, _         int32
}

var _ [56]byte = [unsafe.Sizeof(msDeformOrderArgs{})]byte{}

// Constants of the query order's kernels (kernels/msdeform.cu): the most
// cells msdeform_query_starts' shared memory holds, the rows of level 0 a
// band of cells spans, and its block size (one block per image).
//
// Bands of 8 rows give the 32 queries of a forward block a region about as
// tall as it is wide. On seed_full (H200, BenchmarkGPUMSDeformAttnQueryOrder,
// the final sort) the forward took 0.507 ms with bands of 8 rows, 0.508
// with 4, 0.511 with 16 and 0.519 with 2; two sessions with earlier, slower
// versions of the sort ranked them the same way, all within 2.5%.
const (
	msDeformOrderCells    = 8192
	msDeformOrderBandRows = 8
	msDeformOrderThreads  = 1024
)

// msDeformOrderMin is the fewest queries per image for which the forward
// takes them in spatial order. The sort costs three launches, about as
// long whatever the count; it paid on seed_full's 15422 queries (see
// sortsQueries). Below it the forward is short and its blocks are few
// enough to be resident at once, so there is little for the order to win:
// detr_decoder's 300 queries took 0.017 ms unsorted, 0.028-0.034 sorting.
const msDeformOrderMin = 4096

// sortsQueries reports whether the forward takes each image's queries in
// spatial order (msdeform_query_cells): with Lq >= msDeformOrderMin, unless
// every pixel is a query (Lq == S: an encoder's self-attention, whose
// queries come in pixel order already). On an H200
// (BenchmarkGPUMSDeformAttnQueryOrder), seed_full (reference points
// uniform over the map) took 0.548 ms with its queries as drawn and 0.507
// sorted by the op, sort included; detr_encoder's took 0.255 as given and
// 0.262 sorted by the op. The backward gained nothing from presorted
// queries (seed_full 1.748 -> 1.740) and does not sort.
func (s msDeformShape) sortsQueries() bool {
	return s.lq >= msDeformOrderMin && s.lq != s.s
}

// orderGrid is the grid of cells the query order sorts by: bands of rows
// rows of level 0 (msDeformOrderBandRows unless a test or benchmark says
// otherwise: msDeformTuning.orderBandRows) and one column per pixel,
// columns merged in pairs (then bands, if ever needed) until it has at most
// msDeformOrderCells cells.
func (s msDeformShape) orderGrid(rows int) (bands, cols int) {
	bands, cols = max(1, ceilDiv(s.levels[0].H, rows)), max(1, s.levels[0].W)
	for bands*cols > msDeformOrderCells {
		if cols > 1 {
			cols = ceilDiv(cols, 2)
		} else {
			bands = ceilDiv(bands, 2)
		}
	}
	return bands, cols
}

// queryOrder queues msdeform_query_cells, _starts and _place: a new int32
// device tensor, which the caller frees, whose first N*Lq elements hold,
// for each image, the order in which the forward takes its queries (the
// rest is the sort's scratch: each query's cell, each cell's next free
// position). The cells are orderGrid(rows)'s.
func (s msDeformShape) queryOrder(op string, dev *backend.Device, loc backend.DevicePtr, rows int) (*tensor.Dense, error) {
	if err := fitsInt32(op, map[string]int{"Lq": s.lq, "M*L*P*2": s.m * s.l * s.p * 2}); err != nil {
		return nil, err
	}
	queries := int64(s.n) * int64(s.lq)
	blocks := (queries + msDeformBlock - 1) / msDeformBlock
	if blocks > 1<<31-1 {
		return nil, fmt.Errorf("ops: %s: query order: %d blocks exceed the grid limit", op, blocks)
	}
	bands, cols := s.orderGrid(rows)
	t, err := dev.NewDense(tensor.Int32, 2*s.n*s.lq+s.n*bands*cols)
	if err != nil {
		return nil, fmt.Errorf("ops: %s: query order: %w", op, err)
	}
	args := msDeformOrderArgs{Loc: loc, N: int32(s.n), Lq: int32(s.lq), Stride: int32(s.m * s.l * s.p * 2),
		Bands: int32(bands), Columns: int32(cols)}
	perQuery := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(blocks), Y: 1, Z: 1},
		Block: backend.Dim3{X: msDeformBlock, Y: 1, Z: 1},
	}
	perImage := backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(s.n), Y: 1, Z: 1},
		Block: backend.Dim3{X: msDeformOrderThreads, Y: 1, Z: 1},
	}
	if args.Order, err = dev.Ptr(t); err == nil {
		args.Cells = args.Order + backend.DevicePtr(4*queries)
		args.Starts = args.Cells + backend.DevicePtr(4*queries)
		for _, l := range []struct {
			name string
			cfg  backend.LaunchConfig
		}{
			{"msdeform_query_cells_" + dtypeSuffix(s.dt), perQuery},
			{"msdeform_query_starts", perImage},
			{"msdeform_query_place", perQuery},
		} {
			var k *backend.Kernel
			if k, err = dev.Kernel("msdeform", l.name); err == nil {
				err = backend.Launch(k, l.cfg, args)
			}
			if err != nil {
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
	args := msDeformArgs{Value: a.ptr[0], Loc: a.ptr[1], Weight: a.ptr[2], GradOut: a.ptr[3]}
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
