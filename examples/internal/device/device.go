// Package device opens the GPU an example's -device flag names, checking
// before any work that the program can run there: built with the
// stheno_cuda tag, a GPU of that number, and cuBLAS loadable. The errors
// say what is missing and how to get it.
package device

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/stheno-ml/stheno/backend"
)

// Usage describes the flag's values, for the flag's help.
const Usage = "where to run: cpu, cuda (the first GPU) or cuda:N (GPU N); a GPU needs a build with -tags stheno_cuda"

// Parse reads a -device value: "cpu" gives gpu false, "cuda" ordinal 0,
// "cuda:N" ordinal N.
func Parse(spec string) (ordinal int, gpu bool, err error) {
	switch {
	case spec == "cpu":
		return 0, false, nil
	case spec == "cuda":
		return 0, true, nil
	case strings.HasPrefix(spec, "cuda:"):
		n, err := strconv.Atoi(strings.TrimPrefix(spec, "cuda:"))
		if err == nil && n >= 0 {
			return n, true, nil
		}
	}
	return 0, false, fmt.Errorf("-device %q: must be cpu, cuda or cuda:N with N a GPU number (0 is the first)", spec)
}

// Open opens the device spec names (nil for "cpu"). command is how the
// program is run (go run ./examples/maskrcnn), for the error of a build
// without GPU support. The caller closes the device.
func Open(spec, command string) (*backend.Device, error) {
	ordinal, gpu, err := Parse(spec)
	if err != nil || !gpu {
		return nil, err
	}
	if !backend.BuiltWithCUDA() {
		run := strings.Replace(command, "go run ", "go run -tags stheno_cuda ", 1)
		return nil, fmt.Errorf("-device %s: this program was built without GPU support; build it with the stheno_cuda tag (%s -device %s; README, \"GPU build\")", spec, run, spec)
	}
	dev, err := backend.Open(ordinal)
	if err != nil {
		if errors.Is(err, backend.ErrNoDevice) {
			if n, cerr := backend.DeviceCount(); cerr == nil && n > 0 {
				return nil, fmt.Errorf("-device %s: no GPU %d: the driver reports %d GPU(s), numbered from 0", spec, ordinal, n)
			}
			return nil, fmt.Errorf("-device %s: no CUDA GPU found: %v (a GPU needs NVIDIA's driver, libcuda.so.1)", spec, err)
		}
		return nil, fmt.Errorf("-device %s: %w", spec, err)
	}
	if _, err := dev.BLASLibrary(); err != nil {
		dev.Close()
		return nil, fmt.Errorf("-device %s: cuBLAS, which the matrix products need, cannot be loaded: %v; install CUDA's libcublas (libcublas.so.13, .12 or .11) or name one with STHENO_CUBLAS=/path/to/libcublas.so.N", spec, err)
	}
	return dev, nil
}
