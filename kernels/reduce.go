package kernels

// Sums along axes, in the order of pointwise.cu's reduce kernels: the CPU
// twin adds what the GPU adds, in the same order, so the two agree bit for
// bit (multiplications by alpha aside, no operation is fused).

// ReduceThreads and ReduceWarpRow are pointwise.cu's kReduceThreads (the
// threads of a sum kernel's block) and kReduceWarpRow (the longest row the
// rows warp kernel takes).
const (
	ReduceThreads = 256
	ReduceWarpRow = 1024
)

// reduceTargetBlocks is the number of blocks a pass aims for: when the
// outputs are fewer, each sum is split into parts, summed again by a
// second pass. A constant, not the device's SM count, so that a shape sums
// in the same order on every GPU.
const reduceTargetBlocks = 1024

// reduceMinChunk is the fewest elements of a row a rows block part takes,
// and reduceMinColRows the fewest rows per thread of a cols part.
const (
	reduceMinChunk   = 4096
	reduceMinColRows = 16
)

// ReducePass is one pass of a sum: rows ([Outer, R] -> [Outer], R
// innermost) or cols ([Outer, R, Inner] -> [Outer, Inner]). With Parts >
// 1 each sum is split into Parts parts of Chunk elements, written as
// [Outer, Parts(, Inner)] for the next pass to sum; otherwise the sums are
// written multiplied by Alpha.
type ReducePass struct {
	Cols            bool
	Warp            bool // rows: a group of Lanes lanes per row, else a block per (row, part)
	Outer, R, Inner int
	Chunk, Parts    int
	Lanes           int     // rows warp: lanes per row
	BX              int     // cols: threads across columns (ReduceThreads/BX down the rows)
	Alpha           float64 // 1 but on the last pass
}

// ReducePlan is a sum over some axes of a tensor as a sequence of passes,
// each one's output the next one's input. With no passes (every summed
// axis of length one) the sum is a copy times Alpha.
type ReducePlan struct {
	In, Out int // elements
	Passes  []ReducePass
	Alpha   float64
}

// NewReducePlan plans the sum of a tensor of the given shape over the dims
// where summed is true, multiplied by alpha (1 for a sum, 1/count for a
// mean), for elements of elem bytes. Dims of one are dropped and
// neighbours alike merged into groups, kept and summed by turns; each pass
// sums the innermost summed group away: a rows pass when it is innermost,
// a cols pass otherwise. The plan depends on the shape alone.
func NewReducePlan(shape []int, summed []bool, elem int, alpha float64) ReducePlan {
	type group struct {
		n      int
		summed bool
	}
	var groups []group
	in, out := 1, 1
	for i, d := range shape {
		in *= d
		if !summed[i] {
			out *= d
		}
		if d == 1 {
			continue
		}
		if k := len(groups) - 1; k >= 0 && groups[k].summed == summed[i] {
			groups[k].n *= d
			continue
		}
		groups = append(groups, group{d, summed[i]})
	}
	plan := ReducePlan{In: in, Out: out, Alpha: alpha}
	prod := func(gs []group) int {
		p := 1
		for _, g := range gs {
			p *= g.n
		}
		return p
	}
	for {
		j := -1
		for i, g := range groups {
			if g.summed {
				j = i
			}
		}
		if j < 0 {
			break
		}
		outer, r, inner := prod(groups[:j]), groups[j].n, prod(groups[j+1:])
		if inner == 1 {
			plan.Passes = append(plan.Passes, rowsPasses(outer, r, elem)...)
		} else {
			plan.Passes = append(plan.Passes, colsPasses(outer, r, inner)...)
		}
		groups = append(groups[:j], groups[j+1:]...)
	}
	for i := range plan.Passes {
		plan.Passes[i].Alpha = 1
	}
	if n := len(plan.Passes); n > 0 {
		plan.Passes[n-1].Alpha = alpha
	}
	return plan
}

// rowsPasses sums [outer, r] rows: the warp design for rows up to
// ReduceWarpRow, else a block per (row, part) with parts enough for
// reduceTargetBlocks blocks (each of reduceMinChunk elements or more, a
// whole number of 16-byte vectors), and then a warp pass over the parts.
func rowsPasses(outer, r, elem int) []ReducePass {
	if r <= ReduceWarpRow {
		return []ReducePass{{Warp: true, Outer: outer, R: r, Inner: 1, Chunk: r, Parts: 1, Lanes: min(32, nextPow2(r))}}
	}
	v := 16 / elem
	parts := 1
	if outer < reduceTargetBlocks {
		parts = max(1, min(ceilDiv(reduceTargetBlocks, outer), ceilDiv(r, reduceMinChunk)))
	}
	chunk := ceilDiv(ceilDiv(r, parts), v) * v
	parts = ceilDiv(r, chunk)
	p := []ReducePass{{Outer: outer, R: r, Inner: 1, Chunk: chunk, Parts: parts}}
	if parts > 1 {
		p = append(p, rowsPasses(outer, parts, elem)...)
	}
	return p
}

