package trainstep

import "testing"

// On the host a step has no scope: end only resets the machine.
func TestBeginHost(t *testing.T) {
	resets := 0
	end, err := Begin(nil, func() { resets++ })
	if err != nil || resets != 0 {
		t.Fatalf("Begin: %v, %d resets", err, resets)
	}
	if err := end(); err != nil || resets != 1 {
		t.Errorf("end: %v, %d resets, want 1", err, resets)
	}
}
