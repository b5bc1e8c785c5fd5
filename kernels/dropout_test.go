package kernels

import (
	"math"
	"testing"
)

// The known answers of Philox-4x32-10 published with Random123 (its
// kat_vectors file, also in the paper's distribution): counter, key,
// output.
func TestPhilox4x32KnownAnswers(t *testing.T) {
	for _, c := range []struct {
		ctr  [4]uint32
		key  [2]uint32
		want [4]uint32
	}{
		{[4]uint32{0, 0, 0, 0}, [2]uint32{0, 0}, [4]uint32{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
		{[4]uint32{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, [2]uint32{0xffffffff, 0xffffffff}, [4]uint32{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
		{[4]uint32{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, [2]uint32{0xa4093822, 0x299f31d0}, [4]uint32{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
	} {
		if got := Philox4x32(c.ctr, c.key); got != c.want {
			t.Errorf("Philox4x32(%08x, %08x) = %08x, want %08x", c.ctr, c.key, got, c.want)
		}
	}
}

// Element i of the mask is word i%4 of block i/4 against Keep, and kept
// elements are scaled: checked element by element for a length that is
// not a multiple of four.
func TestDropoutMatchesDefinition(t *testing.T) {
	p := DropoutParams{N: 4099, Seed: 0x0123456789abcdef, Stream: 3, Step: 1<<32 + 7, Keep: DropoutKeep(0.25), Scale: DropoutScale(0.25, 8)}
	x := make([]float64, p.N)
	for i := range x {
		x[i] = float64(i%7) - 3
	}
	y := make([]float64, p.N)
	Dropout(p, x, y)
	for i := range y {
		r := Philox4x32([4]uint32{uint32(i / 4), 3, 7, 1}, [2]uint32{0x89abcdef, 0x01234567})
		want := 0.0
		if uint64(r[i%4]) < p.Keep {
			want = x[i] / 0.75
		}
		if y[i] != want {
			t.Fatalf("y[%d] = %v, want %v", i, y[i], want)
		}
	}
}

// The keep rate over 2^22 elements for several p. The kept count is
// Binomial(n, 1-p), standard deviation sd = sqrt(n p (1-p)) (at most 1024
// here); a bound of 6 sd fails a correct mask with probability 2e-9, and
// it is below 0.15% of n, so a rate off by as little as 0.0015 (a wrong
// threshold, a word used twice, a skipped group) cannot pass. Distinct
// steps and streams must give masks that overlap as independent ones do:
// (1-p)^2 of the elements kept in both, to the same bound.
func TestDropoutKeepRate(t *testing.T) {
	const n = 1 << 22
	ones := make([]float32, n)
	for i := range ones {
		ones[i] = 1
	}
	kept := func(p DropoutParams) []bool {
		y := make([]float32, n)
		Dropout(p, ones, y)
		k := make([]bool, n)
		for i, v := range y {
			k[i] = v != 0
		}
		return k
	}
	for _, drop := range []float64{0.1, 0.5, 0.9} {
		base := DropoutParams{N: n, Seed: 42, Keep: DropoutKeep(drop), Scale: DropoutScale(drop, 4)}
		a := kept(base)
		q := 1 - drop
		sd := math.Sqrt(n * drop * q)
		count := 0
		for _, k := range a {
			if k {
				count++
			}
		}
		if d := float64(count) - n*q; math.Abs(d) > 6*sd {
			t.Errorf("p=%v: %d of %d kept, %.1f sd from %v", drop, count, n, d/sd, n*q)
		}
		for _, other := range []DropoutParams{
			func() DropoutParams { o := base; o.Step = 1; return o }(),
			func() DropoutParams { o := base; o.Stream = 1; return o }(),
			func() DropoutParams { o := base; o.Seed = 43; return o }(),
		} {
			b := kept(other)
			both := 0
			for i := range a {
				if a[i] && b[i] {
					both++
				}
			}
			sd2 := math.Sqrt(n * q * q * (1 - q*q))
			if d := float64(both) - n*q*q; math.Abs(d) > 6*sd2 {
				t.Errorf("p=%v: masks of seed/stream/step %d/%d/%d and %d/%d/%d share %d kept elements, %.1f sd from independent masks' %v",
					drop, base.Seed, base.Stream, base.Step, other.Seed, other.Stream, other.Step, both, d/sd2, n*q*q)
			}
		}
	}
}

// DropoutKeepAll keeps everything and scales by 1: y is x, NaN included;
// a dropped NaN or infinity is NaN (x * 0), a kept one stays.
func TestDropoutSpecialValues(t *testing.T) {
	x := []float64{math.NaN(), math.Inf(1), math.Inf(-1), -2, 0, 5}
	y := make([]float64, len(x))
	Dropout(DropoutParams{N: len(x), Keep: DropoutKeepAll, Scale: 1}, x, y)
	for i := range x {
		if y[i] != x[i] && !(math.IsNaN(x[i]) && math.IsNaN(y[i])) {
			t.Errorf("identity: y[%d] = %v, want %v", i, y[i], x[i])
		}
	}
	big := make([]float64, 64)
	for i := range big {
		big[i] = math.Inf(1)
	}
	y = make([]float64, len(big))
	Dropout(DropoutParams{N: len(big), Seed: 1, Keep: DropoutKeep(0.5), Scale: 2}, big, y)
	nan, inf := 0, 0
	for _, v := range y {
		switch {
		case math.IsNaN(v):
			nan++
		case math.IsInf(v, 1):
			inf++
		default:
			t.Fatalf("dropout of +inf gave %v", v)
		}
	}
	if nan == 0 || inf == 0 {
		t.Errorf("dropout of 64 +inf at p=0.5: %d NaN (dropped), %d +inf (kept): want some of each", nan, inf)
	}
}

// PyTorch's scale: 1/(1-p) in the dtype, both operands rounded to it.
func TestDropoutScaleAndKeep(t *testing.T) {
	if got, want := DropoutScale(0.1, 4), float64(float32(1)/float32(0.9)); got != want {
		t.Errorf("DropoutScale(0.1, float32) = %v, want %v", got, want)
	}
	if got := DropoutScale(0.1, 8); got != 1/0.9 {
		t.Errorf("DropoutScale(0.1, float64) = %v, want %v", got, 1/0.9)
	}
	for _, c := range []struct {
		p    float64
		want uint64
	}{{0, DropoutKeepAll}, {0.5, 1 << 31}, {0.75, 1 << 30}, {1e-12, DropoutKeepAll - 1}, {1 - 1e-12, 0}} {
		if got := DropoutKeep(c.p); got != c.want {
			t.Errorf("DropoutKeep(%v) = %d, want %d", c.p, got, c.want)
		}
	}
}
