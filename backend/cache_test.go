package backend

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestSizeClass(t *testing.T) {
	const mi = 1 << 20
	for _, c := range []struct{ n, want uint64 }{
		{0, 512}, {1, 512}, {512, 512},
		{513, 640}, {640, 640}, {641, 768}, {1024, 1024}, {1025, 1280},
		{3 * mi, 3 * mi}, {3*mi + 1, 3*mi + mi/2},
		{5 * mi, 5 * mi}, {5*mi + 1, 6 * mi},
		{9 * mi, 10 * mi}, {100*mi + 1, 102 * mi},
		{1 << 40, 1 << 40},
	} {
		got := sizeClass(c.n)
		if got != c.want {
			t.Errorf("sizeClass(%d) = %d, want %d", c.n, got, c.want)
		}
		if got < c.n {
			t.Errorf("sizeClass(%d) = %d is smaller than the request", c.n, got)
		}
		// Waste: at most 25% and at most 2 MiB above the smallest block.
		if c.n > minBlock && (got-c.n > c.n/4 || got-c.n > largeStep) {
			t.Errorf("sizeClass(%d) = %d wastes %d bytes", c.n, got, got-c.n)
		}
	}
}

// countingMem is a memDriver that hands out fake addresses and counts.
type countingMem struct {
	next          uint64
	allocs, frees int
	live          map[uint64]bool
	failAt        int // fail the failAt-th alloc (1-based); 0: never
}

func (m *countingMem) memAlloc(bytes uint64) (uint64, error) {
	m.allocs++
	if m.allocs == m.failAt {
		return 0, fakeError("cuMemAlloc", codeOutOfMemory)
	}
	if m.live == nil {
		m.live = map[uint64]bool{}
		m.next = 1 << 40
	}
	p := m.next
	m.next += bytes + 4096
	m.live[p] = true
	return p, nil
}

func (m *countingMem) memFree(p uint64) error {
	m.frees++
	if !m.live[p] {
		return fakeError("cuMemFree", codeInvalidValue)
	}
	delete(m.live, p)
	return nil
}

func TestCacheReusesBlocks(t *testing.T) {
	drv := &countingMem{}
	c := newCache(drv)
	sizes := []uint64{0, 1, 100, 4096, 1<<20 + 3, 3 << 20, 10 << 20, 1000}
	var warm MemStats
	for iter := range 10 {
		var ptrs []uint64
		for _, n := range sizes {
			p, err := c.alloc(n)
			if err != nil {
				t.Fatalf("iteration %d: alloc(%d): %v", iter, n, err)
			}
			ptrs = append(ptrs, p)
		}
		for i := len(ptrs) - 1; i >= 0; i-- {
			if err := c.free(ptrs[i]); err != nil {
				t.Fatalf("iteration %d: free: %v", iter, err)
			}
		}
		s := c.snapshot()
		if s.InUse != 0 || s.InUseBlocks != 0 {
			t.Fatalf("iteration %d: %+v after freeing everything", iter, s)
		}
		if iter == 0 {
			warm = s
			continue
		}
		if s.DriverAllocs != warm.DriverAllocs || s.DriverFrees != 0 {
			t.Fatalf("iteration %d: %d driver allocs and %d frees, want %d and 0 after warm-up",
				iter, s.DriverAllocs, s.DriverFrees, warm.DriverAllocs)
		}
	}
	// Blocks in use at once are distinct, even of one class (0, 1 and 100).
	if want := int64(len(sizes)); warm.DriverAllocs != want {
		t.Errorf("warm-up made %d driver allocs, want %d", warm.DriverAllocs, want)
	}
	if warm.Cached != warm.PeakInUse {
		t.Errorf("cached %d bytes, peak in use %d: want equal", warm.Cached, warm.PeakInUse)
	}
	if err := c.releaseCached(); err != nil {
		t.Fatal(err)
	}
	s := c.snapshot()
	if s.Cached != 0 || s.CachedBlocks != 0 || s.DriverFrees != s.DriverAllocs || len(drv.live) != 0 || len(c.blocks) != 0 {
		t.Errorf("after releaseCached: %+v, %d blocks live in the driver, %d known", s, len(drv.live), len(c.blocks))
	}
}

