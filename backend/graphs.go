package backend

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"unsafe"
)

// GraphsEnv names the switch for replaying a training step's work as CUDA
// graphs: STHENO_CUDA_GRAPHS=0 when a Device is opened turns it off, 1 (the
// default) leaves it on.
//
// Queuing a kernel costs the host a few microseconds, a cuBLAS product
// tens; a training step queues thousands of them, more time than the GPU
// takes to run the short ones. So a Device holds its stream work back:
// kernel launches, cuBLAS products, memsets and device-to-device copies
// are recorded as the ops queue them, and issued together when something
// needs them issued (a copy to or from the host, a wait: Synchronize,
// timing events; a cuMemFree; the next step) or when enough of them have
// queued (graphFirstChunk to graphMaxChunk). Each such stretch of work has
// its place in the step (the first, the second, ... since BeginScope).
// When a stretch repeats the one at its place in the step before (the same
// calls with the same sizes, cuBLAS's and the copies with the same
// addresses; kernels' arguments may differ), it is captured once as a CUDA
// graph and, from then on, replayed with one launch, after updating the
// arguments of the kernels whose arguments changed (AdamW's step, dropout's
// seed, an address the allocator handed out differently). A stretch that
// no longer repeats is issued call by call again; one that keeps changing
// stops being tried. The results are the same either way: the GPU runs the
// same kernels on the same memory in the same order.
//
// Errors of the held-back calls (a bad launch configuration, which
// Launch's own checks do not catch) surface at the call that issues them,
// with the other errors of asynchronous work. STHENO_CUDA_SYNC=1 issues
// every call at once, without graphs.
const GraphsEnv = "STHENO_CUDA_GRAPHS"

func graphsFromEnv() (bool, error) {
	v := os.Getenv(GraphsEnv)
	if v == "" {
		return true, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("backend: %s=%q: want 1 or 0", GraphsEnv, v)
	}
	return b, nil
}

// graphAPI is what a driver offers for CUDA graphs (driver_cuda.go; the
// fake's in fake_test.go). Capturing puts the stream in capture mode: the
// stream calls that follow, the driver's and cuBLAS's, are added to a graph
// instead of running.
type graphAPI interface {
	beginCapture() error
	// capturedNode returns the graph node the last call captured added
	// (a kernel launch's).
	capturedNode() (any, error)
	// endCapture ends capture mode and returns the graph, or an error
	// (with capture mode ended) if some call could not be captured.
	endCapture() (graph any, err error)
	instantiate(graph any) (exec any, err error)
	launchGraph(exec any) error
	// setKernelParams changes the arguments of kernel node (of the graph
	// exec was instantiated from) in exec, for its later launches.
	setKernelParams(exec, node, fn any, cfg LaunchConfig, params unsafe.Pointer) error
	destroyGraph(graph, exec any) error
}

// How replay is tried: stretches shorter than graphMinCalls are issued
// call by call (one graph launch costs about what a few kernel launches
// do); a step's first graphMaxStretches stretches may be replayed (a
// program without Scopes has one endless step); a place whose captured
// stretch changed graphMaxMisses times in a row is issued call by call for
// its next graphRest stretches, then tried again (a training loop that
// evaluates now and then changes its steps' work for a while).
//
// Work held back is work the GPU is not doing, so a long run of it is cut
// into stretches of its own: the first graphFirstChunk calls, then twice
// as many, up to graphMaxChunk, so that the GPU starts soon after the
// host does and then runs while the host records what follows.
const (
	graphMinCalls     = 8
	graphMaxStretches = 256
	graphMaxMisses    = 3
	graphRest         = 64
	graphFirstChunk   = 32
	graphMaxChunk     = 256
)

type callKind uint8

const (
	callKernel callKind = iota
	callGemm
	callMemset
	callCopy
)

// streamCall is one call held back: a kernel launch (its params bytes are
// in the stretch's args), a cuBLAS product, a memset or a
// device-to-device copy.
type streamCall struct {
	kind      callKind
	width     uint8  // memset: bytes per element
	value     uint32 // memset
	fn        any    // kernel
	cfg       LaunchConfig
	off, size uint32 // kernel: its params, args[off:off+size]
	gemm      gemmCall
	dst, src  uint64 // memset, copy
	n         uint64 // memset: elements; copy: bytes
}

// stretch is the calls held back between two issues.
type stretch struct {
	calls []streamCall
	args  []byte
}

