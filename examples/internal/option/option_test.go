package option

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
)

func TestChecks(t *testing.T) {
	var c Checks
	if err := c.Err(); err != nil {
		t.Fatalf("no checks: %v", err)
	}
	c.Check(true, "lr", 0.1, "must be a number in (0, 1]")
	c.Check(false, "lr", -1, "must be a number in (0, 1]")
	c.Check(false, "batch", 1, "must be in [2, %d]", 1024)
	err := c.Err()
	if want := "-lr -1: must be a number in (0, 1]\n-batch 1: must be in [2, 1024]"; err == nil || err.Error() != want {
		t.Fatalf("Err() = %v, want %q", err, want)
	}
	var e *Error
	if !errors.As(err, &e) || e.Option != "lr" {
		t.Errorf("errors.As(%v) gives %+v, want the -lr *Error first", err, e)
	}
}

func TestFinite(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		want bool
	}{{0, true}, {-1e300, true}, {math.NaN(), false}, {math.Inf(1), false}, {math.Inf(-1), false}} {
		if got := Finite(tc.v); got != tc.want {
			t.Errorf("Finite(%v) = %t, want %t", tc.v, got, tc.want)
		}
	}
}

func TestIncreasingFractions(t *testing.T) {
	for _, tc := range []struct {
		s    []float64
		want bool
	}{
		{nil, true},
		{[]float64{0.75, 0.9}, true},
		{[]float64{0.9, 0.5}, false},
		{[]float64{0.5, 0.5}, false},
		{[]float64{0, 0.5}, false},
		{[]float64{0.5, 1}, false},
		{[]float64{math.NaN()}, false},
		{[]float64{0.5, math.NaN()}, false},
	} {
		if got := IncreasingFractions(tc.s); got != tc.want {
			t.Errorf("IncreasingFractions(%v) = %t, want %t", tc.s, got, tc.want)
		}
	}
}

func TestFormatList(t *testing.T) {
	for _, tc := range []struct {
		s    []float64
		want string
	}{{nil, ""}, {[]float64{0.75, 0.9}, "0.75,0.9"}, {[]float64{1e-5, math.NaN()}, "1e-05,NaN"}} {
		if got := FormatList(tc.s); got != tc.want {
			t.Errorf("FormatList(%v) = %q, want %q", tc.s, got, tc.want)
		}
	}
}

func TestAbsPath(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := AbsPath("x.json"), filepath.Join(wd, "x.json"); got != want {
		t.Errorf("AbsPath(x.json) = %q, want %q", got, want)
	}
	if got := AbsPath("/a/b"); got != "/a/b" {
		t.Errorf("AbsPath(/a/b) = %q", got)
	}
}

func TestChanges(t *testing.T) {
	var c Changes
	c.Compare("lr", 0.5, 0.001)
	c.Compare("batch", 4, 4)
	c.Compare("steps", FormatList([]float64{0.5}), FormatList([]float64{0.75, 0.9}))
	want := Changes{"-lr: the checkpoint's is 0.001, given 0.5", "-steps: the checkpoint's is 0.75,0.9, given 0.5"}
	if len(c) != len(want) || c[0] != want[0] || c[1] != want[1] {
		t.Errorf("Changes = %q, want %q", c, want)
	}
}
