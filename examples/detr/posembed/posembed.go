package posembed

import (
	"fmt"
	"math"

	"gorgonia.org/tensor"
)

// Config holds the embedding's hyperparameters; a zero field takes its
// default, Deformable-DETR's.
type Config struct {
	// Feats is the number of channels per axis (the reference's
	// num_pos_feats), even: the output has 2*Feats channels. 0 means 128.
	Feats int
	// Temperature is the base of the channels' wavelengths, finite and
	// positive. 0 means 10000.
	Temperature float64
	// Scale is the range of the normalised coordinates: a valid pixel's
	// lies strictly between 0 and Scale. Finite; 0 means 2π.
	Scale float64
}

// The defaults of Config's zero fields.
const (
	DefaultFeats       = 128
	DefaultTemperature = 10000
	DefaultScale       = 2 * math.Pi
)

// withDefaults returns c with its zero fields set to their defaults, or an
// error naming the first field out of range.
func (c Config) withDefaults() (Config, error) {
	if c.Feats == 0 {
		c.Feats = DefaultFeats
	}
	if c.Temperature == 0 {
		c.Temperature = DefaultTemperature
	}
	if c.Scale == 0 {
		c.Scale = DefaultScale
	}
	switch {
	case c.Feats < 0 || c.Feats%2 != 0:
		return c, fmt.Errorf("posembed: Feats must be even and positive (channels pair up as sin and cos), got %d", c.Feats)
	case !(c.Temperature > 0 && c.Temperature <= math.MaxFloat64):
		return c, fmt.Errorf("posembed: Temperature must be finite and positive, got %v", c.Temperature)
	case math.IsNaN(c.Scale) || math.IsInf(c.Scale, 0):
		return c, fmt.Errorf("posembed: Scale must be finite, got %v", c.Scale)
	}
	return c, nil
}

// checkSizes refuses sizes that are not positive or whose products
// overflow an int, and a mask of the wrong length.
func checkSizes(mask []bool, n, h, w, feats int) error {
	if n <= 0 || h <= 0 || w <= 0 {
		return fmt.Errorf("posembed: sizes must be positive, got n %d, h %d, w %d", n, h, w)
	}
	if h > math.MaxInt/w || n > math.MaxInt/(h*w) || feats > math.MaxInt/2 || n*h*w > math.MaxInt/(2*feats) {
		return fmt.Errorf("posembed: an embedding of [%d %d %d %d] has more elements than an int counts", n, 2*feats, h, w)
	}
	if len(mask) != n*h*w {
		return fmt.Errorf("posembed: mask has %d elements, want n*h*w = %d*%d*%d = %d", len(mask), n, h, w, n*h*w)
	}
	return nil
}

// Sine returns the sine position embedding of the padding mask, row-major
// [n, 2*F, h, w] with F = cfg.Feats (128 when 0): the first F channels
// encode the row (y), the others the column (x); the package documentation
// gives the formula. mask is [n, h, w], row-major, true where a pixel is
// padding.
//
// It refuses sizes that are not positive, a mask whose length is not
// n*h*w, and a Config out of range, with an error and no result.
func Sine[T float32 | float64](mask []bool, n, h, w int, cfg Config) ([]T, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := checkSizes(mask, n, h, w, cfg.Feats); err != nil {
		return nil, err
	}
	feats, hw := cfg.Feats, h*w

	// The wavelengths, one for each pair of channels.
	dim := make([]float64, feats)
	for c := range dim {
		dim[c] = math.Pow(cfg.Temperature, float64(2*(c/2))/float64(feats))
	}

	out := make([]T, n*2*feats*hw)
	count := make([]int, hw)
	yIdx, xIdx := make([]int, hw), make([]int, hw)
	seen := make(map[[2]int]int)
	var yVals, xVals, wave []float64
	for b := range n {
		m := mask[b*hw : (b+1)*hw]
		yVals = coords(m, h, w, true, cfg.Scale, count, yIdx, seen, yVals[:0])
		xVals = coords(m, h, w, false, cfg.Scale, count, xIdx, seen, xVals[:0])
		for c := range feats {
			f := math.Sin
			if c%2 == 1 {
				f = math.Cos
			}
			// Each distinct coordinate once, then the pixels look theirs up.
			for axis, vals := range [][]float64{yVals, xVals} {
				wave = wave[:0]
				for _, v := range vals {
					wave = append(wave, f(v/dim[c]))
				}
				idx, plane := yIdx, out[(b*2*feats+c)*hw:][:hw]
				if axis == 1 {
					idx, plane = xIdx, out[(b*2*feats+feats+c)*hw:][:hw]
				}
				for k, u := range idx {
					plane[k] = T(wave[u])
				}
			}
		}
	}
	return out, nil
}

