package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestGeneratedUpToDate fails when kernels/cuda/kernels_gen.go or
// kernels/params_gen.cuh is not what the kernels' declarations give now.
func TestGeneratedUpToDate(t *testing.T) {
	goSrc, cuh, err := generate("../..", "kernels")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		want []byte
	}{{"../kernels_gen.go", goSrc}, {"../../" + headerName, cuh}} {
		have, err := os.ReadFile(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if d := firstDiff(have, c.want); d != "" {
			t.Errorf("%s is stale (run make kernels-go): %s", filepath.Clean(filepath.Join("kernels/cuda/gen", c.path)), d)
		}
	}
}
