package ops

import (
	"fmt"
	"unsafe"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// The MSDeformAttn backward by pixel: msdeform.cu's msdeform_px_* kernels,
// which sort the samples by pixel and gather each pixel's value gradient
// instead of scattering it with atomics (the comment above
// MSDeformPxParams in kernels/msdeform.cu has the design).

// msDeformPxBackward names the backward by pixel where a kernel name is
// expected (msDeformKernelFor, msDeformKernelOverride): it is five
// launches, not one kernel. A suffix to it (benchmarks) picks a variant of
// the gather kernel: msdeform_px_gather_f32_d32<suffix>.
const msDeformPxBackward = "msdeform_backward_f32_px"

// msDeformPxArgs mirrors MSDeformPxParams in kernels/msdeform.cu.
type msDeformPxArgs struct {
	msDeformArgs
	Bounds, Entries, Dots backend.DevicePtr
	Buckets, Seg          int32
	LevelBucket           [msDeformInlineLevels]int32
}

var _ [400]byte = [unsafe.Sizeof(msDeformPxArgs{})]byte{}

// msDeformPxD is the head dimension the gather kernel is built for (8
// lanes of 4 channels per pixel; msdeform_px_gather_f32_d32).
const msDeformPxD = 32

// msDeformPxThreads is msdeform_px_scan's block (kPxScanThreads).
const msDeformPxThreads = 1024

// pxFits says why the backward by pixel cannot take s (nil if it can):
// float32, D = 32, the level table inline, 16-byte aligned value,
// grad_out and grad_value, and sample indices that fit an int32.
func (s msDeformShape) pxFits(aligned bool) error {
	switch {
	case s.dt != tensor.Float32:
		return fmt.Errorf("dtype %v, not float32", s.dt)
	case s.d != msDeformPxD:
		return fmt.Errorf("D = %d, not %d", s.d, msDeformPxD)
	case s.l > msDeformInlineLevels:
		return fmt.Errorf("%d levels, more than %d", s.l, msDeformInlineLevels)
	case !aligned:
		return fmt.Errorf("value, grad_out or grad_value not 16-byte aligned")
	case int64(s.n)*int64(s.lq)*int64(s.m)*int64(s.l)*int64(s.p) > 1<<31-1:
		return fmt.Errorf("%d samples do not fit an int32", int64(s.n)*int64(s.lq)*int64(s.m)*int64(s.l)*int64(s.p))
	}
	return nil
}

// launchPx queues the backward by pixel: zeroes the bucket counts, then
// msdeform_px_count, _scan, _place, _gather and _finish. args holds the
// inputs and the three gradients (grad_value need not be zeroed: the
// gather writes all of it). The scratch (about 32 bytes a sample, plus 4 a
// bucket) is freed after the launches (the stream orders the free).
func (s msDeformShape) launchPx(op string, dev *backend.Device, args msDeformArgs, gather string) error {
	var px msDeformPxArgs
	px.msDeformArgs = args
	start, buckets := 0, 0
	for i, lv := range s.levels {
		px.InlineLevels[3*i], px.InlineLevels[3*i+1], px.InlineLevels[3*i+2] = int32(lv.H), int32(lv.W), int32(start)
		px.LevelBucket[i] = int32(buckets)
		start += lv.H * lv.W
		buckets += (lv.H + 1) * (lv.W + 1)
	}
	segs := s.n * s.m
	seg := s.lq * s.l * s.p
	slots := segs * seg
	// Whole 16-byte pieces, so that entries and dots stay aligned.
	boundsLen := (segs*(buckets+1) + 3) &^ 3
	if err := fitsInt32(op, map[string]int{"S": s.s, "Lq": s.lq, "buckets": buckets, "bounds": boundsLen,
		"groups": segs * s.s * 8}); err != nil {
		return err
	}
	px.N, px.S, px.M, px.D = int32(s.n), int32(s.s), int32(s.m), int32(s.d)
	px.Lq, px.L, px.P, px.Group = int32(s.lq), int32(s.l), int32(s.p), 8
	px.Buckets, px.Seg = int32(buckets), int32(seg)
	scratch, err := dev.NewDense(tensor.Int32, boundsLen+8*slots)
	if err != nil {
		return fmt.Errorf("ops: %s: scratch: %w", op, err)
	}
	defer dev.FreeDense(scratch)
	if px.Bounds, err = dev.Ptr(scratch); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	px.Entries = px.Bounds + backend.DevicePtr(4*boundsLen)
	px.Dots = px.Entries + backend.DevicePtr(16*slots)
	if err := dev.Engine().Memset(backend.Memory{Ptr: px.Bounds, Size: int64(4 * segs * (buckets + 1))}, int32(0)); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	grid := func(threads, block int) backend.LaunchConfig {
		return backend.LaunchConfig{
			Grid:  backend.Dim3{X: uint32((threads + block - 1) / block), Y: 1, Z: 1},
			Block: backend.Dim3{X: uint32(block), Y: 1, Z: 1},
		}
	}
	perSample := grid(slots, msDeformBlock)
	for _, l := range []struct {
		name string
		cfg  backend.LaunchConfig
	}{
		{"msdeform_px_count_f32", perSample},
		{"msdeform_px_scan", grid(segs*msDeformPxThreads, msDeformPxThreads)},
		{"msdeform_px_place_f32", perSample},
		{"msdeform_px_gather_f32_d32" + gather, grid(segs*s.s*8, msDeformBlock)},
		{"msdeform_px_finish_f32", perSample},
	} {
		k, err := dev.Kernel("msdeform", l.name)
		if err == nil {
			err = backend.Launch(k, l.cfg, px)
		}
		if err != nil {
			return fmt.Errorf("ops: %s: %s: %w", op, l.name, err)
		}
	}
	return nil
}
