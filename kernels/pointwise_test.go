package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// The broadcasts of detector shapes collapse to the few dims the bcast
// kernels walk: a bias over tokens is [rows, 256] with the bias's stride 0
// across rows; ones on either side stay apart; dims of one go.
func TestNewBroadcastParams(t *testing.T) {
	for _, c := range []struct {
		out, a, b []int
		want      string
		vec4      bool
	}{
		{[]int{2, 20000, 256}, []int{2, 20000, 256}, []int{256}, "rank=2 shape=[40000 256] a=[256 1] b=[0 1]", true},
		{[]int{2, 8, 300, 300}, []int{2, 8, 300, 300}, []int{2, 1, 300, 300}, "rank=3 shape=[2 8 90000] a=[720000 90000 1] b=[90000 0 1]", true},
		{[]int{2, 64, 10, 12}, []int{2, 64, 10, 12}, []int{1, 64, 1, 1}, "rank=3 shape=[2 64 120] a=[7680 120 1] b=[0 1 0]", true},
		{[]int{4, 5, 8}, []int{4, 1, 8}, []int{5, 1}, "rank=3 shape=[4 5 8] a=[8 0 1] b=[0 1 0]", true},
		{[]int{33, 17}, []int{33, 1}, []int{1, 17}, "rank=2 shape=[33 17] a=[1 0] b=[0 1]", false},
		{[]int{3, 1, 5}, []int{3, 1, 5}, []int{1}, "rank=1 shape=[15] a=[1] b=[0]", false},
		{[]int{1, 1}, []int{1, 1}, []int{1}, "rank=1 shape=[1] a=[1] b=[1]", false},
		{[]int{6, 7}, []int{6, 1}, nil, "rank=2 shape=[6 7] a=[1 0] b=[0 0]", false},
	} {
		p, err := NewBroadcastParams(c.out, c.a, c.b)
		if err != nil {
			t.Fatal(err)
		}
		got := fmt.Sprintf("rank=%d shape=%v a=%v b=%v", p.Rank, p.Shape[:p.Rank], p.StrideA[:p.Rank], p.StrideB[:p.Rank])
		if got != c.want {
			t.Errorf("%v from %v, %v: %s, want %s", c.out, c.a, c.b, got, c.want)
		}
		if ok := p.VectorOK(4, true, c.b != nil); ok != c.vec4 {
			t.Errorf("%v from %v, %v: VectorOK(4) = %t, want %t", c.out, c.a, c.b, ok, c.vec4)
		}
	}
	if _, err := NewBroadcastParams([]int{2, 2, 2, 2, 2, 2, 2}, []int{2, 1, 2, 1, 2, 1, 2}, []int{1, 2, 1, 2, 1, 2, 1}); err == nil {
		t.Error("7 alternating broadcast dims: no error")
	}
}

// PointwiseBroadcast against the definition, index by index, on a
// broadcast of every kind at once.
func TestPointwiseBroadcastMatchesDefinition(t *testing.T) {
	out, as, bs := []int{2, 3, 4, 5}, []int{2, 1, 4, 5}, []int{3, 1, 1}
	a, b := make([]float64, 40), make([]float64, 3)
	for i := range a {
		a[i] = float64(i)
	}
	for i := range b {
		b[i] = float64(100 * (i + 1))
	}
	p, err := NewBroadcastParams(out, as, bs)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]float64, 120)
	PointwiseBroadcast(PointwiseSub, 0, p, a, b, got)
	for n := range 2 {
		for c := range 3 {
			for h := range 4 {
				for w := range 5 {
					want := a[(n*4+h)*5+w] - b[c]
					if g := got[((n*3+c)*4+h)*5+w]; g != want {
						t.Fatalf("[%d %d %d %d] = %v, want %v", n, c, h, w, g, want)
					}
				}
			}
		}
	}
}

// Sums of integers are exact in float64 whatever the order: the plans'
// passes (rows warp and block with parts, cols with parts) give the exact
// sums, and the same bits with one worker as with many.
func TestReduceSumExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(26, 1))
	for _, c := range []struct {
		shape  []int
		summed []bool
	}{
		{[]int{3, 5000}, []bool{false, true}},
		{[]int{2, 3000, 40}, []bool{true, true, false}},
		{[]int{4, 7, 300, 5}, []bool{true, false, true, true}},
		{[]int{1, 20000}, []bool{true, true}},
	} {
		n, outN := 1, 1
		for i, d := range c.shape {
			n *= d
			if !c.summed[i] {
				outN *= d
			}
		}
		x := make([]float64, n)
		x32 := make([]float32, n)
		for i := range x {
			x[i] = float64(rng.IntN(201) - 100)
			x32[i] = float32(x[i]) / 64
		}
		plan := NewReducePlan(c.shape, c.summed, 8, 1)
		got := make([]float64, outN)
		ReduceSum(plan, x, got)
		want := naiveSums(x, c.shape, c.summed, outN)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%v summed %v: sum %d = %v, want %v", c.shape, c.summed, i, got[i], want[i])
			}
		}
		plan32 := NewReducePlan(c.shape, c.summed, 4, 1)
		many := make([]float32, outN)
		ReduceSum(plan32, x32, many)
		prev := runtime.GOMAXPROCS(1)
		one := make([]float32, outN)
		ReduceSum(plan32, x32, one)
		runtime.GOMAXPROCS(prev)
		for i := range one {
			if math.Float32bits(one[i]) != math.Float32bits(many[i]) {
				t.Fatalf("%v summed %v: sum %d is %v with one worker, %v with %d", c.shape, c.summed, i, one[i], many[i], prev)
			}
		}
	}
}

// naiveSums sums x of shape over the summed dims, in index order, into
// outN sums.
func naiveSums(x []float64, shape []int, summed []bool, outN int) []float64 {
	out := make([]float64, outN)
	idx := make([]int, len(shape))
	for _, v := range x {
		o := 0
		for i, d := range shape {
			if !summed[i] {
				o = o*d + idx[i]
			}
		}
		out[o] += v
		for i := len(shape) - 1; i >= 0; i-- {
			if idx[i]++; idx[i] < shape[i] {
				break
			}
			idx[i] = 0
		}
	}
	return out
}
