//go:build !stheno_cuda

package backend

import "fmt"

const builtWithCUDA = false

// Built without the stheno_cuda tag, the package has no driver: Open
// returns an error wrapping ErrNoDevice, and no device value can exist.

func openDriver(ordinal int) (driver, func(string) ([]byte, error), error) {
	return nil, nil, fmt.Errorf("backend: GPU %d: built without the stheno_cuda tag: %w", ordinal, ErrNoDevice)
}

func deviceCount() (int, error) {
	return 0, fmt.Errorf("backend: built without the stheno_cuda tag: %w", ErrNoDevice)
}
