package posembed_test

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/examples/detr/posembed"
)

// refCase is one case of testdata/posembed.json (gen_posembed.py).
type refCase struct {
	Name        string
	N, H, W     int
	Feats       int
	Temperature float64
	Scale       float64
	ZeroConfig  bool `json:"zero_config"`
	Mask        []bool
	Pos         []float64
}

// onPaddedLine reports, for each element of the [n, 2*feats, h, w]
// embedding of mask, whether it encodes a coordinate along a column (y
// channels) or row (x channels) that holds no valid pixel: the elements
// whose argument is about -3.1e6 (see the package documentation).
func onPaddedLine(mask []bool, n, h, w, feats int) []bool {
	out := make([]bool, n*2*feats*h*w)
	for b := range n {
		m := mask[b*h*w : (b+1)*h*w]
		for i := range h {
			for j := range w {
				colPadded, rowPadded := true, true
				for r := range h {
					colPadded = colPadded && m[r*w+j]
				}
				for c := range w {
					rowPadded = rowPadded && m[i*w+c]
				}
				for c := range feats {
					out[((b*2*feats+c)*h+i)*w+j] = colPadded
					out[((b*2*feats+feats+c)*h+i)*w+j] = rowPadded
				}
			}
		}
	}
	return out
}

// TestSineReference compares Sine with PyTorch's float64 values of the
// reference formula. float32 results are compared everywhere with
// TolForward32. float64 results are compared with TolForward64 except on
// all-padded rows and columns, whose arguments of about 3e6 make the
// reference itself uncertain by ~1e-9 (PyTorch's pow and Go's differ in
// the last bit of the wavelengths); there they are checked to round to
// the float32 results, which the reference bounds.
func TestSineReference(t *testing.T) {
	data, err := os.ReadFile("testdata/posembed.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref struct{ Cases []refCase }
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	if len(ref.Cases) == 0 {
		t.Fatal("no cases in testdata/posembed.json")
	}
	onLine, offLine := 0, 0
	for _, c := range ref.Cases {
		cfg := posembed.Config{Feats: c.Feats, Temperature: c.Temperature, Scale: c.Scale}
		if c.ZeroConfig {
			if c.Feats != posembed.DefaultFeats || c.Temperature != posembed.DefaultTemperature || c.Scale != posembed.DefaultScale {
				t.Fatalf("%s: the reference's config (%d, %v, %v) is not the defaults", c.Name, c.Feats, c.Temperature, c.Scale)
			}
			cfg = posembed.Config{}
		}
		got64, err := posembed.Sine[float64](c.Mask, c.N, c.H, c.W, cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		got32, err := posembed.Sine[float32](c.Mask, c.N, c.H, c.W, cfg)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		if len(got64) != len(c.Pos) || len(got32) != len(c.Pos) {
			t.Fatalf("%s: got %d and %d elements, want %d", c.Name, len(got64), len(got32), len(c.Pos))
		}

		wide := make([]float64, len(got32))
		for k, v := range got32 {
			wide[k] = float64(v)
		}
		if err := autograd.TolForward32.Compare(wide, c.Pos); err != nil {
			t.Errorf("%s, float32: %v", c.Name, err)
		}

		padded := onPaddedLine(c.Mask, c.N, c.H, c.W, c.Feats)
		var got, want []float64
		for k, p := range padded {
			if p {
				onLine++
				if float32(got64[k]) != got32[k] {
					t.Errorf("%s: element %d on a padded line: float64 %v rounds to %v, the float32 result is %v",
						c.Name, k, got64[k], float32(got64[k]), got32[k])
				}
				continue
			}
			offLine++
			got, want = append(got, got64[k]), append(want, c.Pos[k])
		}
		if err := autograd.TolForward64.Compare(got, want); err != nil {
			t.Errorf("%s, float64 off the padded lines: %v", c.Name, err)
		}
	}
	if onLine == 0 || offLine == 0 {
		t.Fatalf("%d elements on padded lines and %d off them: the cases must have both", onLine, offLine)
	}
}

// TestSineLayout writes out the embedding of a 1 x 2 image with F = 2 by
// hand: channel 0 sin and 1 cos of the row's coordinate, 2 and 3 of the
// column's, each coordinate (count - 0.5) / (last + 1e-6) * 2π.
func TestSineLayout(t *testing.T) {
	got, err := posembed.Sine[float64]([]bool{false, false}, 1, 1, 2, posembed.Config{Feats: 2})
	if err != nil {
		t.Fatal(err)
	}
	y := 0.5 / (1 + 1e-6) * 2 * math.Pi
	x0, x1 := 0.5/(2+1e-6)*2*math.Pi, 1.5/(2+1e-6)*2*math.Pi
	want := []float64{
		math.Sin(y), math.Sin(y),
		math.Cos(y), math.Cos(y),
		math.Sin(x0), math.Sin(x1),
		math.Cos(x0), math.Cos(x1),
	}
	if err := autograd.TolForward64.Compare(got, want); err != nil {
		t.Fatal(err)
	}
}

func TestSineTensor(t *testing.T) {
	mask, err := posembed.PaddingMask(3, 4, [][2]int{{3, 4}, {2, 3}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := posembed.Config{Feats: 6}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		d, err := posembed.SineTensor(dt, mask, 2, 3, 4, cfg)
		if err != nil {
			t.Fatalf("%v: %v", dt, err)
		}
		if d.Dtype() != dt || !slices.Equal([]int(d.Shape()), []int{2, 12, 3, 4}) {
			t.Fatalf("%v: got a %v tensor of shape %v, want %v of [2 12 3 4]", dt, d.Dtype(), d.Shape(), dt)
		}
		var same bool
		switch dt {
		case tensor.Float32:
			want, _ := posembed.Sine[float32](mask, 2, 3, 4, cfg)
			same = slices.Equal(d.Data().([]float32), want)
		case tensor.Float64:
			want, _ := posembed.Sine[float64](mask, 2, 3, 4, cfg)
			same = slices.Equal(d.Data().([]float64), want)
		}
		if !same {
			t.Fatalf("%v: the tensor's data differs from Sine's", dt)
		}
	}
	d, err := posembed.SineTensor(tensor.Float32, mask, 2, 3, 4, posembed.Config{})
	if err != nil || !slices.Equal([]int(d.Shape()), []int{2, 256, 3, 4}) {
		t.Fatalf("default config: got %v, %v, want shape [2 256 3 4]", d, err)
	}
	if _, err := posembed.SineTensor(tensor.Int, mask, 2, 3, 4, cfg); err == nil ||
		err.Error() != "posembed: dtype must be float32 or float64, got int" {
		t.Fatalf("int dtype: got %v", err)
	}
}

func TestSineErrors(t *testing.T) {
	ok := make([]bool, 2*3*4)
	cases := []struct {
		name    string
		mask    []bool
		n, h, w int
		cfg     posembed.Config
		want    string
	}{
		{"short mask", ok[:23], 2, 3, 4, posembed.Config{}, "mask has 23 elements, want n*h*w = 2*3*4 = 24"},
		{"long mask", append(slices.Clone(ok), false), 2, 3, 4, posembed.Config{}, "mask has 25 elements, want n*h*w = 2*3*4 = 24"},
		{"zero n", nil, 0, 3, 4, posembed.Config{}, "sizes must be positive, got n 0, h 3, w 4"},
		{"negative h", ok, 2, -3, 4, posembed.Config{}, "sizes must be positive, got n 2, h -3, w 4"},
		{"zero w", ok, 2, 3, 0, posembed.Config{}, "sizes must be positive, got n 2, h 3, w 0"},
		{"size overflow", nil, math.MaxInt / 2, 3, 4, posembed.Config{}, "more elements than an int counts"},
		{"odd Feats", ok, 2, 3, 4, posembed.Config{Feats: 5}, "Feats must be even and positive (channels pair up as sin and cos), got 5"},
		{"negative Feats", ok, 2, 3, 4, posembed.Config{Feats: -2}, "Feats must be even and positive (channels pair up as sin and cos), got -2"},
		{"negative Temperature", ok, 2, 3, 4, posembed.Config{Temperature: -1}, "Temperature must be finite and positive, got -1"},
		{"NaN Temperature", ok, 2, 3, 4, posembed.Config{Temperature: math.NaN()}, "Temperature must be finite and positive, got NaN"},
		{"infinite Temperature", ok, 2, 3, 4, posembed.Config{Temperature: math.Inf(1)}, "Temperature must be finite and positive, got +Inf"},
		{"NaN Scale", ok, 2, 3, 4, posembed.Config{Scale: math.NaN()}, "Scale must be finite, got NaN"},
		{"infinite Scale", ok, 2, 3, 4, posembed.Config{Scale: math.Inf(-1)}, "Scale must be finite, got -Inf"},
	}
	for _, c := range cases {
		got, err := posembed.Sine[float32](c.mask, c.n, c.h, c.w, c.cfg)
		if err == nil || !strings.HasPrefix(err.Error(), "posembed: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want one starting with \"posembed: \" and containing %q", c.name, err, c.want)
		}
		if got != nil {
			t.Errorf("%s: got a result with the error", c.name)
		}
		if _, err := posembed.SineTensor(tensor.Float64, c.mask, c.n, c.h, c.w, c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: SineTensor: got error %v, want one containing %q", c.name, err, c.want)
		}
	}
}

func TestPaddingMask(t *testing.T) {
	got, err := posembed.PaddingMask(2, 3, [][2]int{{2, 3}, {1, 2}, {2, 1}})
	if err != nil {
		t.Fatal(err)
	}
	const F, T = false, true
	want := []bool{
		F, F, F,
		F, F, F,

		F, F, T,
		T, T, T,

		F, T, T,
		F, T, T,
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}

	errs := []struct {
		name  string
		h, w  int
		sizes [][2]int
		want  string
	}{
		{"zero h", 0, 3, [][2]int{{1, 1}}, "canvas sizes must be positive, got h 0, w 3"},
		{"negative w", 2, -1, [][2]int{{1, 1}}, "canvas sizes must be positive, got h 2, w -1"},
		{"no images", 2, 3, nil, "no image sizes"},
		{"too tall", 2, 3, [][2]int{{2, 3}, {3, 3}}, "image 1 is 3 x 3, want 1..2 x 1..3 (the canvas)"},
		{"too wide", 2, 3, [][2]int{{2, 4}}, "image 0 is 2 x 4, want 1..2 x 1..3 (the canvas)"},
		{"empty image", 2, 3, [][2]int{{0, 3}}, "image 0 is 0 x 3, want 1..2 x 1..3 (the canvas)"},
	}
	for _, c := range errs {
		got, err := posembed.PaddingMask(c.h, c.w, c.sizes)
		if err == nil || err.Error() != "posembed: "+c.want {
			t.Errorf("%s: got error %v, want %q", c.name, err, "posembed: "+c.want)
		}
		if got != nil {
			t.Errorf("%s: got a mask with the error", c.name)
		}
	}
}

// BenchmarkSine times the embedding of Deformable-DETR's finest level (a
// batch of 2 images of 800 x 1333 at stride 8) in float32.
func BenchmarkSine(b *testing.B) {
	const n, h, w = 2, 100, 167
	mask, err := posembed.PaddingMask(h, w, [][2]int{{100, 167}, {75, 120}})
	if err != nil {
		b.Fatal(err)
	}
	b.Run(fmt.Sprintf("n=%d/h=%d/w=%d/feats=128", n, h, w), func(b *testing.B) {
		for b.Loop() {
			if _, err := posembed.Sine[float32](mask, n, h, w, posembed.Config{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
