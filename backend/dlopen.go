package backend

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The GPU build links libcuda alone: its soname (libcuda.so.1) is the same
// for every driver. The CUDA libraries (cuBLAS now, NCCL later) change
// soname with every major version (libcublas.so.11 in the toolkit this
// repository builds with, libcublas.so.13 on a machine with CUDA 13 only),
// so a binary linked against one would not start where only another is
// installed. They are opened at run time instead, with dlopen, by the first
// call that needs them: this file decides which names to try, in which
// order, and what to say when none opens; dlopen_cuda.go opens them.

// runtimeLib describes a library opened at run time.
type runtimeLib struct {
	name string // for messages: "cuBLAS"
	// env names the environment variable that chooses the library: a path
	// or a soname, tried alone instead of the search below.
	env string
	// sonames are tried in order through the dynamic loader's own search
	// (LD_LIBRARY_PATH, the ld.so cache, the default directories).
	sonames []string
	// cudaMajor: a soname's version is the CUDA major version it belongs
	// to, and a library of a newer CUDA than the driver supports cannot
	// work (CUDA's minor-version compatibility holds within a major only),
	// so such sonames are skipped.
	cudaMajor bool
}

// cublasLib is how the backend finds cuBLAS.
var cublasLib = runtimeLib{
	name:      "cuBLAS",
	env:       CUBLASEnv,
	sonames:   []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"},
	cudaMajor: true,
}

// CUBLASEnv names the environment variable that chooses the cuBLAS
// library: STHENO_CUBLAS=/usr/local/cuda-13.0/lib64/libcublas.so.13, or a
// soname for the dynamic loader to find (libcublas.so.12). When it is set
// nothing else is tried.
const CUBLASEnv = "STHENO_CUBLAS"

// cudaLibDirs returns the library directories of the CUDA toolkits
// installed under /usr/local: /usr/local/cuda/lib64 first (the toolkit the
// machine's administrator chose), then /usr/local/cuda-<version>/lib64,
// newest version first. A toolkit's installer does not put them on the
// loader's path.
func cudaLibDirs() []string {
	dirs := []string{"/usr/local/cuda/lib64"}
	versioned, _ := filepath.Glob("/usr/local/cuda-*/lib64")
	return append(dirs, sortCUDADirs(versioned)...)
}

// sortCUDADirs orders /usr/local/cuda-<major>.<minor>/lib64 directories by
// version, newest first; others go last, in name order.
func sortCUDADirs(dirs []string) []string {
	version := func(dir string) (major, minor int, ok bool) {
		v, found := strings.CutPrefix(filepath.Base(filepath.Dir(dir)), "cuda-")
		if !found {
			return 0, 0, false
		}
		ma, mi, _ := strings.Cut(v, ".")
		major, err1 := strconv.Atoi(ma)
		minor, err2 := strconv.Atoi(mi)
		return major, minor, err1 == nil && (mi == "" || err2 == nil)
	}
	out := slices.Clone(dirs)
	slices.SortStableFunc(out, func(a, b string) int {
		ma, na, oka := version(a)
		mb, nb, okb := version(b)
		switch {
		case oka != okb:
			if oka {
				return -1
			}
			return 1
		case !oka:
			return strings.Compare(a, b)
		case ma != mb:
			return mb - ma
		}
		return nb - na
	})
	return out
}

// libEnv is what the search looks at on the host; tests pass their own.
type libEnv struct {
	getenv func(string) string
	exists func(path string) bool
	// dirs are where toolkits install themselves off the loader's path;
	// after the loader has failed for a soname, each dir that holds a file
	// of that name is tried.
	dirs []string
	// driverCUDA is the newest CUDA version the driver supports, as
	// cuDriverGetVersion gives it (13000 for 13.0); 0 when unknown, and
	// then no soname is skipped.
	driverCUDA int
}

func hostLibEnv(driverCUDA int) libEnv {
	return libEnv{
		getenv: os.Getenv,
		dirs:   cudaLibDirs(),
		exists: func(path string) bool {
			st, err := os.Stat(path)
			return err == nil && !st.IsDir()
		},
		driverCUDA: driverCUDA,
	}
}