// colsPasses sums the middle dim of [outer, r, inner]: BX threads across
// columns (a power of two up to 32), ReduceThreads/BX down the rows, with
// parts enough for reduceTargetBlocks blocks (each thread adding
// reduceMinColRows rows or more), and then a cols pass over the parts.
func colsPasses(outer, r, inner int) []ReducePass {
	bx := min(32, nextPow2(inner))
	by := ReduceThreads / bx
	base := outer * ceilDiv(inner, bx)
	parts := 1
	if base < reduceTargetBlocks {
		parts = max(1, min(ceilDiv(reduceTargetBlocks, base), ceilDiv(r, by*reduceMinColRows)))
	}
	chunk := ceilDiv(r, parts)
	parts = ceilDiv(r, chunk)
	p := []ReducePass{{Cols: true, Outer: outer, R: r, Inner: inner, Chunk: chunk, Parts: parts, BX: bx}}
	if parts > 1 {
		p = append(p, ReducePass{Cols: true, Outer: outer, R: parts, Inner: inner, Chunk: parts, Parts: 1, BX: bx})
	}
	return p
}

// Outputs is the number of elements the pass writes.
func (p ReducePass) Outputs() int { return p.Outer * p.Parts * p.Inner }

// ReduceSum runs plan on in, writing out: every pass in the kernels'
// order, the intermediate results in scratch slices of their own.
func ReduceSum[T Float](plan ReducePlan, in, out []T) {
	if len(plan.Passes) == 0 {
		PointwiseMap(PointwiseScale, plan.Alpha, in, nil, out)
		return
	}
	src := in
	for i, p := range plan.Passes {
		dst := out
		if i < len(plan.Passes)-1 {
			dst = make([]T, p.Outputs())
		}
		ReducePassRun(p, src, dst)
		src = dst
	}
}

// ReducePassRun runs one pass: pointwise.cu's reduce_rows_warp,
// reduce_rows_block or reduce_cols, add for add.
func ReducePassRun[T Float](p ReducePass, in, out []T) {
	switch {
	case p.Cols:
		reduceCols(p, in, out)
	case p.Warp:
		reduceRowsWarp(p, in, out)
	default:
		reduceRowsBlock(p, in, out)
	}
}

// reduceRowsWarp: lane l of a row's Lanes adds elements l, l + Lanes, ...;
// then the butterfly's halving tree over the lanes.
func reduceRowsWarp[T Float](p ReducePass, in, out []T) {
	alpha := T(p.Alpha)
	parallelFor(p.Outer, max(1, pointwiseGrain/p.R), func(lo, hi int) {
		var lanes [32]T
		for row := lo; row < hi; row++ {
			x := in[row*p.R : (row+1)*p.R]
			clear(lanes[:])
			for k, v := range x {
				lanes[k%p.Lanes] += v
			}
			out[row] = halvingSum(lanes[:p.Lanes]) * alpha
		}
	})
}

// reduceRowsBlock: thread t of a (row, part)'s block adds elements t*V + e
// (e < V) of each stretch of ReduceThreads*V, V = 16 bytes of T; then each
// warp's tree, and a tree over the warps' sums padded with zeros to 32.
func reduceRowsBlock[T Float](p ReducePass, in, out []T) {
	v := 16 / int(sizeOf[T]())
	alpha := T(p.Alpha)
	parallelFor(p.Outer*p.Parts, max(1, pointwiseGrain/p.Chunk), func(lo, hi int) {
		var threads [ReduceThreads]T
		var warps [32]T
		for b := lo; b < hi; b++ {
			row, part := b/p.Parts, b%p.Parts
			first := part * p.Chunk
			x := in[row*p.R+first : row*p.R+min(p.R, first+p.Chunk)]
			clear(threads[:])
			for j := 0; j < len(x); j += v {
				t := j / v % ReduceThreads
				for e := j; e < min(j+v, len(x)); e++ {
					threads[t] += x[e]
				}
			}
			clear(warps[:])
			for w := range ReduceThreads / 32 {
				warps[w] = halvingSum(threads[32*w : 32*w+32])
			}
			s := halvingSum(warps[:])
			if p.Parts == 1 {
				out[row] = s * alpha
			} else {
				out[b] = s
			}
		}
	})
}

// reduceCols: thread (tx, ty) adds rows ty, ty + by, ... of its part in its
// column, then the halving tree over ty.
func reduceCols[T Float](p ReducePass, in, out []T) {
	by := ReduceThreads / p.BX
	alpha := T(p.Alpha)
	parallelFor(p.Outer*p.Parts, max(1, pointwiseGrain/(p.Chunk*p.Inner)), func(lo, hi int) {
		acc := make([]T, by*p.Inner)
		col := make([]T, by)
		for b := lo; b < hi; b++ {
			o, part := b/p.Parts, b%p.Parts
			first := part * p.Chunk
			n := min(p.R, first+p.Chunk) - first
			clear(acc)
			for k := range n {
				x := in[(o*p.R+first+k)*p.Inner:][:p.Inner]
				a := acc[k%by*p.Inner:][:p.Inner]
				for i, v := range x {
					a[i] += v
				}
			}
			for i := range p.Inner {
				for ty := range by {
					col[ty] = acc[ty*p.Inner+i]
				}
				s := halvingSum(col)
				if p.Parts == 1 {
					out[o*p.Inner+i] = s * alpha
				} else {
					out[(o*p.Parts+part)*p.Inner+i] = s
				}
			}
		}
	})
}

// halvingSum adds v (a power of two long) by halves in place: v[j] +=
// v[j + n/2], then v[j] += v[j + n/4], ...: the order in which a warp's
// butterfly leaves the sum in lane 0, and a shared-memory tree its sum in
// row 0.
func halvingSum[T Float](v []T) T {
	for off := len(v) / 2; off > 0; off /= 2 {
		for j := range off {
			v[j] += v[j+off]
		}
	}
	return v[0]
}

func nextPow2(n int) int {
	p := 1
	for p < n {
		p *= 2
	}
	return p
}
