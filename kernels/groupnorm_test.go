package kernels_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/kernels"
)

// The geometry depends on the shape and the dtype alone: tiles of 4096
// elements a plane, 16-byte units when the plane is whole chunks.
func TestNewGroupNormParams(t *testing.T) {
	for _, c := range []struct {
		n, c, groups, hw, size int
		vec, tiles             int
	}{
		{2, 256, 32, 200 * 200, 4, 4, 10}, // Mask R-CNN's FPN level 2
		{2, 256, 32, 25 * 25, 4, 1, 1},    // odd planes: single elements
		{2, 256, 32, 25 * 25, 8, 1, 1},
		{2, 512, 32, 64 * 64, 4, 4, 1},
		{2, 512, 32, 64 * 64, 8, 2, 1},
		{3, 6, 3, 4097, 4, 1, 2},
		{3, 6, 3, 4098, 8, 2, 2},
		{7, 5, 1, 1, 4, 1, 1},
	} {
		want := kernels.GroupNormParams{N: c.n, C: c.c, Groups: c.groups, HW: c.hw, Eps: 1e-5, Vec: c.vec, Tiles: c.tiles}
		if got := kernels.NewGroupNormParams(c.n, c.c, c.groups, c.hw, c.size, 1e-5); got != want {
			t.Errorf("NewGroupNormParams(%d, %d, %d, %d, %d bytes) = %+v, want %+v", c.n, c.c, c.groups, c.hw, c.size, got, want)
		}
	}
}

// refGroupNorm is the definition of kernels.GroupNormParams and of its
// gradients, in float64: per row, the mean corrected by the mean of the
// deviations from it (a long row far from zero is otherwise off by more
// than TolForward64), the variance from the deviations.
func refGroupNorm(n, c, groups, hw int, eps float64, x, gamma, beta, dy []float64) (y, dx, dgamma, dbeta []float64) {
	y, dx = make([]float64, len(x)), make([]float64, len(x))
	dgamma, dbeta = make([]float64, c), make([]float64, c)
	cpg := c / groups
	l := cpg * hw
	for row := range n * groups {
		xr, dyr := x[row*l:(row+1)*l], dy[row*l:(row+1)*l]
		var mean, fix, v float64
		for _, e := range xr {
			mean += e
		}
		mean /= float64(l)
		for _, e := range xr {
			fix += e - mean
		}
		mean += fix / float64(l)
		for _, e := range xr {
			v += (e - mean) * (e - mean)
		}
		rstd := 1 / math.Sqrt(v/float64(l)+eps)
		var a, b float64
		xh, g := make([]float64, l), make([]float64, l)
		for j, e := range xr {
			ch := (row*cpg + j/hw) % c
			xh[j] = (e - mean) * rstd
			g[j] = dyr[j]
			gm, bt := 1.0, 0.0
			if gamma != nil {
				gm = gamma[ch]
				g[j] *= gm
			}
			if beta != nil {
				bt = beta[ch]
			}
			y[row*l+j] = xh[j]*gm + bt
			a += g[j]
			b += g[j] * xh[j]
			dgamma[ch] += dyr[j] * xh[j]
			dbeta[ch] += dyr[j]
		}
		for j := range xr {
			dx[row*l+j] = rstd * (g[j] - a/float64(l) - xh[j]*(b/float64(l)))
		}
	}
	return y, dx, dgamma, dbeta
}

func gnTo64[T kernels.Float](v []T) []float64 {
	if v == nil {
		return nil
	}
	out := make([]float64, len(v))
	for i, e := range v {
		out[i] = float64(e)
	}
	return out
}