// coords computes the normalised coordinate of every pixel of the h x w
// mask m along the columns (down) or the rows, as an index into the
// distinct values, which it appends to vals. A coordinate depends only on
// the pixel's count of valid pixels and its line's last count, so an image
// padded the way DETR pads has at most h+1 (or w+1) distinct ones, and
// their sines and cosines are computed once each instead of once a pixel.
// count is scratch of h*w; seen is emptied and reused.
func coords(m []bool, h, w int, down bool, scale float64, count []int, idx []int, seen map[[2]int]int, vals []float64) []float64 {
	// Counts of valid pixels so far, down each column or along each row.
	step := 1
	if down {
		step = w
	}
	for i := range h {
		for j := range w {
			k := i*w + j
			count[k] = 0
			if down && i > 0 || !down && j > 0 {
				count[k] = count[k-step]
			}
			if !m[k] {
				count[k]++
			}
		}
	}
	clear(seen)
	for k := range h * w {
		last := count[k-k%w+w-1] // the row's last count
		if down {
			last = count[(h-1)*w+k%w] // the column's
		}
		key := [2]int{count[k], last}
		u, ok := seen[key]
		if !ok {
			u = len(vals)
			seen[key] = u
			// The reference's eps keeps an all-padded line finite.
			vals = append(vals, (float64(count[k])-0.5)/(float64(last)+1e-6)*scale)
		}
		idx[k] = u
	}
	return vals
}

// SineTensor is Sine as a *tensor.Dense of shape [n, 2*F, h, w] and dtype
// dt (tensor.Float32 or tensor.Float64), ready for gorgonia.Let.
func SineTensor(dt tensor.Dtype, mask []bool, n, h, w int, cfg Config) (*tensor.Dense, error) {
	var (
		data any
		err  error
	)
	switch dt {
	case tensor.Float32:
		data, err = Sine[float32](mask, n, h, w, cfg)
	case tensor.Float64:
		data, err = Sine[float64](mask, n, h, w, cfg)
	default:
		return nil, fmt.Errorf("posembed: dtype must be float32 or float64, got %v", dt)
	}
	if err != nil {
		return nil, err
	}
	feats := cfg.Feats
	if feats == 0 {
		feats = DefaultFeats
	}
	return tensor.New(tensor.WithShape(n, 2*feats, h, w), tensor.WithBacking(data)), nil
}

// PaddingMask returns the padding mask [len(sizes), h, w] of a batch padded
// the way DETR pads it: image k, of sizes[k] = {height, width} pixels, sits
// at the top left of an h x w canvas, and the rest of the canvas (on the
// right and at the bottom) is padding (true). Every size must fit the
// canvas and be at least one pixel.
func PaddingMask(h, w int, sizes [][2]int) ([]bool, error) {
	if h <= 0 || w <= 0 {
		return nil, fmt.Errorf("posembed: canvas sizes must be positive, got h %d, w %d", h, w)
	}
	if len(sizes) == 0 {
		return nil, fmt.Errorf("posembed: no image sizes")
	}
	if h > math.MaxInt/w || len(sizes) > math.MaxInt/(h*w) {
		return nil, fmt.Errorf("posembed: a mask of [%d %d %d] has more elements than an int counts", len(sizes), h, w)
	}
	mask := make([]bool, len(sizes)*h*w)
	for k, s := range sizes {
		if s[0] < 1 || s[0] > h || s[1] < 1 || s[1] > w {
			return nil, fmt.Errorf("posembed: image %d is %d x %d, want 1..%d x 1..%d (the canvas)", k, s[0], s[1], h, w)
		}
		m := mask[k*h*w : (k+1)*h*w]
		for i := range h {
			for j := range w {
				m[i*w+j] = i >= s[0] || j >= s[1]
			}
		}
	}
	return mask, nil
}
