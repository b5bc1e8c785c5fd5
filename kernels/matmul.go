package kernels

import (
	"fmt"
	"runtime"
)

// GemmParams describes a batch of matrix products in row-major storage,
//
//	C[i] = Alpha * op(A[i]) * op(B[i]) + Beta * C[i],   i < Batch,
//
// as BLAS's gemm and cuBLAS's strided-batched gemm compute them, but row by
// row: op(A) is M x K (A is stored M x K, or K x M when TransA), op(B) is
// K x N (B is stored K x N, or N x K when TransB) and C is M x N. Matrix i
// of a batch starts i*StrideA elements into A's slice (likewise for B and
// C). C must not overlap A or B. The device's GEMM takes the same fields
// (ops/linear_device.go passes them on).
//
// As in BLAS, C is not read when Beta is 0 (NaNs there are overwritten),
// and A and B are not read when Alpha is 0 or K is 0.
type GemmParams struct {
	TransA, TransB bool
	M, N, K        int
	// LDA, LDB and LDC are the row strides of A, B and C as stored, in
	// elements; 0 means packed, the stored row length (K or M for A, N or
	// K for B, N for C).
	LDA, LDB, LDC int
	// Batch is the number of products; 0 means 1.
	Batch int
	// StrideA, StrideB and StrideC are the offsets, in elements, from one
	// matrix of a batch to the next. A StrideA or StrideB of 0 uses one
	// matrix for every product (a weight shared by the batch); StrideC must
	// keep the products' outputs apart.
	StrideA, StrideB, StrideC int
	Alpha, Beta               float64
}

// storedA returns the shape of A as stored: rows x cols.
func (p *GemmParams) storedA() (rows, cols int) {
	if p.TransA {
		return p.K, p.M
	}
	return p.M, p.K
}

// storedB returns the shape of B as stored: rows x cols.
func (p *GemmParams) storedB() (rows, cols int) {
	if p.TransB {
		return p.N, p.K
	}
	return p.K, p.N
}

// normalized returns p with its defaults filled in: packed row strides and
// a batch of one.
func (p GemmParams) normalized() GemmParams {
	if p.Batch == 0 {
		p.Batch = 1
	}
	if _, cols := p.storedA(); p.LDA == 0 {
		p.LDA = cols
	}
	if _, cols := p.storedB(); p.LDB == 0 {
		p.LDB = cols
	}
	if p.LDC == 0 {
		p.LDC = p.N
	}
	return p
}

// footprint is the number of elements a rows x cols matrix with row stride
// ld spans, 0 when it has no element.
func footprint(rows, cols, ld int) int {
	if rows == 0 || cols == 0 {
		return 0
	}
	return (rows-1)*ld + cols
}

// Check returns an error naming the first field of p that is out of range,
// or the first slice that is too short for it: la, lb and lc are the
// lengths of A's, B's and C's slices.
func (p GemmParams) Check(la, lb, lc int) error {
	if p.M < 0 || p.N < 0 || p.K < 0 || p.Batch < 0 {
		return fmt.Errorf("kernels: Gemm: sizes must not be negative, got M=%d N=%d K=%d Batch=%d", p.M, p.N, p.K, p.Batch)
	}
	if p.LDA < 0 || p.LDB < 0 || p.LDC < 0 || p.StrideA < 0 || p.StrideB < 0 || p.StrideC < 0 {
		return fmt.Errorf("kernels: Gemm: strides must not be negative, got LDA=%d LDB=%d LDC=%d StrideA=%d StrideB=%d StrideC=%d",
			p.LDA, p.LDB, p.LDC, p.StrideA, p.StrideB, p.StrideC)
	}
	q := p.normalized()
	ar, ac := q.storedA()
	br, bc := q.storedB()
	for _, m := range []struct {
		name           string
		rows, cols, ld int
		stride, length int
		read           bool
	}{
		{"A", ar, ac, q.LDA, q.StrideA, la, q.Alpha != 0},
		{"B", br, bc, q.LDB, q.StrideB, lb, q.Alpha != 0},
		{"C", q.M, q.N, q.LDC, q.StrideC, lc, true},
	} {
		if m.ld < m.cols {
			return fmt.Errorf("kernels: Gemm: LD%s = %d is shorter than %s's rows of %d elements", m.name, m.ld, m.name, m.cols)
		}
		size := footprint(m.rows, m.cols, m.ld)
		if size == 0 || !m.read && m.name != "C" {
			continue
		}
		if m.name == "C" && q.Batch > 1 && m.stride < size {
			return fmt.Errorf("kernels: Gemm: StrideC = %d makes the %d products' outputs (%d elements each) overlap", m.stride, q.Batch, size)
		}
		if need := (q.Batch-1)*m.stride + size; m.length < need {
			return fmt.Errorf("kernels: Gemm: %s has %d elements, the batch needs %d", m.name, m.length, need)
		}
	}
	return nil
}

