package backend

import "sync/atomic"

// Counters counts what a Device has asked of its GPU since Open. A
// training step's share (the difference of two readings) says what the step
// costs the host: how many launches and cuBLAS calls it queues, and how
// often the host waits for the GPU. A step that leaves the GPU busy while
// the host prepares the next one waits only where its program reads a
// result (the loss, say).
type Counters struct {
	// Launches counts kernels queued (cuLaunchKernel).
	Launches int64
	// Gemms counts cuBLAS products queued (Gemm).
	Gemms int64
	// Waits counts the times the host waited for the stream: a
	// synchronisation, a copy to the host (ToHost, a device-to-host
	// Memcpy, reading the status word) or timing events.
	Waits int64
	// CopiesToDevice counts copies from host memory (ToDevice, Memcpy):
	// from pageable Go memory the driver stages them, so the host is busy
	// until the bytes have left.
	CopiesToDevice int64
}

// Sub returns c - o, what was counted between two readings.
func (c Counters) Sub(o Counters) Counters {
	return Counters{
		Launches:       c.Launches - o.Launches,
		Gemms:          c.Gemms - o.Gemms,
		Waits:          c.Waits - o.Waits,
		CopiesToDevice: c.CopiesToDevice - o.CopiesToDevice,
	}
}

// counters is the Device's running count.
type counters struct {
	launches, gemms, waits, toDevice atomic.Int64
}

// Counters returns what the Device has counted since Open.
func (d *Device) Counters() Counters {
	c := &d.counts
	return Counters{
		Launches:       c.launches.Load(),
		Gemms:          c.gemms.Load(),
		Waits:          c.waits.Load(),
		CopiesToDevice: c.toDevice.Load(),
	}
}

// The driver calls that the counters count; every Device method calls the
// driver through them.

func (d *Device) drvSynchronize() error {
	d.counts.waits.Add(1)
	return d.drv.synchronize()
}

func (d *Device) drvCopyDtoH(dst []byte, src uint64) error {
	d.counts.waits.Add(1)
	return d.drv.copyDtoH(dst, src)
}

func (d *Device) drvCopyHtoD(dst uint64, src []byte) error {
	d.counts.toDevice.Add(1)
	return d.drv.copyHtoD(dst, src)
}
