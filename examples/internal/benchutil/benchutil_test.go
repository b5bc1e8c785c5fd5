package benchutil

import (
	"testing"
	"time"
)

func TestHostTimes(t *testing.T) {
	var got string
	res := testing.Benchmark(func(b *testing.B) {
		got = HostTimes(b, map[string]time.Duration{"b step": 2 * time.Millisecond, "a": time.Millisecond}, 2)
	})
	if want := "a 0.50 ms, b step 1.00 ms"; got != want {
		t.Errorf("HostTimes: %q, want %q", got, want)
	}
	if res.Extra["b-step-ms"] != 1 || res.Extra["a-ms"] != 0.5 {
		t.Errorf("metrics %v, want a-ms 0.5 and b-step-ms 1", res.Extra)
	}
}
