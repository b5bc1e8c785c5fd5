package kernels

import (
	"runtime"
	"sync"
)

// parallelFor splits [0,n) into contiguous chunks and runs fn on each chunk
// on its own goroutine, at most GOMAXPROCS at a time. grain is the smallest
// chunk worth a goroutine: below it the work runs on the caller's goroutine,
// where the cost of starting goroutines would outweigh the gain.
func parallelFor(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	workers := runtime.GOMAXPROCS(0)
	if maxWorkers := (n + grain - 1) / grain; workers > maxWorkers {
		workers = maxWorkers
	}
	if workers <= 1 {
		fn(0, n)
		return
	}
	// Chunks a few times smaller than n/workers even out uneven work (RoIs of
	// different sizes, queries whose points fall outside the map) without
	// making chunk bookkeeping noticeable.
	chunk := (n + 4*workers - 1) / (4 * workers)
	if chunk < grain {
		chunk = grain
	}
	var next int
	var mu sync.Mutex
	var wg sync.WaitGroup
	wg.Add(workers)
	for w := 0; w < workers; w++ {
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				lo := next
				next += chunk
				mu.Unlock()
				if lo >= n {
					return
				}
				fn(lo, min(lo+chunk, n))
			}
		}()
	}
	wg.Wait()
}
