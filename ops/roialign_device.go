package ops

import (
	"fmt"
	"unsafe"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
)

// roiAlignArgs mirrors RoIAlignParams in kernels/roialign.cu field for field.
type roiAlignArgs struct {
	Feat, RoIs, Pooled, Status backend.DevicePtr
	SpatialScale               float64
	N, C, H, W, K              int32
	PooledH, PooledW           int32
	SamplingRatio              int32
	Aligned                    int32
	ChannelsPerBlock           int32
	MaxTaps                    int32
	MaxAdaptiveGrid            int32
}

const (
	roiAlignBlock = 256
	// roiAlignSharedBytes bounds the taps a block keeps in shared memory.
	// Fixed sampling needs bins*ratio² taps (196 for 7x7 bins of 2x2
	// samples, 6 KB); adaptive sampling takes up to this much and falls back
	// to computing taps on the fly for bins with more samples.
	roiAlignSharedBytes = 24 << 10
)

// roiTapBytes is sizeof(SharedTap<T>): four int offsets and four weights.
func roiTapBytes(dt tensor.Dtype) int {
	return 4*4 + 4*int(dt.Size())
}

// launchRoIAlign runs roialign_{forward,backward}_{f32,f64}. feat and pooled
// are x and out (forward) or grad_x and grad_out (backward); rois is read to
// explain a bad status.
func (s roiAlignShape) launchRoIAlign(dev *backend.Device, backward bool, feat, rois, pooled backend.DevicePtr, roisVal G.Value) error {
	name := "RoIAlign"
	kname := "roialign_forward_"
	if backward {
		name, kname = "RoIAlign backward", "roialign_backward_"
	}
	p := s.params()
	if err := fitsInt32(name, map[string]int{"N": p.N, "C": p.C, "K": p.K, "H*W": p.H * p.W}); err != nil {
		return err
	}
	if p.K == 0 {
		return nil
	}
	bins := p.PooledH * p.PooledW
	tapBytes := roiTapBytes(s.dt)
	taps := roiAlignSharedBytes / tapBytes
	if p.SamplingRatio > 0 {
		taps = min(taps, bins*p.SamplingRatio*p.SamplingRatio)
	}
	// Enough blocks to fill the GPU: one per RoI and group of channels.
	cpb := 64
	for cpb > 8 && p.K*((p.C+cpb-1)/cpb) < 4*dev.SMCount() {
		cpb /= 2
	}
	k, err := dev.Kernel("roialign", kname+dtypeSuffix(s.dt))
	if err != nil {
		return fmt.Errorf("ops: %s: %w", name, err)
	}
	status, statusPtr, err := newStatusWord(name, dev)
	if err != nil {
		return err
	}
	args := roiAlignArgs{
		Feat: feat, RoIs: rois, Pooled: pooled, Status: statusPtr,
		SpatialScale: p.SpatialScale,
		N:            int32(p.N), C: int32(p.C), H: int32(p.H), W: int32(p.W), K: int32(p.K),
		PooledH: int32(p.PooledH), PooledW: int32(p.PooledW),
		SamplingRatio: int32(p.SamplingRatio), Aligned: boolInt32(p.Aligned),
		ChannelsPerBlock: int32(cpb), MaxTaps: int32(taps), MaxAdaptiveGrid: kernels.MaxAdaptiveGrid,
	}
	cfg := backend.LaunchConfig{
		Grid:      backend.Dim3{X: uint32(p.K), Y: uint32((p.C + cpb - 1) / cpb), Z: 1},
		Block:     backend.Dim3{X: roiAlignBlock, Y: 1, Z: 1},
		SharedMem: uint32(taps * tapBytes),
	}
	if err := backend.Launch(k, cfg, args); err != nil {
		return fmt.Errorf("ops: %s: %w", name, err)
	}
	// Reading the status waits for the kernel: a bad RoI is reported by
	// this call, as on the CPU, not by some later one.
	code, err := status.read()
	if err != nil {
		return fmt.Errorf("ops: %s: %w", name, err)
	}
	if code != 0 {
		return fmt.Errorf("ops: %s: %w", name, s.explainRoIs(dev, roisVal, code))
	}
	return nil
}

// explainRoIs turns a kernel's bad status into the CPU path's error by
// checking the RoIs on the host (this happens only on the error path).
func (s roiAlignShape) explainRoIs(dev *backend.Device, roisVal G.Value, code int32) error {
	host, err := dev.ToHost(roisVal.(*tensor.Dense))
	if err != nil {
		return fmt.Errorf("the kernel reported bad RoIs (status %d), and reading them failed: %w", code, err)
	}
	switch s.dt {
	case tensor.Float32:
		err = kernels.RoIAlignCheckRoIs(s.params(), host.Float32s())
	default:
		err = kernels.RoIAlignCheckRoIs(s.params(), host.Float64s())
	}
	if err == nil {
		err = fmt.Errorf("the kernel reported bad RoIs (status %d) that the host check accepts", code)
	}
	return err
}

func (op *roiAlignOp) doDevice(dev *backend.Device, prealloc G.Value, in []G.Value) (G.Value, error) {
	x, err := deviceArg("RoIAlign", "x", dev, in[0], op.dt, op.xShape())
	if err != nil {
		return nil, err
	}
	rois, err := deviceArg("RoIAlign", "rois", dev, in[1], op.dt, op.roiShape())
	if err != nil {
		return nil, err
	}
	out, outPtr, err := deviceOutput("RoIAlign", dev, prealloc, op.dt, op.outShape())
	if err != nil {
		return nil, err
	}
	if err := op.launchRoIAlign(dev, false, x, rois, outPtr, in[1]); err != nil {
		return nil, err
	}
	return out, nil
}

func (op *roiAlignGradOp) doDevice(dev *backend.Device, prealloc G.Value, in []G.Value) (G.Value, error) {
	rois, err := deviceArg("RoIAlign backward", "rois", dev, in[0], op.dt, op.roiShape())
	if err != nil {
		return nil, err
	}
	gy, err := deviceArg("RoIAlign backward", "grad", dev, in[1], op.dt, op.outShape())
	if err != nil {
		return nil, err
	}
	gx, gxPtr, err := deviceOutput("RoIAlign backward", dev, prealloc, op.dt, op.xShape())
	if err != nil {
		return nil, err
	}
	// The kernel scatters with atomicAdd: the op zeroes its output itself,
	// so callers never pre-zero.
	if err := dev.Zero(gx); err != nil {
		return nil, fmt.Errorf("ops: RoIAlign backward: %w", err)
	}
	if err := op.launchRoIAlign(dev, true, gxPtr, rois, gy, in[0]); err != nil {
		return nil, err
	}
	return gx, nil
}

func boolInt32(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// The params struct must be laid out as the C++ one: 4 pointers, a double,
// 12 ints.
var _ [88]byte = [unsafe.Sizeof(roiAlignArgs{})]byte{}