// gnInputs draws x (rows of different means, far from zero against their
// spread in float64), dy, gamma and beta.
func gnInputs[T kernels.Float](rng *rand.Rand, n, c, groups, hw int) (x, dy, gamma, beta []T) {
	x, dy, gamma, beta = make([]T, n*c*hw), make([]T, n*c*hw), make([]T, c), make([]T, c)
	far := 2.0
	if _, ok := any(T(0)).(float64); ok {
		far = 1e3
	}
	l := c / groups * hw
	for r := range n * groups {
		off, scale := far*(2*rng.Float64()-1), 0.5+0.5*rng.Float64()
		for j := range l {
			x[r*l+j] = T(off + scale*(2*rng.Float64()-1))
		}
	}
	for i := range dy {
		dy[i] = T(2*rng.Float64() - 1)
	}
	for j := range c {
		gamma[j], beta[j] = T(0.5+rng.Float64()), T(2*rng.Float64()-1)
	}
	return x, dy, gamma, beta
}

type gnOutputs[T kernels.Float] struct{ y, dx, dgamma, dbeta []T }

// gnRun runs the forward and the backward twins; gamma and beta may be nil.
func gnRun[T kernels.Float](p kernels.GroupNormParams, x, dy, gamma, beta []T) gnOutputs[T] {
	o := gnOutputs[T]{y: make([]T, len(x)), dx: make([]T, len(x))}
	kernels.GroupNormForward(p, x, gamma, beta, o.y)
	sums := make([]T, p.SumsLen())
	kernels.GroupNormBackwardSums(p, x, gamma, dy, sums)
	kernels.GroupNormBackwardDX(p, x, gamma, dy, sums, o.dx)
	if gamma != nil {
		o.dgamma = make([]T, p.C)
	}
	if beta != nil {
		o.dbeta = make([]T, p.C)
	}
	kernels.GroupNormBackwardParams(p, sums, o.dgamma, o.dbeta)
	return o
}

func TestGroupNormTwinsMatchDefinition(t *testing.T) {
	shapes := [][4]int{{2, 6, 3, 5}, {2, 4, 2, 12}, {1, 4, 4, 1}, {3, 8, 1, 6}, {1, 70, 2, 2}, {2, 2, 1, 4100}, {1, 3, 3, 4097}, {2, 64, 32, 7 * 7}}
	for _, s := range shapes {
		t.Run(fmt.Sprintf("float32/%v", s), func(t *testing.T) { testGroupNormTwin[float32](t, s) })
		t.Run(fmt.Sprintf("float64/%v", s), func(t *testing.T) { testGroupNormTwin[float64](t, s) })
	}
}

func testGroupNormTwin[T kernels.Float](t *testing.T, s [4]int) {
	n, c, groups, hw := s[0], s[1], s[2], s[3]
	rng := rand.New(rand.NewPCG(uint64(c), uint64(hw)))
	size, tol := 4, autograd.TolForward32
	if _, ok := any(T(0)).(float64); ok {
		size, tol = 8, autograd.TolForward64
	}
	const eps = 1e-5
	x, dy, gamma, beta := gnInputs[T](rng, n, c, groups, hw)
	p := kernels.NewGroupNormParams(n, c, groups, hw, size, eps)
	for _, affine := range []struct{ gamma, beta bool }{{true, true}, {false, false}, {true, false}, {false, true}} {
		var g, b []T
		if affine.gamma {
			g = gamma
		}
		if affine.beta {
			b = beta
		}
		wy, wdx, wdg, wdb := refGroupNorm(n, c, groups, hw, eps, gnTo64(x), gnTo64(g), gnTo64(b), gnTo64(dy))
		o := gnRun(p, x, dy, g, b)
		check := func(what string, got []T, want []float64) {
			if err := tol.Compare(gnTo64(got), want); err != nil {
				t.Errorf("gamma=%t beta=%t: %s: %v", affine.gamma, affine.beta, what, err)
			}
		}
		check("y", o.y, wy)
		check("dx", o.dx, wdx)
		if affine.gamma {
			check("dgamma", o.dgamma, wdg)
		}
		if affine.beta {
			check("dbeta", o.dbeta, wdb)
		}
	}
}