func TestCacheLookupAndErrors(t *testing.T) {
	c := newCache(&countingMem{})
	a, _ := c.alloc(1000) // class 1024
	b, _ := c.alloc(100)
	for _, cs := range []struct {
		addr       uint64
		ok, live   bool
		base, size uint64
	}{
		{a, true, true, a, 1024},
		{a + 1023, true, true, a, 1024},
		{a + 1024, false, false, 0, 0},
		{a - 1, false, false, 0, 0},
		{b + 10, true, true, b, 512},
	} {
		blk, live, ok := c.lookup(cs.addr)
		if ok != cs.ok || live != cs.live || ok && (blk.base != cs.base || blk.size != cs.size) {
			t.Errorf("lookup(%#x) = %+v, %v, %v; want base %#x size %d, %v, %v", cs.addr, blk, live, ok, cs.base, cs.size, cs.live, cs.ok)
		}
	}
	for _, cs := range []struct {
		addr uint64
		want string
	}{
		{a + 8, "not its start"},
		{12345, "not memory of this device"},
	} {
		if err := c.free(cs.addr); err == nil || !strings.Contains(err.Error(), cs.want) {
			t.Errorf("free(%#x) = %v, want an error saying %q", cs.addr, err, cs.want)
		}
	}
	if err := c.free(a); err != nil {
		t.Fatal(err)
	}
	if _, live, ok := c.lookup(a); !ok || live {
		t.Errorf("lookup of a freed block: live %v, found %v; want cached", live, ok)
	}
	if err := c.free(a); err == nil || !strings.Contains(err.Error(), "already free") {
		t.Errorf("double free = %v, want an error", err)
	}
	leaked, err := c.releaseAll()
	if err != nil || leaked != 1 {
		t.Errorf("releaseAll = %d, %v; want 1 leaked block (b), no error", leaked, err)
	}
	if s := c.snapshot(); s.InUse != 0 || s.Cached != 0 || s.DriverFrees != 2 {
		t.Errorf("after releaseAll: %+v", s)
	}
}

func TestCacheDriverFailure(t *testing.T) {
	c := newCache(&countingMem{failAt: 2})
	if _, err := c.alloc(10); err != nil {
		t.Fatal(err)
	}
	_, err := c.alloc(1 << 20)
	if err == nil || !isOutOfMemory(err) || !strings.Contains(err.Error(), "allocating 1048576 bytes") {
		t.Errorf("alloc with a failing driver = %v, want a wrapped out-of-memory error", err)
	}
	if s := c.snapshot(); s.InUseBlocks != 1 || s.DriverAllocs != 1 {
		t.Errorf("after a failed alloc: %+v", s)
	}
	if _, err := c.alloc(maxAlloc + 1); err == nil {
		t.Error("alloc of more than maxAlloc succeeded")
	}
}

// TestCacheStepsGetTheSameBlocks: whatever order a scope's blocks come
// back in, the next scope that asks for the same sizes in the same order
// is handed the same blocks in the same order (what lets a Device replay a
// step's work as a CUDA graph).
func TestCacheStepsGetTheSameBlocks(t *testing.T) {
	c := newCache(&countingMem{})
	step := func(id uint64, freeEarly []int) []uint64 {
		t.Helper()
		if err := c.beginScope(id); err != nil {
			t.Fatal(err)
		}
		var got []uint64
		for _, n := range []uint64{1000, 1000, 4000, 1000, 4000} {
			b, err := c.alloc(n)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, b)
		}
		// Some blocks die mid-step, in an order of the caller's choosing;
		// the rest at the scope's end, in map order.
		for _, i := range freeEarly {
			if _, err := c.freeTagged(got[i], id); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.endScope(id); err != nil {
			t.Fatal(err)
		}
		return got
	}
	first := step(1, nil)
	want := step(2, []int{1, 0})
	for id := uint64(3); id < 10; id++ {
		early := []int{1, 0}
		if id%2 == 0 {
			early = []int{0, 1}
		}
		if got := step(id, early); !slices.Equal(got, want) {
			t.Fatalf("step %d was handed %x, step 2 %x (step 1 %x)", id, got, want, first)
		}
	}
}

