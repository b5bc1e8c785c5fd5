package backend

import (
	"cmp"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sort"
	"sync"
)

// MemStats describes a Device's memory. Sizes are in bytes, rounded up to
// the allocator's size classes. InUse counts the blocks requests hold (as
// PyTorch's memory_allocated); Reserved every block the Device holds from
// the driver, in use or cached (as PyTorch's memory_reserved).
type MemStats struct {
	InUse        int64 // in blocks handed out and not yet freed
	Cached       int64 // in free blocks kept for reuse
	PeakInUse    int64 // highest InUse since Open or ResetPeakMemory
	Reserved     int64 // in every block held from the driver
	PeakReserved int64 // highest Reserved since Open or ResetPeakMemory
	InUseBlocks  int
	CachedBlocks int
	DriverAllocs int64 // cuMemAlloc calls that succeeded, since Open
	DriverFrees  int64 // cuMemFree calls, since Open
}

// Size classes. cuMemAlloc and cuMemFree cost microseconds to milliseconds
// and cuMemFree can wait for the whole device, so a training step must not call
// them: freed blocks are kept and handed out again for any request of the
// same class. A step asks for the same sizes every time, so after the first
// step every request is served from the cache. Classes are four per power
// of two (at most 25% waste) up to a step of 2 MiB, then multiples of 2 MiB
// (at most 2 MiB waste), the driver's own large-page granularity.
//
// A request takes a block of its own class only. Serving one from a
// cached block of a larger class was tried (BENCHMARKS.md, Mask R-CNN):
// it cut what a step holds from the driver, but steps got slower, and
// some of their stretches stopped replaying as CUDA graphs. So the cache
// holds, for every size, as many blocks as a step needs of it at once
// (MemStats.Reserved shows how much).
const (
	minBlock  = 512
	largeStep = 2 << 20
	// maxAlloc bounds a request far above any GPU's memory, so that the
	// rounding below cannot overflow.
	maxAlloc = 1 << 50
)

// sizeClass returns the size of the block that serves a request of n bytes.
func sizeClass(n uint64) uint64 {
	if n <= minBlock {
		return minBlock
	}
	k := bits.Len64(n - 1) // 2^(k-1) < n <= 2^k
	step := uint64(1) << (k - 3)
	step = min(step, largeStep)
	return (n + step - 1) &^ (step - 1)
}

// memDriver is the part of the driver the cache uses.
type memDriver interface {
	memAlloc(bytes uint64) (uint64, error)
	memFree(ptr uint64) error
}

// block is one cuMemAlloc allocation; size is its class.
type block struct{ base, size uint64 }

// cache is a caching allocator of device memory by size class. It holds
// every block it got from the driver until releaseCached or releaseAll.
// It knows nothing of streams: a block freed while queued kernels still use
// it is safe to hand out again only because all work of a Device runs on
// its one stream, in order. Before memory goes back to the driver the
// Device synchronises the stream.
type cache struct {
	drv memDriver

	mu     sync.Mutex
	blocks []block             // every block held, sorted by base
	live   map[uint64]uint64   // base -> size of blocks handed out
	cached map[uint64][]uint64 // size -> bases of cached blocks
	stats  MemStats
	// scope is the open Scope's id (0: none); blocks handed out while it
	// is open are tagged with it in tags until freed or kept.
	scope uint64
	tags  map[uint64]uint64
	// unsorted are the size classes whose cached blocks are no longer in
	// canonical order (see endScope).
	unsorted map[uint64]bool
	// scopes counts the scopes ended; lastUse holds, by base, its value
	// when the block was last handed out (takeIdle).
	scopes  uint64
	lastUse map[uint64]uint64
}

func newCache(drv memDriver) *cache {
	return &cache{drv: drv, live: map[uint64]uint64{}, cached: map[uint64][]uint64{}, tags: map[uint64]uint64{},
		unsorted: map[uint64]bool{}, lastUse: map[uint64]uint64{}}
}

