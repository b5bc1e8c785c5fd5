package data

import (
	"fmt"
	"strings"
)

// EncodeRLE run-length encodes m the way COCO does: pixels in column-major
// order (down the first column, then the next), counts alternating between
// runs of unset and set pixels, starting with unset (so the first count is 0
// when pixel (0, 0) is set). The counts sum to W*H.
func EncodeRLE(m *Mask) []int {
	var counts []int
	cur, run := false, 0
	for x := range m.W {
		for y := range m.H {
			if b := m.Bits[y*m.W+x]; b != cur {
				counts = append(counts, run)
				cur, run = b, 0
			}
			run++
		}
	}
	return append(counts, run)
}

// DecodeRLE turns COCO run-length counts (see EncodeRLE) into a w x h mask.
// The counts must be non-negative and sum to w*h.
func DecodeRLE(counts []int, w, h int) (*Mask, error) {
	if w < 0 || h < 0 {
		return nil, fmt.Errorf("data: RLE: size %dx%d is negative", w, h)
	}
	total := 0
	for i, c := range counts {
		if c < 0 {
			return nil, fmt.Errorf("data: RLE: count %d is negative (%d)", i, c)
		}
		// Saturate, so that absurd counts cannot overflow into a match.
		total = min(total+c, w*h+1)
	}
	if total != w*h {
		if total > w*h {
			return nil, fmt.Errorf("data: RLE: counts sum to more than w*h = %d*%d = %d", w, h, w*h)
		}
		return nil, fmt.Errorf("data: RLE: counts sum to %d, want w*h = %d*%d = %d", total, w, h, w*h)
	}
	m := NewMask(w, h)
	p, set := 0, false
	for _, c := range counts {
		if set {
			for q := p; q < p+c; q++ {
				// q runs down columns: q = x*h + y.
				m.Bits[(q%h)*w+q/h] = true
			}
		}
		p += c
		set = !set
	}
	return m, nil
}

// CompressRLE writes RLE counts as COCO's compressed string (pycocotools'
// rleToString). From the fourth count on, each count is replaced by its
// difference from the count two before it (a run of zeros follows a run of
// zeros, so the difference is small); every number is then written as
// little-endian groups of 5 bits, sign-extended from the top bit of the last
// group, each group a character '0'+g with 0x20 set on all but the last.
func CompressRLE(counts []int) string {
	var b strings.Builder
	for i, c := range counts {
		x := int64(c)
		if i > 2 {
			x -= int64(counts[i-2])
		}
		for more := true; more; {
			g := byte(x & 0x1f)
			x >>= 5 // arithmetic: negative numbers tend to -1
			// Done once the rest is the sign extension of g's top bit.
			if g&0x10 != 0 {
				more = x != -1
			} else {
				more = x != 0
			}
			if more {
				g |= 0x20
			}
			b.WriteByte(g + '0')
		}
	}
	return b.String()
}

// DecompressRLE reads COCO's compressed RLE string (see CompressRLE) back into
// counts.
func DecompressRLE(s string) ([]int, error) {
	var counts []int
	for p := 0; p < len(s); {
		start := p
		var x int64
		for k := 0; ; k++ {
			if p == len(s) {
				return nil, fmt.Errorf("data: RLE string: count %d at byte %d is cut short", len(counts), start)
			}
			if k == 12 { // 60 bits: any more would overflow
				return nil, fmt.Errorf("data: RLE string: count %d at byte %d is too long", len(counts), start)
			}
			c := s[p]
			if c < '0' || c > '0'+63 {
				return nil, fmt.Errorf("data: RLE string: byte %d is %q, outside '0'..'o'", p, c)
			}
			g := int64(c - '0')
			p++
			x |= (g & 0x1f) << (5 * k)
			if g&0x20 == 0 {
				if g&0x10 != 0 {
					x |= -1 << (5 * (k + 1)) // sign-extend
				}
				break
			}
		}
		if i := len(counts); i > 2 {
			x += int64(counts[i-2])
		}
		if x < 0 {
			return nil, fmt.Errorf("data: RLE string: count %d at byte %d is negative (%d)", len(counts), start, x)
		}
		counts = append(counts, int(x))
	}
	return counts, nil
}