// The twins' goroutines split the work, never a sum: the bits do not depend
// on how many there are.
func TestGroupNormIndependentOfWorkers(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	x, dy, gamma, beta := gnInputs[float32](rng, 2, 16, 4, 4100)
	p := kernels.NewGroupNormParams(2, 16, 4, 4100, 4, 1e-5)
	prev := runtime.GOMAXPROCS(1)
	one := gnRun(p, x, dy, gamma, beta)
	runtime.GOMAXPROCS(max(prev, 4))
	many := gnRun(p, x, dy, gamma, beta)
	runtime.GOMAXPROCS(prev)
	for _, c := range []struct {
		what string
		a, b []float32
	}{{"y", one.y, many.y}, {"dx", one.dx, many.dx}, {"dgamma", one.dgamma, many.dgamma}, {"dbeta", one.dbeta, many.dbeta}} {
		if !slices.EqualFunc(c.a, c.b, func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
			t.Errorf("%s differs between 1 and %d workers", c.what, max(prev, 4))
		}
	}
}

// A group of one element: its deviation is 0 exactly, so y is beta and dx
// is 0, exactly, in float32 too (the backward's sums carry float64's
// precision: rounded to float32, mean(g) would leave dx at rstd*ulp(g),
// with rstd = 1/sqrt(eps)).
func TestGroupNormOneElementGroups(t *testing.T) {
	x := []float32{3, -1, 0.25, 7}
	dy := []float32{0.3, -0.7, 1.1, 0.1}
	gamma := []float32{1.5, 0.3, -2, 1}
	beta := []float32{0.5, -0.25, 2, 0}
	p := kernels.NewGroupNormParams(1, 4, 4, 1, 4, 1e-5)
	o := gnRun(p, x, dy, gamma, beta)
	if !slices.Equal(o.y, beta) {
		t.Errorf("y = %v, want beta %v", o.y, beta)
	}
	if !slices.Equal(o.dx, []float32{0, 0, 0, 0}) {
		t.Errorf("dx = %v, want 0", o.dx)
	}
	if !slices.Equal(o.dgamma, []float32{0, 0, 0, 0}) || !slices.Equal(o.dbeta, dy) {
		t.Errorf("dgamma, dbeta = %v, %v, want 0 and dy %v", o.dgamma, o.dbeta, dy)
	}
}

// A NaN makes its row NaN (and dgamma of the row's channels), and leaves
// every other row's bits as they are.
func TestGroupNormNaNRow(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const n, c, groups, hw = 2, 6, 3, 8
	x, dy, gamma, beta := gnInputs[float64](rng, n, c, groups, hw)
	p := kernels.NewGroupNormParams(n, c, groups, hw, 8, 1e-5)
	clean := gnRun(p, x, dy, gamma, beta)
	l := c / groups * hw
	bad := slices.Clone(x)
	bad[4*l+3] = math.NaN() // row 4: sample 1, group 1: channels 2 and 3
	o := gnRun(p, bad, dy, gamma, beta)
	for i := range x {
		if row := i / l; row == 4 {
			if !math.IsNaN(o.y[i]) || !math.IsNaN(o.dx[i]) {
				t.Errorf("element %d of the NaN row: y %v, dx %v, want NaN", i, o.y[i], o.dx[i])
			}
		} else if o.y[i] != clean.y[i] || o.dx[i] != clean.dx[i] {
			t.Errorf("element %d of row %d: y %v, dx %v, want %v, %v", i, row, o.y[i], o.dx[i], clean.y[i], clean.dx[i])
		}
	}
	for ch := range c {
		if nan := ch == 2 || ch == 3; math.IsNaN(o.dgamma[ch]) != nan {
			t.Errorf("dgamma[%d] = %v, want NaN %t", ch, o.dgamma[ch], nan)
		}
		if o.dbeta[ch] != clean.dbeta[ch] {
			t.Errorf("dbeta[%d] = %v, want %v", ch, o.dbeta[ch], clean.dbeta[ch])
		}
	}
}
