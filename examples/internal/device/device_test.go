package device

import (
	"strings"
	"testing"

	"github.com/stheno-ml/stheno/backend"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		spec    string
		ordinal int
		gpu     bool
	}{{"cpu", 0, false}, {"cuda", 0, true}, {"cuda:0", 0, true}, {"cuda:3", 3, true}} {
		n, gpu, err := Parse(c.spec)
		if err != nil || n != c.ordinal || gpu != c.gpu {
			t.Errorf("Parse(%q) = %d, %v, %v; want %d, %v", c.spec, n, gpu, err, c.ordinal, c.gpu)
		}
	}
	for _, bad := range []string{"", "gpu", "cuda:", "cuda:-1", "cuda:x", "CUDA", "cuda0"} {
		if _, _, err := Parse(bad); err == nil || !strings.Contains(err.Error(), "must be cpu, cuda or cuda:N") {
			t.Errorf("Parse(%q): %v", bad, err)
		}
	}
}

// Without the stheno_cuda tag, asking for a GPU says how to build for one;
// with it and no GPU, it says none was found. Either way no device opens.
func TestOpenWithoutGPU(t *testing.T) {
	if dev, err := Open("cpu", "go run ./examples/x"); dev != nil || err != nil {
		t.Fatalf("Open(cpu) = %v, %v", dev, err)
	}
	dev, err := Open("cuda", "go run ./examples/x")
	if dev != nil {
		dev.Close()
		t.Skip("a GPU is present: the errors of a machine without one do not show")
	}
	want := "no CUDA GPU found"
	if !backend.BuiltWithCUDA() {
		want = "built without GPU support; build it with the stheno_cuda tag (go run -tags stheno_cuda ./examples/x -device cuda"
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Open(cuda) error %v, want one containing %q", err, want)
	}
}