func (s *stretch) reset() {
	s.calls = s.calls[:0]
	s.args = s.args[:0]
}

func (s *stretch) params(c *streamCall) []byte { return s.args[c.off : c.off+c.size] }

// noParams stands for the bytes of an empty params struct, which the
// driver reads none of.
var noParams [1]byte

// paramsPtr returns where the driver finds p.
func paramsPtr(p []byte) unsafe.Pointer {
	if len(p) == 0 {
		return unsafe.Pointer(&noParams[0])
	}
	return unsafe.Pointer(&p[0])
}

// repeats reports whether s makes the same calls as o, kernels' arguments
// aside.
func (s *stretch) repeats(o *stretch) bool {
	if len(s.calls) != len(o.calls) {
		return false
	}
	for i := range s.calls {
		a, b := &s.calls[i], &o.calls[i]
		if a.kind != b.kind {
			return false
		}
		switch a.kind {
		case callKernel:
			if a.fn != b.fn || a.cfg != b.cfg || a.size != b.size {
				return false
			}
		case callGemm:
			if a.gemm != b.gemm {
				return false
			}
		default:
			if *a != *b {
				return false
			}
		}
	}
	return true
}

// graphSlot is what is known of the stretches at one place in the step.
type graphSlot struct {
	last        stretch // the stretch last issued here
	graph, exec any     // its graph, once captured
	nodes       []any   // the graph's kernel node of each of last's calls
	misses      int     // captured stretches that changed, in a row
	rest        int     // stretches still to issue call by call before trying again
}

// GraphStats counts what became of the stretches of held-back work
// (GraphsEnv) since the Device was opened.
type GraphStats struct {
	// Replays counts stretches launched as a CUDA graph captured before;
	// Captures, those captured (and launched); Direct, those issued call
	// by call.
	Replays, Captures, Direct int64
	// Updated counts kernel nodes whose arguments were changed before a
	// replay.
	Updated int64
}

// replayDriver is the Device's driver when graphs are on: it holds the
// stream calls back and issues them as above; every other call goes to
// the driver it wraps, after the held-back work when it depends on it.
type replayDriver struct {
	driver
	g graphAPI

	mu      sync.Mutex
	pending stretch
	place   int // the pending stretch's place in the step
	chunk   int // the pending stretch's limit (graphFirstChunk...)
	slots   []*graphSlot
	blas    blasDriver // the wrapped handle, once made
	stats   GraphStats
}

// withGraphs returns drv, wrapped in a replayDriver when graphs are on,
// launches are not synchronous and drv can make graphs.
func withGraphs(drv driver, on, syncLaunches bool) driver {
	g, ok := drv.(graphAPI)
	if !on || syncLaunches || !ok {
		return drv
	}
	return &replayDriver{driver: drv, g: g}
}

// GraphStats returns what became of d's held-back work (GraphsEnv); all
// zeros when graphs are off.
func (d *Device) GraphStats() GraphStats {
	if r, ok := d.drv.(*replayDriver); ok {
		return r.graphStats()
	}
	return GraphStats{}
}

// Flush issues the stream work d holds back (GraphsEnv) and returns
// without waiting for it: the GPU can start on it while the host does
// something long of its own. Nothing else needs it; every call that
// depends on the work issues it first. Errors of the work it issues
// surface as those of any asynchronous work do.
func (d *Device) Flush() error {
	r, ok := d.drv.(*replayDriver)
	if !ok {
		return nil
	}
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	if err := r.issue(); err != nil {
		return d.asyncError("issuing held-back work", err)
	}
	return nil
}

// Graphs reports whether d holds its stream work back and replays it as
// CUDA graphs (GraphsEnv).
func (d *Device) Graphs() bool {
	_, ok := d.drv.(*replayDriver)
	return ok
}

func (r *replayDriver) hold(c streamCall) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending.calls = append(r.pending.calls, c)
	return r.held()
}

// held issues the pending stretch if it has grown to its limit; r.mu is
// held.
func (r *replayDriver) held() error {
	if r.chunk == 0 {
		r.chunk = graphFirstChunk
	}
	if len(r.pending.calls) < r.chunk {
		return nil
	}
	err := r.issueLocked()
	r.chunk = min(2*r.chunk, graphMaxChunk)
	return err
}

