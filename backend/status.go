package backend

import "encoding/binary"

// The status word: how a kernel reports bad input that only the data shows
// (a RoI whose batch index is out of range, say) without the host waiting
// for every launch. Each Device has one int32 of device memory, zero when
// all is well; kernels raise it with atomicMax. After queuing such a kernel
// an op calls WatchStatus with a function that explains a nonzero code; the
// next call that waits for the stream (ToHost, Synchronize, or a launch when
// STHENO_CUDA_SYNC is set) reads the word, clears it, and returns the
// explanation as its error. The error arrives at the next synchronisation,
// like any error of asynchronous GPU work, instead of costing every launch a
// round trip.

// StatusWord returns the address of the Device's status word, allocating it
// on first use. It outlives every Scope.
func (d *Device) StatusWord() (DevicePtr, error) {
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.exit()
	d.statusMu.Lock()
	defer d.statusMu.Unlock()
	if d.status != 0 {
		return DevicePtr(d.status), nil
	}
	base, err := d.alloc(4)
	if err != nil {
		return 0, err
	}
	// Allocated on behalf of the Device, not of the step that asked first.
	if err := d.mem.untag(base); err != nil {
		return 0, d.errorf("status word: %w", err)
	}
	if err := d.drv.memset(base, 4, 0, 1); err != nil {
		return 0, d.errorf("status word: %w", err)
	}
	d.status = base
	return DevicePtr(base), nil
}

// WatchStatus asks the next synchronisation to check the status word and,
// if a kernel raised it, to return explain(code). When several ops are
// watching, each explain is called in turn and the first non-nil error is
// returned, so an op's explain should return nil for codes it does not own.
func (d *Device) WatchStatus(explain func(code int32) error) {
	d.statusMu.Lock()
	d.watchers = append(d.watchers, explain)
	d.statusMu.Unlock()
}

// checkStatus reads and clears the status word after the stream has been
// waited for, when someone is watching it.
func (d *Device) checkStatus() error {
	d.statusMu.Lock()
	watchers := d.watchers
	d.watchers = nil
	addr := d.status
	d.statusMu.Unlock()
	if len(watchers) == 0 || addr == 0 {
		return nil
	}
	var buf [4]byte
	// The stream is done already: not a wait the counters count.
	if err := d.drv.copyDtoH(buf[:], addr); err != nil {
		return d.errorf("reading the status word: %w", err)
	}
	code := int32(binary.LittleEndian.Uint32(buf[:]))
	if code == 0 {
		return nil
	}
	if err := d.drv.memset(addr, 4, 0, 1); err != nil {
		return d.errorf("clearing the status word: %w", err)
	}
	for _, explain := range watchers {
		if err := explain(code); err != nil {
			return err
		}
	}
	return d.errorf("a kernel reported status %d that no op explained", code)
}