// Reserved counts every block held from the driver, in use or cached, and
// PeakReserved the most it reached.
func TestCacheReserved(t *testing.T) {
	const mi = 1 << 20
	c := newCache(&countingMem{})
	a, _ := c.alloc(100 * mi)
	b, _ := c.alloc(3 * mi)
	if err := c.free(a); err != nil {
		t.Fatal(err)
	}
	if s := c.snapshot(); s.InUse != 3*mi || s.Cached != 100*mi || s.Reserved != 103*mi || s.PeakReserved != 103*mi {
		t.Fatalf("3 MiB in use, 100 MiB cached: %+v", s)
	}
	if err := c.free(b); err != nil {
		t.Fatal(err)
	}
	if err := c.releaseCached(); err != nil {
		t.Fatal(err)
	}
	if s := c.snapshot(); s.Reserved != 0 || s.PeakReserved != 103*mi {
		t.Fatalf("after releaseCached: %+v", s)
	}
	c.resetPeak()
	if s := c.snapshot(); s.PeakReserved != 0 {
		t.Fatalf("after resetPeak: %+v", s)
	}
}

// Cached blocks that no request has taken in the last idleScopes scopes
// leave the cache (Scope.End gives them back to the driver); blocks the
// steps keep using stay. Steps whose sizes drift (a Mask R-CNN's mask
// head's, rounded to eight sizes an octave, as its RoIs grow over
// training) then hold a few times a step's memory in the cache, not a
// block of every size they met.
func TestCacheGivesIdleBlocksBack(t *testing.T) {
	const mi = 1 << 20
	drv := &countingMem{}
	c := newCache(drv)
	step := func(id uint64, sizes ...uint64) {
		t.Helper()
		if err := c.beginScope(id); err != nil {
			t.Fatal(err)
		}
		for _, n := range sizes {
			if _, err := c.alloc(n); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := c.endScope(id); err != nil {
			t.Fatal(err)
		}
		if err := c.releaseBlocks(c.takeIdle(idleScopes)); err != nil {
			t.Fatal(err)
		}
	}
	step(1, 3*mi, 5*mi)
	for id := uint64(2); id <= idleScopes; id++ {
		step(id, 3*mi)
	}
	if s := c.snapshot(); s.CachedBlocks != 2 || drv.frees != 0 {
		t.Fatalf("after %d scopes without the 5 MiB block: %+v, %d frees; want both blocks still cached", idleScopes-1, s, drv.frees)
	}
	step(idleScopes+1, 3*mi)
	if s := c.snapshot(); s.CachedBlocks != 1 || s.Cached != 3*mi || drv.frees != 1 {
		t.Fatalf("after %d scopes without the 5 MiB block: %+v, %d frees; want it given back, the 3 MiB block kept", idleScopes, s, drv.frees)
	}

	// Steps of three tensors sized by a step's number of RoIs, which
	// drifts from 100 to 1000 over 3000 steps, ±25% from step to step.
	drv = &countingMem{}
	c = newCache(drv)
	rng := rand.New(rand.NewPCG(1, 2))
	var most, cached int64
	for id := range uint64(3000) {
		mid := 100 + 900*int(id)/3000
		rois := uint64(mid - mid/4 + rng.IntN(mid/2))
		// Rounded up to 8..15 times a power of two.
		e := uint64(1)
		for rois > 15*e {
			e *= 2
		}
		rois = (rois + e - 1) / e * e
		var sizes []uint64
		for _, per := range []uint64{802816, 200704, 802816} { // bytes per RoI: 256x28x28 and 256x14x14 float32
			sizes = append(sizes, rois*per)
		}
		step(id+1, sizes...)
		most = max(most, int64(3*rois*802816))
		cached = max(cached, c.snapshot().Cached)
	}
	if cached > 6*most {
		t.Errorf("3000 steps of drifting sizes cached up to %d MiB, %.1f times the most a step used (%d MiB); %d driver allocations",
			cached/mi, float64(cached)/float64(most), most/mi, drv.allocs)
	}
	t.Logf("3000 steps of drifting sizes: at most %d MiB cached, %.1f times a step's most (%d MiB); %d driver allocations, %d frees",
		cached/mi, float64(cached)/float64(most), most/mi, drv.allocs, drv.frees)
}