// alloc returns the base of a block of at least n bytes.
func (c *cache) alloc(n uint64) (uint64, error) {
	if n > maxAlloc {
		return 0, fmt.Errorf("allocating %d bytes: larger than any device", n)
	}
	size := sizeClass(n)
	c.mu.Lock()
	defer c.mu.Unlock()
	var base uint64
	if list := c.cached[size]; len(list) > 0 {
		base = list[len(list)-1]
		c.cached[size] = list[:len(list)-1]
		c.stats.Cached -= int64(size)
		c.stats.CachedBlocks--
	} else {
		var err error
		if base, err = c.drv.memAlloc(size); err != nil {
			return 0, fmt.Errorf("allocating %d bytes (block of %d; %d in use, %d cached): %w",
				n, size, c.stats.InUse, c.stats.Cached, err)
		}
		c.stats.DriverAllocs++
		c.stats.Reserved += int64(size)
		c.stats.PeakReserved = max(c.stats.PeakReserved, c.stats.Reserved)
		i := sort.Search(len(c.blocks), func(i int) bool { return c.blocks[i].base > base })
		c.blocks = append(c.blocks, block{})
		copy(c.blocks[i+1:], c.blocks[i:])
		c.blocks[i] = block{base, size}
	}
	c.live[base] = size
	c.lastUse[base] = c.scopes
	if c.scope != 0 {
		c.tags[base] = c.scope
	}
	c.stats.InUse += int64(size)
	c.stats.InUseBlocks++
	c.stats.PeakInUse = max(c.stats.PeakInUse, c.stats.InUse)
	return base, nil
}

// free puts the block at base back into the cache.
func (c *cache) free(base uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.freeLocked(base)
}

// freeLocked is free with c.mu held.
func (c *cache) freeLocked(base uint64) error {
	size, ok := c.live[base]
	if !ok {
		if b, ok := c.find(base); ok {
			if b.base == base {
				return fmt.Errorf("freeing %#x: block is already free", base)
			}
			return fmt.Errorf("freeing %#x: address is inside the block at %#x, not its start", base, b.base)
		}
		return fmt.Errorf("freeing %#x: not memory of this device", base)
	}
	delete(c.live, base)
	delete(c.tags, base)
	c.cached[size] = append(c.cached[size], base)
	c.unsorted[size] = true
	c.stats.InUse -= int64(size)
	c.stats.InUseBlocks--
	c.stats.Cached += int64(size)
	c.stats.CachedBlocks++
	return nil
}

// lookup finds the block holding addr, and whether it is handed out.
func (c *cache) lookup(addr uint64) (b block, live, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// A tensor starts where its block does, unless it is a view: one map
	// lookup finds it, on the path of every op's every input.
	if size, ok := c.live[addr]; ok {
		return block{addr, size}, true, true
	}
	if b, ok = c.find(addr); ok {
		_, live = c.live[b.base]
	}
	return b, live, ok
}

func (c *cache) find(addr uint64) (block, bool) {
	i := sort.Search(len(c.blocks), func(i int) bool { return c.blocks[i].base > addr })
	if i == 0 {
		return block{}, false
	}
	b := c.blocks[i-1]
	return b, addr < b.base+b.size
}

// releaseCached gives every cached block back to the driver.
func (c *cache) releaseCached() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for size, list := range c.cached {
		for _, base := range list {
			errs = append(errs, c.release(base, size))
		}
		c.stats.Cached -= int64(size) * int64(len(list))
		c.stats.CachedBlocks -= len(list)
	}
	clear(c.cached)
	return errors.Join(errs...)
}

// releaseAll gives every block back to the driver, also those still handed
// out: the Device is closing. It returns how many were still in use.
func (c *cache) releaseAll() (leaked int, err error) {
	err = c.releaseCached()
	c.mu.Lock()
	defer c.mu.Unlock()
	errs := []error{err}
	leaked = len(c.live)
	for base, size := range c.live {
		errs = append(errs, c.release(base, size))
	}
	clear(c.live)
	clear(c.tags)
	c.stats.InUse, c.stats.InUseBlocks = 0, 0
	return leaked, errors.Join(errs...)
}

