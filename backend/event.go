package backend

import "time"

// Event is a point in a Device's stream, for timing GPU work with CUDA
// events: the time between two events is the GPU's, free of launch and
// host overheads.
type Event struct {
	d  *Device
	ev any
}

// Record queues an event on the stream after the work queued so far.
func (d *Device) Record() (*Event, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.exit()
	ev, err := d.drv.eventRecord()
	if err != nil {
		return nil, d.errorf("recording an event: %w", err)
	}
	return &Event{d: d, ev: ev}, nil
}

// Elapsed waits until end is reached and returns the GPU time from start to
// end. Both must be events of d.
func (d *Device) Elapsed(start, end *Event) (time.Duration, error) {
	if start == nil || end == nil || start.d != d || end.d != d {
		return 0, d.errorf("Elapsed: events of another device, or nil")
	}
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.exit()
	d.counts.waits.Add(1)
	ms, err := d.drv.eventElapsed(start.ev, end.ev)
	if err != nil {
		return 0, d.asyncError("timing events", err)
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// Release frees the event.
func (e *Event) Release() error {
	if e == nil || e.ev == nil {
		return nil
	}
	d := e.d
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	err := d.drv.eventDestroy(e.ev)
	e.ev = nil
	if err != nil {
		return d.errorf("releasing an event: %w", err)
	}
	return nil
}