// Gemm computes C[i] = Alpha*op(A[i])*op(B[i]) + Beta*C[i] for the batch p
// describes (see GemmParams), on GOMAXPROCS goroutines. Every element of C
// is summed in an order that depends on K alone, so the result is the same
// bit for bit whatever the number of goroutines. It returns Check's error
// for parameters out of range and leaves C untouched then.
func Gemm[T Float](p GemmParams, a, b, c []T) error {
	if err := p.Check(len(a), len(b), len(c)); err != nil {
		return err
	}
	gemm(chosenKernel[T](), p.normalized(), a, b, c)
	return nil
}

// The blocking of gemm, for the MR x NR micro-kernels of gemm.go:
//
//  1. op(A) and op(B) of every product of the batch (once for a shared
//     operand) are packed whole into panels, in parallel chunks of rows:
//     for each depth block of kc (depthBlocks), A's block is mPad x kc in
//     MR-row panels and B's is kc x nPad in NR-column panels. Packing costs
//     O(MK + KN) against the product's O(MNK), and handles the transposes
//     and row strides, so the tiles below see one layout only.
//  2. C is cut into tiles of at most tileRows x colBlock, one job each,
//     across the batch; a job runs the depth blocks in order through
//     macroKernel. Every element of C is thus one sum over the depth blocks
//     in order, whatever the tiling: tiles shrink to keep every worker
//     busy without changing a bit of the result.
//
// tileRows is a multiple of 6 and of 8 (both MRs): a packed A block of
// tileRows x kcMax stays in L2 while B's panels stream past it.
const tileRows = 192

// gemmMinWork is the fewest multiply-adds worth a goroutine of its own.
const gemmMinWork = 1 << 16

func gemm[T Float](mk microKernel[T], p GemmParams, a, b, c []T) {
	M, N, K := p.M, p.N, p.K
	if M == 0 || N == 0 || p.Batch == 0 {
		return
	}
	if K == 0 || p.Alpha == 0 {
		for i := range p.Batch {
			scaleMatrix(c[i*p.StrideC:], M, N, p.LDC, T(p.Beta))
		}
		return
	}
	mr, nr := mk.mr, mk.nr
	mPad, nPad := roundUp(M, mr), roundUp(N, nr)
	nkb, kc := depthBlocks(K)

	// 1. Packing.
	nA, nB := p.Batch, p.Batch
	if p.StrideA == 0 {
		nA = 1
	}
	if p.StrideB == 0 {
		nB = 1
	}
	aSize, bSize := mPad*K, nPad*K
	ap, bp := getBuf[T](nA*aSize), getBuf[T](nB*bSize)
	defer putBuf(ap)
	defer putBuf(bp)
	pa, pb := *ap, *bp
	// Element (r, q) of op(A) is at a[r*ars + q*aps]; (column r, depth q)
	// of op(B) at b[r*brs + q*bps].
	ars, aps := p.LDA, 1
	if p.TransA {
		ars, aps = 1, p.LDA
	}
	brs, bps := 1, p.LDB
	if p.TransB {
		brs, bps = p.LDB, 1
	}
	aChunk, bChunk := roundUp(tileRows, mr), roundUp(colBlock, nr)
	aChunks, bChunks := ceilDiv(M, aChunk), ceilDiv(N, bChunk)
	aJobs, bJobs := nA*nkb*aChunks, nB*nkb*bChunks
	packWork := (nA*mPad + nB*nPad) * K
	packGrain := max(1, gemmMinWork*(aJobs+bJobs)/packWork)
	parallelFor(aJobs+bJobs, packGrain, func(lo, hi int) {
		for j := lo; j < hi; j++ {
			job := j
			src, dst, rs, ps, rows, chunk, chunks, w, stride, size := a, pa, ars, aps, M, aChunk, aChunks, mr, p.StrideA, aSize
			if job >= aJobs {
				job -= aJobs
				src, dst, rs, ps, rows, chunk, chunks, w, stride, size = b, pb, brs, bps, N, bChunk, bChunks, nr, p.StrideB, bSize
			}
			i, kb, r0 := job/(nkb*chunks), job/chunks%nkb, job%chunks*chunk
			k0, k1 := kb*kc, min((kb+1)*kc, K)
			r1 := min(r0+chunk, rows)
			block := dst[i*size+k0*roundUp(rows, w):]
			packPanels(block[r0*(k1-k0):roundUp(r1, w)*(k1-k0)], src[i*stride+k0*ps+r0*rs:], nil, rs, ps, r1-r0, k1-k0, w)
		}
	})

	// 2. Tiles of C. Shrink them, columns first, until every worker has
	// a few jobs.
	mc, nc := min(roundUp(tileRows, mr), mPad), min(roundUp(colBlock, nr), nPad)
	workers := runtime.GOMAXPROCS(0)
	for p.Batch*ceilDiv(M, mc)*ceilDiv(N, nc) < 4*workers {
		if nc > 4*nr {
			nc = roundUp(nc/2, nr)
		} else if mc > 4*mr {
			mc = roundUp(mc/2, mr)
		} else {
			break
		}
	}
	mTiles, nTiles := ceilDiv(M, mc), ceilDiv(N, nc)
	alpha, beta := T(p.Alpha), T(p.Beta)
	tileGrain := max(1, gemmMinWork/(min(mc, M)*min(nc, N)*K))
	parallelFor(p.Batch*mTiles*nTiles, tileGrain, func(lo, hi int) {
		tp := getBuf[T](mc * nc)
		defer putBuf(tp)
		tile := *tp
		for job := lo; job < hi; job++ {
			i, ti, tj := job/(mTiles*nTiles), job/nTiles%mTiles, job%nTiles
			i0, j0 := ti*mc, tj*nc
			i1, j1 := min(i0+mc, M), min(j0+nc, N)
			rPad, cPad := roundUp(i1-i0, mr), roundUp(j1-j0, nr)
			var ab, bb []T
			if nA > 1 {
				ab = pa[i*aSize : (i+1)*aSize]
			} else {
				ab = pa[:aSize]
			}
			if nB > 1 {
				bb = pb[i*bSize : (i+1)*bSize]
			} else {
				bb = pb[:bSize]
			}
			ci := c[i*p.StrideC:]
			// A whole tile of alpha 1 and beta 0 goes straight to C:
			// the same sums in the same order as through the scratch tile.
			direct := alpha == 1 && beta == 0 && rPad == i1-i0 && cPad == j1-j0
			dst, ldd := tile, nc
			if direct {
				dst, ldd = ci[i0*p.LDC+j0:], p.LDC
			}
			for kb := range nkb {
				k0, k1 := kb*kc, min((kb+1)*kc, K)
				d := k1 - k0
				ablk := ab[k0*mPad+i0*d:]
				bblk := bb[k0*nPad+j0*d:]
				macroKernel(&mk, d, ablk, bblk, rPad, cPad, dst, ldd, kb > 0)
			}
			if direct {
				continue
			}
			for r := range i1 - i0 {
				gemmEpilogue(ci[(i0+r)*p.LDC+j0:(i0+r)*p.LDC+j1], tile[r*nc:r*nc+j1-j0], alpha, beta)
			}
		}
	})
}

