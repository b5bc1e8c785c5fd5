package backend

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// TestRuntimeLibSearch checks the order of the names a run-time library
// search tries, the environment override, and the error naming them all.
func TestRuntimeLibSearch(t *testing.T) {
	dirs := []string{"/usr/local/cuda/lib64", "/usr/local/cuda-13.0/lib64"}
	env := func(vars map[string]string, driver int, files ...string) libEnv {
		return libEnv{
			getenv:     func(k string) string { return vars[k] },
			exists:     func(p string) bool { return strings.Contains(strings.Join(files, "\n")+"\n", p+"\n") },
			dirs:       dirs,
			driverCUDA: driver,
		}
	}
	names := func(cs []candidate) []string {
		var out []string
		for _, c := range cs {
			s := c.name
			if c.skip != nil {
				s += " (skipped: " + c.skip.Error() + ")"
			}
			out = append(out, s)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		env  libEnv
		want []string
	}{
		{"loader path only", env(nil, 13000), []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"}},
		{"CUDA 13 off the path", env(nil, 13000, "/usr/local/cuda-13.0/lib64/libcublas.so.13"),
			[]string{"libcublas.so.13", "/usr/local/cuda-13.0/lib64/libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"}},
		{"both dirs", env(nil, 0, "/usr/local/cuda/lib64/libcublas.so.12", "/usr/local/cuda-13.0/lib64/libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so"),
			[]string{"libcublas.so.13", "/usr/local/cuda-13.0/lib64/libcublas.so.13", "libcublas.so.12", "/usr/local/cuda/lib64/libcublas.so.12",
				"libcublas.so.11", "libcublas.so", "/usr/local/cuda/lib64/libcublas.so"}},
		{"driver older than the library", env(nil, 12020, "/usr/local/cuda-13.0/lib64/libcublas.so.13"),
			[]string{"libcublas.so.13 (skipped: the driver supports CUDA 12.2, older than CUDA 13)", "libcublas.so.12", "libcublas.so.11", "libcublas.so"}},
		{"override", env(map[string]string{"STHENO_CUBLAS": "/opt/x/libcublas.so.12"}, 11080), []string{"/opt/x/libcublas.so.12"}},
	} {
		if got := names(cublasLib.candidates(tc.env)); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: candidates %q,\nwant %q", tc.name, got, tc.want)
		}
	}

	// The search stops at the first name that opens.
	var tried []string
	open := func(ok string) func(string) (string, error) {
		return func(name string) (string, error) {
			tried = append(tried, name)
			if name == ok {
				return "handle of " + name, nil
			}
			return "", fmt.Errorf("%s: cannot open shared object file: No such file or directory", name)
		}
	}
	e := env(nil, 13000, "/usr/local/cuda-13.0/lib64/libcublas.so.13")
	h, name, err := openFirst(cublasLib, e, open("/usr/local/cuda-13.0/lib64/libcublas.so.13"))
	if err != nil || name != "/usr/local/cuda-13.0/lib64/libcublas.so.13" || h != "handle of "+name ||
		!reflect.DeepEqual(tried, []string{"libcublas.so.13", name}) {
		t.Errorf("openFirst = %q, %q, %v after trying %q", h, name, err, tried)
	}

	// None opens: the error names each, with its reason, in order.
	e = env(nil, 12020, "/usr/local/cuda/lib64/libcublas.so.12")
	_, _, err = openFirst(cublasLib, e, open(""))
	want := `cannot load cuBLAS; tried, in order:
	libcublas.so.13: skipped: the driver supports CUDA 12.2, older than CUDA 13
	libcublas.so.12: cannot open shared object file: No such file or directory
	/usr/local/cuda/lib64/libcublas.so.12: cannot open shared object file: No such file or directory
	libcublas.so.11: cannot open shared object file: No such file or directory
	libcublas.so: cannot open shared object file: No such file or directory
	(also looked in /usr/local/cuda/lib64, /usr/local/cuda-13.0/lib64 for each name the loader did not find)
set STHENO_CUBLAS to the path or soname of the library to use`
	var le *LoadError
	if !errors.As(err, &le) || err.Error() != want {
		t.Errorf("openFirst with nothing to open:\n%v\nwant\n%s", err, want)
	}

	// An override is tried alone, and the error says where it came from.
	tried = nil
	e = env(map[string]string{"STHENO_CUBLAS": "/nope/libcublas.so"}, 13000, "/usr/local/cuda-13.0/lib64/libcublas.so.13")
	_, _, err = openFirst(cublasLib, e, open(""))
	want = "cannot load cuBLAS from STHENO_CUBLAS=/nope/libcublas.so\n\t/nope/libcublas.so: cannot open shared object file: No such file or directory"
	if err == nil || err.Error() != want || len(tried) != 1 {
		t.Errorf("openFirst with an override that fails: %v after trying %q\nwant %s", err, tried, want)
	}
}

func TestSortCUDADirs(t *testing.T) {
	got := sortCUDADirs([]string{"/usr/local/cuda-11.8/lib64", "/usr/local/cuda-x/lib64", "/usr/local/cuda-12.10/lib64",
		"/usr/local/cuda-13.0/lib64", "/usr/local/cuda-12.2/lib64", "/usr/local/cuda-12/lib64"})
	want := []string{"/usr/local/cuda-13.0/lib64", "/usr/local/cuda-12.10/lib64", "/usr/local/cuda-12.2/lib64",
		"/usr/local/cuda-12/lib64", "/usr/local/cuda-11.8/lib64", "/usr/local/cuda-x/lib64"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sortCUDADirs = %q,\nwant %q", got, want)
	}
	for name, want := range map[string]int{"libcublas.so.13": 13, "/a/b/libcublas.so.12.3.1": 12, "libcublas.so": -1, "libnccl.so.2": 2} {
		got, ok := sonameMajor(name)
		if !ok {
			got = -1
		}
		if got != want {
			t.Errorf("sonameMajor(%q) = %d, want %d", name, got, want)
		}
	}
}
