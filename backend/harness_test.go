package backend

import (
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"gorgonia.org/tensor"
)

// deviceKind is one way to get a Device in tests. Every test that takes a
// Device runs once per kind, as subtest impl=<name>: the fake driver
// always, a real GPU in the stheno_cuda build (cuda_test.go).
type deviceKind struct {
	name string
	open func(tb testing.TB) *Device
	// isolate runs tests that wreck the context (a kernel fault is sticky
	// for the whole CUDA context) in a child process.
	isolate bool
	// bench marks the kinds whose timings mean something.
	bench bool
}

var deviceKinds = []deviceKind{{name: "fake", open: openFake}}

func forEachDevice(t *testing.T, f func(t *testing.T, d *Device)) {
	t.Helper()
	for _, k := range deviceKinds {
		t.Run("impl="+k.name, func(t *testing.T) { f(t, k.open(t)) })
	}
}

// childEnv marks a test binary started by inChild.
const childEnv = "STHENO_BACKEND_TEST_CHILD"

// inChild runs the current (sub)test in a child process when kind asks for
// isolation, and reports whether the caller is the one that must run the
// test body (the child, or this process when no isolation is needed).
func inChild(t *testing.T, kind deviceKind) bool {
	t.Helper()
	if !kind.isolate || os.Getenv(childEnv) == "1" {
		return true
	}
	parts := strings.Split(t.Name(), "/")
	for i, p := range parts {
		parts[i] = "^" + regexp.QuoteMeta(p) + "$"
	}
	cmd := exec.Command(os.Args[0], "-test.run="+strings.Join(parts, "/"), "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	t.Logf("child process:\n%s", out)
	if err != nil {
		t.Fatalf("child process failed: %v", err)
	}
	switch {
	case strings.Contains(string(out), "--- SKIP: "+t.Name()+" "):
		t.Skip("skipped in the child process")
	case !strings.Contains(string(out), "--- PASS: "+t.Name()+" "):
		t.Fatalf("child process did not pass a test named %s", t.Name())
	}
	return false
}

// hostTensor returns a host tensor of dtype dt and shape with values that
// differ per element and per seed.
func hostTensor(dt tensor.Dtype, shape []int, seed int) *tensor.Dense {
	t := tensor.New(tensor.Of(dt), tensor.WithShape(shape...))
	if len(t.Raw) == 0 {
		return t // Data panics on an empty tensor
	}
	v := reflect.ValueOf(t.Data())
	if v.Kind() != reflect.Slice { // a scalar
		s := reflect.New(dt.Type).Elem()
		setValue(s, 0, seed)
		return tensor.New(tensor.FromScalar(s.Interface()))
	}
	for i := range v.Len() {
		setValue(v.Index(i), i, seed)
	}
	return t
}

func setValue(v reflect.Value, i, seed int) {
	switch v.Kind() {
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(i%1000)*0.5 - 3 + float64(seed))
	case reflect.Bool:
		v.SetBool((i+seed)%3 == 0)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64((i+seed)%100 - 50))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64((i + seed) % 200))
	}
}

func toDevice(tb testing.TB, d *Device, h *tensor.Dense) *tensor.Dense {
	tb.Helper()
	x, err := d.ToDevice(h)
	if err != nil {
		tb.Fatalf("ToDevice(%v %v): %v", h.Dtype(), h.Shape(), err)
	}
	return x
}

func toHost(tb testing.TB, d *Device, x *tensor.Dense) *tensor.Dense {
	tb.Helper()
	h, err := d.ToHost(x)
	if err != nil {
		tb.Fatalf("ToHost(%v %v): %v", x.Dtype(), x.Shape(), err)
	}
	return h
}

// sameValues reports how got differs from want (dtype, shape, values), or "".
func sameValues(got, want *tensor.Dense) string {
	if got.Dtype() != want.Dtype() || !got.Shape().Eq(want.Shape()) {
		return fmt.Sprintf("got %v %v, want %v %v", got.Dtype(), got.Shape(), want.Dtype(), want.Shape())
	}
	if len(got.Raw) == 0 && len(want.Raw) == 0 {
		return "" // Data panics on an empty tensor
	}
	if !reflect.DeepEqual(got.Data(), want.Data()) {
		return fmt.Sprintf("got %v, want %v", got.Data(), want.Data())
	}
	return ""
}

// floats returns a host tensor's values as float64s.
func floats(t *tensor.Dense) []float64 {
	v := reflect.ValueOf(HostData(t))
	if v.Kind() != reflect.Slice {
		return []float64{v.Convert(reflect.TypeOf(0.0)).Float()}
	}
	out := make([]float64, v.Len())
	for i := range out {
		out[i] = v.Index(i).Convert(reflect.TypeOf(0.0)).Float()
	}
	return out
}
