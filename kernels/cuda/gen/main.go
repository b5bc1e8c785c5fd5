// Command gen writes package kernels/cuda and kernels/params_gen.cuh from
// the kernels' own declarations in kernels/*.cu and kernels/*.cuh, in the
// manner of mumax3's cuda2go: the Go side of every kernel's params struct,
// the kernel's name, and a launch bound to its params type, with each
// struct's layout asserted on both sides.
//
// What it reads:
//
//   - Every extern "C" __global__ function of a .cu file (one module: one
//     fatbin, or PTX for the _sm90a files), written directly or through a
//     function-like macro of that file. A kernel takes one params struct by
//     value; a __global__ function anywhere else is an error, so no entry
//     point goes unseen. Kernels named after one template instantiated for
//     float32 and float64 (names differing in an f32 / f64 word) also get a
//     function that picks one by dtype.
//   - The params structs the kernels take, and the structs they hold:
//     plain structs of fixed-size numbers (int32_t, int, uint32_t, int64_t,
//     float, double, bool...), pointers and uint64_t (device addresses,
//     backend.DevicePtr in Go), arrays of these, and nested plain structs.
//     A uint64_t that is a number, not an address, says so with
//     stheno:uint64 in its comment. Each needs STHENO_PARAMS(S); right
//     after it, which expands to static_asserts of the layout the Go struct
//     has (params_gen.cuh), so nvcc and the emulator's g++ check the C++
//     side and the Go compiler the Go side.
//   - Constants the Go side needs, marked by a comment line
//     `stheno:const GoName` right above a namespace-scope constexpr, or
//     above static_assert(X == N, "...") for a value only the compiler can
//     work out (a template's shared-memory size): N is exported, and the
//     compiler checks it.
//
// Preprocessor conditionals are not evaluated: every branch is read.
//
// Run it with `make kernels-go` (or go generate ./kernels/cuda) after
// changing a kernel's declaration; the package's tests fail while its
// output is stale.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
)

// generate returns the Go package file and the C++ header for the kernels
// in dir.
func generate(dir, display string) (goSrc, cuh []byte, err error) {
	m, err := load(os.DirFS(dir), ".", display, headerName)
	if err != nil {
		return nil, nil, err
	}
	goSrc, err = m.goSource()
	if err != nil {
		return nil, nil, err
	}
	return goSrc, m.cxxHeader(), nil
}

// moduleRoot returns the directory of go.mod at or above the working
// directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod at or above the working directory")
		}
		dir = parent
	}
}

// Paths relative to the module root.
const (
	kernelsDir = "kernels"
	goOut      = "kernels/cuda/kernels_gen.go"
	cuhOut     = "kernels/" + headerName
)

func main() {
	check := flag.Bool("check", false, "report whether the generated files are up to date instead of writing them")
	flag.Parse()
	if err := run(*check); err != nil {
		fmt.Fprintln(os.Stderr, "kernels/cuda/gen:", err)
		os.Exit(1)
	}
}

func run(check bool) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	goSrc, cuh, err := generate(filepath.Join(root, kernelsDir), kernelsDir)
	if err != nil {
		return err
	}
	for _, out := range []struct {
		path string
		src  []byte
	}{{goOut, goSrc}, {cuhOut, cuh}} {
		p := filepath.Join(root, out.path)
		old, err := os.ReadFile(p)
		if err == nil && bytes.Equal(old, out.src) {
			continue // unchanged: keep its time, or make rebuilds every fatbin
		}
		if check {
			return fmt.Errorf("%s is not up to date: run make kernels-go", out.path)
		}
		if err := os.WriteFile(p, out.src, 0o644); err != nil {
			return err
		}
	}
	return nil
}
