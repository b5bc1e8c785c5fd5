//go:build stheno_cuda

package backend

import (
	"errors"
	"strings"
	"testing"
)

// envWith is the host's library search with CUBLASEnv set to v.
func envWith(v string) libEnv {
	env := hostLibEnv(0)
	env.getenv = func(k string) string {
		if k == CUBLASEnv {
			return v
		}
		return ""
	}
	return env
}

// TestGemmLoaderMissing: STHENO_CUBLAS naming a file that does not exist
// is an error that says so, naming the variable and the loader's reason,
// and nothing else is tried. Needs no GPU.
func TestGemmLoaderMissing(t *testing.T) {
	_, err := loadCUBLAS(envWith("/nonexistent/libcublas.so.99"))
	var le *LoadError
	want := "cannot load cuBLAS from STHENO_CUBLAS=/nonexistent/libcublas.so.99\n\t/nonexistent/libcublas.so.99: cannot open shared object file: No such file or directory"
	if !errors.As(err, &le) || err.Error() != want || len(le.Tried) != 1 {
		t.Fatalf("loading a missing cuBLAS: %v\nwant %s", err, want)
	}
	t.Logf("the error:\n%v", err)
}

// TestGemmLoaderNotCUBLAS: a library that opens but lacks cuBLAS's
// functions is not taken. Needs no GPU.
func TestGemmLoaderNotCUBLAS(t *testing.T) {
	_, err := loadCUBLAS(envWith("libm.so.6"))
	if err == nil || !strings.Contains(err.Error(), "libm.so.6: not a usable cuBLAS: ") ||
		!strings.Contains(err.Error(), "cublasCreate_v2") {
		t.Fatalf("loading libm as cuBLAS: %v", err)
	}
	t.Logf("the error:\n%v", err)
}

// TestGemmLoaderHost loads cuBLAS as Gemm does and says which, skipping
// (visibly) where none is installed. Needs no GPU.
func TestGemmLoaderHost(t *testing.T) {
	api, err := cublas()
	var le *LoadError
	if errors.As(err, &le) {
		t.Skipf("no cuBLAS on this machine:\n%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("driver CUDA version %d; loaded %s; cublasSetWorkspace_v2 %v, cublasGetStatusString %v",
		int(driverCUDAVersion()), api.desc, api.fns.set_workspace != nil, api.fns.status_string != nil)
	// Where the search looked, for the record.
	for _, c := range cublasLib.candidates(hostLibEnv(driverCUDAVersion())) {
		t.Logf("candidate %s (skip: %v)", c.name, c.skip)
	}
}
