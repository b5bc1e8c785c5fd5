package backend

import (
	"sync"

	"gorgonia.org/tensor"
)

// Scope frees, in one call, the device memory a training step made.
//
// Gorgonia never frees values: a TapeMachine run after Reset makes a new
// output for every op (and Engine.Add a new sum for every gradient it
// accumulates), and on the host Go's collector takes the old ones. Device
// memory needs a free, and the collector cannot decide it safely: a view or
// shallow clone of a device tensor does not keep the tensor that owns the
// memory alive. A Scope makes the step the unit instead:
//
//	s, _ := dev.BeginScope()
//	// Let the inputs (ToDevice), m.RunAll(), read the loss (ToHost),
//	// update the parameters (Axpy), s.Keep what must outlive the step.
//	s.End() // every other device allocation of the step goes back to the cache
//	m.Reset()
//
// After the first step, later steps are served from the cache: no
// cuMemAlloc, no cuMemFree. Parameters made before BeginScope are not
// touched. Every device allocation made while the Scope is open belongs to
// it, whichever goroutine makes it; one Scope per Device is open at a time.
type Scope struct {
	d  *Device
	id uint64

	mu     sync.Mutex
	denses map[uint64]*tensor.Dense // base -> tensor made in the scope
}

// BeginScope opens a Scope on d.
func (d *Device) BeginScope() (*Scope, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.exit()
	if r, ok := d.drv.(*replayDriver); ok {
		if err := r.beginStep(); err != nil {
			return nil, d.asyncError("BeginScope", err)
		}
	}
	d.smu.Lock()
	defer d.smu.Unlock()
	d.nextScope++
	s := &Scope{d: d, id: d.nextScope, denses: map[uint64]*tensor.Dense{}}
	if err := d.mem.beginScope(s.id); err != nil {
		return nil, d.errorf("BeginScope: %w", err)
	}
	d.scope.Store(s)
	return s, nil
}

// track records a tensor made while a scope may be open, so that End can
// empty it.
func (d *Device) track(base uint64, t *tensor.Dense) {
	if s := d.scope.Load(); s != nil {
		s.mu.Lock()
		s.denses[base] = t
		s.mu.Unlock()
	}
}

// Keep takes tensors made in the scope out of it: End leaves them alone.
// Each must own its memory (not be a view).
func (s *Scope) Keep(ts ...*tensor.Dense) error {
	d := s.d
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	for _, t := range ts {
		if t == nil || t.IsView() {
			return d.errorf("Scope.Keep: want a tensor that owns its memory, got a view or nil")
		}
		base := rawAddr(t.Raw)
		if err := d.mem.untag(base); err != nil {
			return d.errorf("Scope.Keep: %v tensor: %w", t.Shape(), err)
		}
		s.mu.Lock()
		delete(s.denses, base)
		s.mu.Unlock()
	}
	return nil
}

// Release gives the memory of tensors made in the scope back to the
// cache before the scope ends, once nothing queued after this call reads
// them: a step frees each intermediate after its last reader, so that the
// step's peak holds only what is live at once (ops.NewTapeMachine does
// this for device graphs). A block released here may be handed to work
// queued later, which is safe because all of a Device's work runs on its
// one stream, in order. Each released tensor is emptied, as End empties
// them, so that a later use fails instead of reading memory handed out
// again; views of it must not be used either.
//
// Only tensors that own their memory and were made while the scope is
// open, not kept and not yet released, are released; others (parameters
// made before it opened, host tensors, views, tensors of another Device)
// are left alone. Release returns how many it released.
func (s *Scope) Release(ts ...*tensor.Dense) (int, error) {
	d := s.d
	if err := d.enter(); err != nil {
		return 0, err
	}
	defer d.exit()
	released := 0
	for _, t := range ts {
		if t == nil || t.IsView() || t.IsNativelyAccessible() || len(t.Raw) == 0 {
			continue
		}
		base := rawAddr(t.Raw)
		ok, err := d.mem.freeTagged(base, s.id)
		if err != nil {
			return released, d.errorf("Scope.Release: %v tensor: %w", t.Shape(), err)
		}
		if !ok {
			continue
		}
		s.mu.Lock()
		delete(s.denses, base)
		s.mu.Unlock()
		t.Raw = nil
		released++
	}
	return released, nil
}

// OpenScope returns the Scope open on d, or nil.
func (d *Device) OpenScope() *Scope {
	return d.scope.Load()
}

// idleScopes is how many Scopes a cached block may go unused before
// Scope.End gives it back to the driver (cache.takeIdle): a training loop
// uses every block of its step every step, so only the sizes a drifting
// step has left behind go, at the price of one wait for the stream when
// they do.
const idleScopes = 100

// End closes the scope and gives every device allocation made in it and
// not kept back to the cache. The tensors made in it are emptied, like
// FreeDense empties them, so that a later use fails instead of reading
// memory handed out again; their views are not, and must not be used.
// Cached blocks that no request has taken in the last 100 Scopes go back
// to the driver, after a wait for the stream.
func (s *Scope) End() error {
	d := s.d
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	bases, err := d.mem.endScope(s.id)
	d.smu.Lock()
	d.scope.CompareAndSwap(s, nil)
	d.smu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, base := range bases {
		// tensor's pool may have recycled the Dense for other memory since.
		if t := s.denses[base]; t != nil && rawAddr(t.Raw) == base {
			t.Raw = nil
		}
	}
	clear(s.denses)
	if err != nil {
		return d.errorf("Scope.End: %w", err)
	}
	if idle := d.mem.takeIdle(idleScopes); len(idle) > 0 {
		// Memory goes back to the driver only with the stream idle (see
		// cache).
		if err := d.drvSynchronize(); err != nil {
			return d.asyncError("Scope.End: giving idle cached memory back", err)
		}
		if err := d.mem.releaseBlocks(idle); err != nil {
			return d.errorf("Scope.End: %w", err)
		}
	}
	return nil
}