// gemmEpilogue writes one row of a tile to C: dst = alpha*src + beta*dst,
// without reading dst when beta is 0.
func gemmEpilogue[T Float](dst, src []T, alpha, beta T) {
	src = src[:len(dst)]
	switch {
	case beta == 0 && alpha == 1:
		copy(dst, src)
	case beta == 0:
		for j, v := range src {
			dst[j] = alpha * v
		}
	case alpha == 1 && beta == 1:
		addTo(dst, src)
	default:
		for j, v := range src {
			dst[j] = alpha*v + beta*dst[j]
		}
	}
}

// scaleMatrix multiplies the rows x cols matrix c (row stride ldc) by beta,
// clearing it when beta is 0 (NaNs included, as BLAS does).
func scaleMatrix[T Float](c []T, rows, cols, ldc int, beta T) {
	if beta == 1 {
		return
	}
	for r := range rows {
		row := c[r*ldc : r*ldc+cols]
		if beta == 0 {
			clear(row)
			continue
		}
		for j := range row {
			row[j] *= beta
		}
	}
}

// sumRowBlock is the number of rows SumRows adds into one partial sum
// before adding that to the total: a two-level sum, whose rounding error
// grows with rows/sumRowBlock + sumRowBlock rather than with rows.
const sumRowBlock = 256

// SumRows sets dst[j] to the sum of column j of the rows x cols matrix src
// (packed rows): the gradient of a bias added to every row. Each column is
// summed in an order that depends on rows alone, so the result does not
// depend on the number of goroutines.
func SumRows[T Float](rows, cols int, src, dst []T) {
	src, dst = src[:rows*cols], dst[:cols]
	const chunk = 256 // columns per job, a multiple of every vector width
	grain := max(1, gemmMinWork/(rows*chunk+1))
	parallelFor(ceilDiv(cols, chunk), grain, func(lo, hi int) {
		tp := getBuf[T](chunk)
		defer putBuf(tp)
		for job := lo; job < hi; job++ {
			j0, j1 := job*chunk, min((job+1)*chunk, cols)
			out, part := dst[j0:j1], (*tp)[:j1-j0]
			clear(out)
			for r0 := 0; r0 < rows; r0 += sumRowBlock {
				clear(part)
				for r := r0; r < min(r0+sumRowBlock, rows); r++ {
					addTo(part, src[r*cols+j0:r*cols+j1])
				}
				addTo(out, part)
			}
		}
	})
}

// BroadcastRows sets each of the rows rows of dst (cols elements each,
// packed) to src: a bias spread over every row, the adjoint of SumRows.
func BroadcastRows[T Float](rows, cols int, src, dst []T) {
	src, dst = src[:cols], dst[:rows*cols]
	for r := range rows {
		copy(dst[r*cols:(r+1)*cols], src)
	}
}