// LoadAttempt is one name a library search tried, and why it did not open
// (the dynamic loader's message), or why it was not tried.
type LoadAttempt struct {
	Name    string
	Err     error
	Skipped bool // not tried: Err says why
}

// LoadError says that a library opened at run time could not be opened: it
// lists every name tried, in order, with the loader's reason for each.
type LoadError struct {
	Library string        // "cuBLAS"
	Env     string        // the variable that chooses the library
	Value   string        // its value, if it was set
	Tried   []LoadAttempt // in order
	// Searched are the directories the search also looked in, for names
	// the loader did not find on its path; those without a file of the
	// name tried do not appear in Tried.
	Searched []string
}

func (e *LoadError) Error() string {
	var s strings.Builder
	if e.Value != "" {
		fmt.Fprintf(&s, "cannot load %s from %s=%s", e.Library, e.Env, e.Value)
	} else {
		fmt.Fprintf(&s, "cannot load %s; tried, in order:", e.Library)
	}
	for _, a := range e.Tried {
		msg := a.Err.Error()
		if a.Skipped {
			msg = a.Name + ": skipped: " + msg
		} else if !strings.HasPrefix(msg, a.Name) {
			// dlerror's messages start with the name; others get it.
			msg = a.Name + ": " + msg
		}
		s.WriteString("\n\t" + msg)
	}
	if e.Value != "" {
		return s.String()
	}
	if len(e.Searched) > 0 {
		fmt.Fprintf(&s, "\n\t(also looked in %s for each name the loader did not find)", strings.Join(e.Searched, ", "))
	}
	fmt.Fprintf(&s, "\nset %s to the path or soname of the library to use", e.Env)
	return s.String()
}

// sonameMajor returns the version at the end of a soname (13 for
// libcublas.so.13), or false for a bare name.
func sonameMajor(name string) (int, bool) {
	_, v, ok := strings.Cut(filepath.Base(name), ".so.")
	if !ok {
		return 0, false
	}
	v, _, _ = strings.Cut(v, ".")
	n, err := strconv.Atoi(v)
	return n, err == nil
}

// candidate is a name to hand to dlopen, or one skipped and why.
type candidate struct {
	name string
	skip error
}

// candidates returns the names to try, in order: the environment
// variable's value alone when set; else each soname through the loader's
// search and then in each directory holding a file of that name, newest
// soname first, skipping sonames of a CUDA newer than the driver's.
func (l runtimeLib) candidates(env libEnv) []candidate {
	if v := env.getenv(l.env); v != "" {
		return []candidate{{name: v}}
	}
	var out []candidate
	for _, so := range l.sonames {
		if major, ok := sonameMajor(so); ok && l.cudaMajor && env.driverCUDA > 0 && major > env.driverCUDA/1000 {
			out = append(out, candidate{name: so, skip: fmt.Errorf("the driver supports CUDA %d.%d, older than CUDA %d",
				env.driverCUDA/1000, env.driverCUDA%1000/10, major)})
			continue
		}
		out = append(out, candidate{name: so})
		for _, dir := range env.dirs {
			if p := filepath.Join(dir, so); env.exists(p) {
				out = append(out, candidate{name: p})
			}
		}
	}
	return out
}

// openFirst opens the first candidate of l that open accepts, returning
// it and its name, or a *LoadError naming every candidate and the reason
// each failed.
func openFirst[H any](l runtimeLib, env libEnv, open func(name string) (H, error)) (H, string, error) {
	e := &LoadError{Library: l.name, Env: l.env, Value: env.getenv(l.env)}
	if e.Value == "" {
		e.Searched = env.dirs
	}
	for _, c := range l.candidates(env) {
		if c.skip != nil {
			e.Tried = append(e.Tried, LoadAttempt{Name: c.name, Err: c.skip, Skipped: true})
			continue
		}
		h, err := open(c.name)
		if err == nil {
			return h, c.name, nil
		}
		e.Tried = append(e.Tried, LoadAttempt{Name: c.name, Err: err})
	}
	var zero H
	return zero, "", e
}
