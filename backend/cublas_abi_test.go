package backend

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
)

// TestCUBLASABI compares the cuBLAS values this package declares (blas.go)
// with the headers of the CUDA toolkit installed here, if any: the
// package's C code declares cuBLAS's functions itself and passes these
// numbers, so a wrong one would be a wrong call, not a compile error.
func TestCUBLASABI(t *testing.T) {
	var dir string
	for _, d := range []string{"/usr/include", "/usr/local/cuda/include", "/usr/lib/cuda/include"} {
		if _, err := os.Stat(filepath.Join(d, "cublas_api.h")); err == nil {
			dir = d
			break
		}
	}
	if dir == "" {
		t.Skip("no cublas_api.h in /usr/include, /usr/local/cuda/include or /usr/lib/cuda/include")
	}
	var text string
	for _, h := range []string{"cublas_api.h", "library_types.h"} {
		b, err := os.ReadFile(filepath.Join(dir, h))
		if err != nil {
			t.Fatal(err)
		}
		text += string(b)
	}
	value := func(name string) (int, bool) {
		m := regexp.MustCompile(`\b` + name + `\s*=\s*(-?\d+)`).FindStringSubmatch(text)
		if m == nil {
			return 0, false
		}
		v, err := strconv.Atoi(m[1])
		return v, err == nil
	}
	want := map[string]int{
		"CUBLAS_OP_N": cublasOpN, "CUBLAS_OP_T": cublasOpT,
		"CUDA_R_32F": cudaR32F, "CUDA_R_64F": cudaR64F,
		"CUBLAS_COMPUTE_32F": cublasCompute32F, "CUBLAS_COMPUTE_32F_FAST_TF32": cublasCompute32FFastTF32,
		"CUBLAS_COMPUTE_64F":  cublasCompute64F,
		"CUBLAS_DEFAULT_MATH": cublasDefaultMath, "CUBLAS_GEMM_DEFAULT": cublasGemmDefault,
	}
	for code, name := range cublasStatusNames {
		want[name] = code
	}
	for name, v := range want {
		got, ok := value(name)
		if !ok {
			t.Errorf("%s not found in %s's headers", name, dir)
		} else if got != v {
			t.Errorf("%s is %d in %s's headers; the package passes %d", name, got, dir, v)
		}
	}
	// libraryPropertyType has no explicit values: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL.
	if !regexp.MustCompile(`MAJOR_VERSION,\s*MINOR_VERSION,\s*PATCH_LEVEL`).MatchString(text) ||
		libMajorVersion != 0 || libMinorVersion != 1 || libPatchLevel != 2 {
		t.Errorf("libraryPropertyType is not MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL from 0 in %s's headers", dir)
	}
	t.Logf("checked %d values against %s", len(want)+3, dir)
}