func (r *replayDriver) launch(fn any, cfg LaunchConfig, params unsafe.Pointer, size uintptr) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	off := len(r.pending.args)
	r.pending.args = append(r.pending.args, unsafe.Slice((*byte)(params), size)...)
	r.pending.calls = append(r.pending.calls, streamCall{kind: callKernel, fn: fn, cfg: cfg, off: uint32(off), size: uint32(size)})
	return r.held()
}

func (r *replayDriver) memset(dst uint64, elemSize int, value uint32, n uint64) error {
	if elemSize != 1 && elemSize != 2 && elemSize != 4 {
		return r.driver.memset(dst, elemSize, value, n) // its error, at once
	}
	return r.hold(streamCall{kind: callMemset, dst: dst, width: uint8(elemSize), value: value, n: n})
}

func (r *replayDriver) copyDtoD(dst, src, bytes uint64) error {
	return r.hold(streamCall{kind: callCopy, dst: dst, src: src, n: bytes})
}

// The calls that need the held-back work queued first. They run under
// r.mu, after it: a capture (issueLocked) holds r.mu too, so no call of
// another goroutine can land in a graph being captured.

func (r *replayDriver) issue() error {
	return r.issueThen(nil)
}

// issueThen issues the held-back work and then, if it was issued, makes
// the call f, both under r.mu.
func (r *replayDriver) issueThen(f func() error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.chunk = graphFirstChunk
	if err := r.issueLocked(); err != nil || f == nil {
		return err
	}
	return f()
}

func (r *replayDriver) memFree(ptr uint64) error {
	return r.issueThen(func() error { return r.driver.memFree(ptr) })
}

func (r *replayDriver) copyHtoD(dst uint64, src []byte) error {
	return r.issueThen(func() error { return r.driver.copyHtoD(dst, src) })
}

func (r *replayDriver) copyDtoH(dst []byte, src uint64) error {
	return r.issueThen(func() error { return r.driver.copyDtoH(dst, src) })
}

func (r *replayDriver) synchronize() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.chunk = graphFirstChunk
	return errors.Join(r.issueLocked(), r.driver.synchronize())
}

func (r *replayDriver) eventRecord() (ev any, err error) {
	err = r.issueThen(func() error {
		ev, err = r.driver.eventRecord()
		return err
	})
	return ev, err
}

func (r *replayDriver) setMaxDynamicShared(fn any, bytes int) error {
	return r.issueThen(func() error { return r.driver.setMaxDynamicShared(fn, bytes) })
}

func (r *replayDriver) unloadModule(mod any) error {
	return errors.Join(r.forget(), r.driver.unloadModule(mod))
}

func (r *replayDriver) close() error {
	return errors.Join(r.forget(), r.driver.close())
}

// forget issues the held-back work and destroys every graph: what they
// captured (a module's kernels, cuBLAS's workspace) is going away.
func (r *replayDriver) forget() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.forgetLocked()
}

func (r *replayDriver) forgetLocked() error {
	err := r.issueLocked()
	for _, s := range r.slots {
		err = errors.Join(err, r.dropGraph(s))
	}
	r.slots = nil
	return err
}

// beginStep issues the work held back and starts counting places anew: a
// Scope has begun.
func (r *replayDriver) beginStep() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.issueLocked()
	r.place = 0
	r.chunk = graphFirstChunk
	return err
}

func (r *replayDriver) graphStats() GraphStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

func (r *replayDriver) openBLAS() (blasDriver, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := r.driver.openBLAS()
	if err != nil {
		return nil, err
	}
	r.blas = b
	return &replayBLAS{blasDriver: b, r: r}, nil
}

// replayBLAS holds cuBLAS products back with the rest.
type replayBLAS struct {
	blasDriver
	r *replayDriver
}

func (b *replayBLAS) gemm(c gemmCall) error {
	return b.r.hold(streamCall{kind: callGemm, gemm: c})
}

func (b *replayBLAS) setWorkspace(ptr, bytes uint64) error {
	r := b.r
	r.mu.Lock()
	defer r.mu.Unlock()
	return errors.Join(r.forgetLocked(), b.blasDriver.setWorkspace(ptr, bytes))
}

func (b *replayBLAS) close() error {
	err := b.r.forget()
	b.r.mu.Lock()
	b.r.blas = nil
	b.r.mu.Unlock()
	return errors.Join(err, b.blasDriver.close())
}