// release frees one block; c.mu is held. The block is forgotten even when
// the driver fails (after an error that destroyed the context the memory
// is gone anyway), so that the bookkeeping matches what can be used.
func (c *cache) release(base, size uint64) error {
	err := c.drv.memFree(base)
	c.stats.DriverFrees++
	c.stats.Reserved -= int64(size)
	delete(c.lastUse, base)
	i := sort.Search(len(c.blocks), func(i int) bool { return c.blocks[i].base >= base })
	if i < len(c.blocks) && c.blocks[i].base == base {
		c.blocks = append(c.blocks[:i], c.blocks[i+1:]...)
	}
	if err != nil {
		return fmt.Errorf("freeing block %#x of %d bytes: %w", base, size, err)
	}
	return nil
}

// beginScope tags every block handed out from now on with id.
func (c *cache) beginScope(id uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.scope != 0 {
		return fmt.Errorf("a scope is already open")
	}
	c.scope = id
	return nil
}

// untag takes the live block at base out of its scope.
func (c *cache) untag(base uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.live[base]; !ok {
		return fmt.Errorf("%#x is not the start of a block in use", base)
	}
	delete(c.tags, base)
	return nil
}

// freeTagged frees the block starting at base if it is handed out and
// tagged with scope id, and reports whether it did. An address that is not
// the start of a live block, or a block of another scope or of none, is
// left alone.
func (c *cache) freeTagged(base, id uint64) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if id == 0 || c.tags[base] != id {
		return false, nil
	}
	return true, c.freeLocked(base)
}

// endScope closes scope id and frees every block still tagged with it,
// returning their bases.
func (c *cache) endScope(id uint64) ([]uint64, error) {
	c.mu.Lock()
	if c.scope != id {
		c.mu.Unlock()
		return nil, fmt.Errorf("the scope is not open")
	}
	c.scope = 0
	c.scopes++
	var bases []uint64
	for base, tag := range c.tags {
		if tag == id {
			bases = append(bases, base)
		}
	}
	c.mu.Unlock()
	for _, base := range bases {
		if err := c.free(base); err != nil {
			return bases, err
		}
	}
	c.canonical()
	return bases, nil
}

// canonical puts every size class's cached blocks in one order, the
// lowest address handed out first, so that what a step is handed depends
// only on which blocks the cache holds when it begins, not on the order
// in which the last step's blocks came back (endScope frees them in map
// order). A step that asks for the same sizes in the same order as the
// step before then gets the same addresses, which lets the Device replay
// its work as a CUDA graph (GraphsEnv) without changing it.
func (c *cache) canonical() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for size := range c.unsorted {
		slices.SortFunc(c.cached[size], func(a, b uint64) int { return cmp.Compare(b, a) })
	}
	clear(c.unsorted)
}

// takeIdle takes out of the cache the cached blocks that no request has
// been handed in the last limit scopes, and returns them, for the Device
// to give back to the driver (releaseBlocks) once its stream is idle.
// Steps whose sizes drift (the mask head's RoIs grow as a detector
// trains) would otherwise keep a block of every size they ever used.
func (c *cache) takeIdle(limit uint64) []block {
	c.mu.Lock()
	defer c.mu.Unlock()
	var idle []block
	for size, list := range c.cached {
		kept := list[:0]
		for _, base := range list {
			if c.lastUse[base]+limit < c.scopes {
				idle = append(idle, block{base, size})
			} else {
				kept = append(kept, base)
			}
		}
		if removed := len(list) - len(kept); removed > 0 {
			c.stats.Cached -= int64(size) * int64(removed)
			c.stats.CachedBlocks -= removed
		}
		if len(kept) == 0 {
			delete(c.cached, size)
		} else {
			c.cached[size] = kept
		}
	}
	return idle
}

// releaseBlocks gives blocks takeIdle took back to the driver.
func (c *cache) releaseBlocks(bs []block) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, b := range bs {
		errs = append(errs, c.release(b.base, b.size))
	}
	return errors.Join(errs...)
}

func (c *cache) resetPeak() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stats.PeakInUse = c.stats.InUse
	c.stats.PeakReserved = c.stats.Reserved
}

func (c *cache) snapshot() MemStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}
