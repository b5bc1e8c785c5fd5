package benchutil

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stheno-ml/stheno/backend"
)

// GPU opens the first GPU, or skips b when there is none.
func GPU(b testing.TB) *backend.Device {
	dev, err := backend.Open(0)
	if errors.Is(err, backend.ErrNoDevice) {
		b.Skipf("no GPU: %v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	return dev
}

// Steps runs step warm times, then b.N times timed (reset is called
// between, to clear what the net counts), and reports per step: ms, img/s
// of batch images, the peak of dev's memory in use and reserved
// (backend.MemStats) in GiB, and its kernel
// launches, GEMMs, waits and the stretches of them replayed as CUDA graphs
// (backend.GraphsEnv). It returns the milliseconds per step.
func Steps(b *testing.B, dev *backend.Device, batch, warm int, reset, step func()) float64 {
	for range warm {
		step()
	}
	if err := dev.Synchronize(); err != nil {
		b.Fatal(err)
	}
	dev.ResetPeakMemory()
	reset()
	counts, graphs := dev.Counters(), dev.GraphStats()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		step()
	}
	if err := dev.Synchronize(); err != nil {
		b.Fatal(err)
	}
	wall := time.Since(start)
	b.StopTimer()
	per := dev.Counters().Sub(counts)
	ms := wall.Seconds() * 1e3 / float64(b.N)
	b.ReportMetric(ms, "ms")
	b.ReportMetric(float64(batch)*1e3/ms, "img/s")
	mem := dev.MemStats()
	b.ReportMetric(float64(mem.PeakInUse)/(1<<30), "peak-GiB")
	b.ReportMetric(float64(mem.PeakReserved)/(1<<30), "reserved-GiB")
	b.ReportMetric(float64(per.Launches)/float64(b.N), "launches")
	b.ReportMetric(float64(per.Gemms)/float64(b.N), "gemms")
	b.ReportMetric(float64(per.Waits)/float64(b.N), "waits")
	b.ReportMetric(float64(dev.GraphStats().Replays-graphs.Replays)/float64(b.N), "graph-replays")
	return ms
}

// HostTimes reports each host step's time over steps steps, per step, as
// the metric "<name>-ms" (spaces as dashes), and returns them, by name,
// as "name 1.23 ms".
func HostTimes(b *testing.B, times map[string]time.Duration, steps int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(times)) {
		ms := times[k].Seconds() * 1e3 / float64(steps)
		b.ReportMetric(ms, strings.ReplaceAll(k, " ", "-")+"-ms")
		parts = append(parts, fmt.Sprintf("%s %.2f ms", k, ms))
	}
	return strings.Join(parts, ", ")
}