// issueLocked queues the pending stretch on the stream: replayed, captured
// or call by call (see GraphsEnv). r.mu is held.
func (r *replayDriver) issueLocked() error {
	s := &r.pending
	if len(s.calls) == 0 {
		return nil
	}
	defer s.reset()
	place := r.place
	r.place++
	if place >= graphMaxStretches || len(s.calls) < graphMinCalls {
		r.stats.Direct++
		return r.direct(s)
	}
	for len(r.slots) <= place {
		r.slots = append(r.slots, &graphSlot{})
	}
	slot := r.slots[place]
	if slot.rest > 0 {
		slot.rest--
		if slot.rest == 0 {
			slot.last.reset() // start afresh: record this one
		} else {
			r.stats.Direct++
			return r.direct(s)
		}
	}
	// From here on s becomes slot.last, and slot.last's memory the next
	// pending stretch.
	defer func() { slot.last, *s = *s, slot.last }()
	if !s.repeats(&slot.last) {
		if slot.exec != nil {
			slot.misses++
			if slot.misses >= graphMaxMisses {
				slot.misses, slot.rest = 0, graphRest
			}
		}
		err := r.dropGraph(slot)
		r.stats.Direct++
		return errors.Join(err, r.direct(s))
	}
	if slot.exec == nil {
		err := r.capture(slot, s)
		if err == nil {
			r.stats.Captures++
			return r.g.launchGraph(slot.exec)
		}
		// A stretch that cannot be captured (on this driver, with this
		// cuBLAS) rests as one that keeps changing does; its work still
		// has to run.
		slot.rest = graphRest
		r.stats.Direct++
		return r.direct(s)
	}
	for i := range s.calls {
		c := &s.calls[i]
		if c.kind != callKernel {
			continue
		}
		p := s.params(c)
		if bytes.Equal(p, slot.last.params(&slot.last.calls[i])) {
			continue
		}
		if err := r.g.setKernelParams(slot.exec, slot.nodes[i], c.fn, c.cfg, paramsPtr(p)); err != nil {
			// The graph may now hold some new arguments and some old:
			// issue this stretch call by call and capture afresh next time.
			derr := r.dropGraph(slot)
			r.stats.Direct++
			return errors.Join(derr, r.direct(s))
		}
		r.stats.Updated++
	}
	r.stats.Replays++
	slot.misses = 0
	return r.g.launchGraph(slot.exec)
}

// direct queues s's calls one by one.
func (r *replayDriver) direct(s *stretch) error {
	for i := range s.calls {
		if err := r.call(s, i); err != nil {
			return err
		}
	}
	return nil
}

// call queues s's call i on the wrapped driver.
func (r *replayDriver) call(s *stretch, i int) error {
	c := &s.calls[i]
	switch c.kind {
	case callKernel:
		return r.driver.launch(c.fn, c.cfg, paramsPtr(s.params(c)), uintptr(c.size))
	case callGemm:
		if r.blas == nil {
			return errors.New("backend: a cuBLAS product was held back after its handle closed")
		}
		return r.blas.gemm(c.gemm)
	case callMemset:
		return r.driver.memset(c.dst, int(c.width), c.value, c.n)
	default:
		return r.driver.copyDtoD(c.dst, c.src, c.n)
	}
}

// capture records s's calls as slot's graph and instantiates it.
func (r *replayDriver) capture(slot *graphSlot, s *stretch) error {
	if err := r.g.beginCapture(); err != nil {
		return err
	}
	slot.nodes = slot.nodes[:0]
	var err error
	for i := range s.calls {
		if err = r.call(s, i); err != nil {
			break
		}
		var node any
		if s.calls[i].kind == callKernel {
			if node, err = r.g.capturedNode(); err != nil {
				break
			}
		}
		slot.nodes = append(slot.nodes, node)
	}
	graph, eerr := r.g.endCapture()
	if err = errors.Join(err, eerr); err != nil {
		if graph != nil {
			err = errors.Join(err, r.g.destroyGraph(graph, nil))
		}
		return err
	}
	exec, err := r.g.instantiate(graph)
	if err != nil {
		return errors.Join(err, r.g.destroyGraph(graph, nil))
	}
	slot.graph, slot.exec = graph, exec
	return nil
}

// dropGraph destroys slot's graph, if any.
func (r *replayDriver) dropGraph(slot *graphSlot) error {
	if slot.graph == nil {
		return nil
	}
	err := r.g.destroyGraph(slot.graph, slot.exec)
	slot.graph, slot.exec = nil, nil
	return err
}
