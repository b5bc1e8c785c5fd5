package kernels

// LayerNormParams describes layer normalisation over the last dimension of
// x [Rows, C], as torch.nn.functional.layer_norm with normalized_shape [C]:
// per row, with mean and the biased variance var of its C values,
//
//	xhat = (x - mean) * rstd,  rstd = 1/sqrt(var + Eps)
//	y    = xhat*gamma + beta   (gamma and beta optional)
//
// and the launch geometry that fixes the order of every sum
// (NewLayerNormParams chooses it from the shape). The CUDA kernels
// (layernorm.cu) take the same geometry and the CPU twins add in their
// order, rounding every operation as they do, so the two agree bit for bit.
type LayerNormParams struct {
	Rows, C int
	Eps     float64
	// Vec is the elements of a unit, which a thread reads whole: a 16-byte
	// chunk (4 float32, 2 float64) when C is a multiple of one, else 1.
	Vec int
	// Warp says a warp reduces each row, held in its registers (C*size up
	// to LayerNormWarpRowBytes, Vec a chunk); otherwise a block of Threads
	// threads does, reading the row again for each pass.
	Warp    bool
	Threads int
	// Blocks is the number of partial rows of the column sums
	// (LayerNormBackwardParams): the first pass's blocks.
	Blocks int
}

// The geometry of the kernels, as layernorm.cu states it (ops checks that
// kernels/cuda's generated constants agree).
const (
	// LayerNormWarps is the warps of a warp kernel's block.
	LayerNormWarps = 8
	// LayerNormWarpRowBytes is the longest row a warp holds.
	LayerNormWarpRowBytes = 4096
	// ColSumWarps is the warps of ColSum's blocks, each adding every
	// ColSumWarps-th row.
	ColSumWarps = 8
	// layerNormMaxBlocks bounds the column sums' partial rows: enough
	// blocks to fill a GPU (8 warps each), few enough that the partial rows
	// cost little next to the pass itself.
	layerNormMaxBlocks = 1024
	// layerNormUnitsPerThread is what a block kernel's thread reduces of a
	// row, at the least, before the block grows.
	layerNormUnitsPerThread = 4
)

// NewLayerNormParams returns the parameters and the launch geometry of
// layer normalisation over rows of c elements of elemBytes bytes (4 or 8),
// which depends on the shape and the dtype alone, never on the GPU: a warp
// per row for rows of a whole number of 16-byte chunks up to
// LayerNormWarpRowBytes, else a block per row, of a warp for every
// 4*layerNormUnitsPerThread units (at most 32 warps).
func NewLayerNormParams(rows, c, elemBytes int, eps float64) LayerNormParams {
	p := LayerNormParams{Rows: rows, C: c, Eps: eps, Vec: 1}
	if chunk := 16 / elemBytes; c%chunk == 0 {
		p.Vec = chunk
	}
	if p.Vec > 1 && c*elemBytes <= LayerNormWarpRowBytes {
		p.Warp, p.Threads = true, 32
		p.Blocks = min(ceilDiv(rows, LayerNormWarps), layerNormMaxBlocks)
		return p
	}
	units := c / p.Vec
	p.Threads = 32 * min(max(ceilDiv(units, 32*layerNormUnitsPerThread), 1), 32)
	p.Blocks = min(rows, layerNormMaxBlocks)
	return p
}

// rowOrder is the order in which a row's elements enter the sums: thread t
// of the kernel that reduces the row (a warp's lane, or a block's thread)
// adds elements order[start[t]:start[t+1]] in that order, its units t,
// t+threads, ... and each unit's elements in turn.
type rowOrder struct {
	threads int
	order   []int
	start   []int
}

func newRowOrder(p LayerNormParams) rowOrder {
	o := rowOrder{threads: p.Threads, order: make([]int, 0, p.C), start: make([]int, p.Threads+1)}
	units := p.C / p.Vec
	for t := range p.Threads {
		o.start[t] = len(o.order)
		for u := t; u < units; u += p.Threads {
			for e := range p.Vec {
				o.order = append(o.order, u*p.Vec+e)
			}
		}
	}
	o.start[p.Threads] = len(o.order)
	return o
}

func (o rowOrder) of(t int) []int { return o.order[o.start[t]:o.start[t+1]] }

// butterfly returns the sum of a's 32 values as a warp's butterfly adds
// them: lanes l and l^off add the same two values, at distances 16, 8, 4,
// 2, 1. It overwrites a.
func butterfly[T Float](a []T) T {
	a = a[:32]
	for off := 16; off > 0; off /= 2 {
		for l := range off {
			a[l] += a[l+off]
		}
	}
	return a[0]
}

// threadSum returns the sum of the threads' partial sums part as the
// kernels make it: a butterfly over each warp, then one over the warps'
// sums (zeros past the last warp) when there are several. It overwrites
// part.
func threadSum[T Float](part []T) T {
	warps := len(part) / 32
	if warps == 1 {
		return butterfly(part)
	}
	var ws [32]T
	for w := range warps {
		ws[w] = butterfly(part[w*32 : w*32+32])
	}
	return butterfly(ws[:])
}

// layerNormStats returns the mean and rstd of row x, in two passes: the
// sum, then the sum of squared deviations from the mean (see layernorm.cu
// for why not Welford), each in the kernels' order. part holds a partial
// sum per thread.
func layerNormStats[T Float](o rowOrder, eps float64, x, part []T) (mean, rstd T) {
	c := T(len(x))
	for t := range o.threads {
		var s T
		for _, j := range o.of(t) {
			s += x[j]
		}
		part[t] = s
	}
	mean = threadSum(part) / c
	for t := range o.threads {
		var s T
		for _, j := range o.of(t) {
			d := x[j] - mean
			s += T(d * d)
		}
		part[t] = s
	}
	return mean, invStd(threadSum(part)/c, eps)
}

// LayerNormForward computes y from x (see LayerNormParams); gamma and beta
// may be nil (no scale, no shift). Each row's statistics are worked out
// with the kernels' order of summation, and y = ((x-mean)*rstd)*gamma +
// beta with each operation rounded: the kernels' bits.
func LayerNormForward[T Float](p LayerNormParams, x, gamma, beta, y []T) {
	o := newRowOrder(p)
	c := p.C
	parallelFor(p.Rows, max(1, 4096/c), func(lo, hi int) {
		part := make([]T, p.Threads)
		for r := lo; r < hi; r++ {
			xr, yr := x[r*c:(r+1)*c], y[r*c:(r+1)*c]
			mean, rstd := layerNormStats(o, p.Eps, xr, part)
			for j, v := range xr {
				v = T((v - mean) * rstd)
				if gamma != nil {
					v = T(v * gamma[j])
				}
				if beta != nil {
					v += beta[j]
				}
				yr[j] = v
			}
		}
	})
}

// LayerNormBackwardDX computes dx from x, gamma (nil: none) and dy: per
// row, with g = dy*gamma and the forward's xhat, mean and rstd (worked out
// again, as the forward does),
//
//	dx = rstd * ((g - mean(g)) - xhat*mean(g*xhat))
//
// the two means summed in the kernels' order, every operation rounded.
func LayerNormBackwardDX[T Float](p LayerNormParams, x, gamma, dy, dx []T) {
	o := newRowOrder(p)
	c := p.C
	parallelFor(p.Rows, max(1, 4096/c), func(lo, hi int) {
		part, part2 := make([]T, p.Threads), make([]T, p.Threads)
		g, xh := make([]T, c), make([]T, c)
		for r := lo; r < hi; r++ {
			xr, dyr, dxr := x[r*c:(r+1)*c], dy[r*c:(r+1)*c], dx[r*c:(r+1)*c]
			mean, rstd := layerNormStats(o, p.Eps, xr, part)
			for j, v := range xr {
				xh[j] = T((v - mean) * rstd)
				g[j] = dyr[j]
				if gamma != nil {
					g[j] = T(dyr[j] * gamma[j])
				}
			}
			for t := range o.threads {
				var a, b T
				for _, j := range o.of(t) {
					a += g[j]
					b += T(g[j] * xh[j])
				}
				part[t], part2[t] = a, b
			}
			ma, mb := threadSum(part)/T(c), threadSum(part2)/T(c)
			for j := range dxr {
				dxr[j] = T(rstd * ((g[j] - ma) - T(xh[j]*mb)))
			}
		}
	})
}

// LayerNormBackwardParams computes the gradients of gamma and beta from x
// and dy: dgamma[j] = the sum over rows of dy*xhat, dbeta[j] = the sum of
// dy. Either may be nil (not computed; x is read only for dgamma). As the
// kernels: per-block partial sums first (p.Blocks of them), then their sum
// over the blocks (ColSum), every sum in the kernels' order.
func LayerNormBackwardParams[T Float](p LayerNormParams, x, dy, dgamma, dbeta []T) {
	c := p.C
	sums, bcol := 0, 0
	if dgamma != nil {
		sums, bcol = 1, c
	}
	if dbeta != nil {
		sums++
	}
	if sums == 0 {
		return
	}
	n := sums * c
	partial := make([]T, p.Blocks*n)
	o := newRowOrder(p)
	parallelFor(p.Blocks, 1, func(lo, hi int) {
		part := make([]T, p.Threads)
		acc := make([]T, n)
		for b := lo; b < hi; b++ {
			out := partial[b*n : (b+1)*n]
			if !p.Warp {
				// A block per row: the block's partial row, zeroed, gains
				// each of its rows in turn.
				clear(out)
				for r := b; r < p.Rows; r += p.Blocks {
					addParamsRow(o, p.Eps, x, dy, r, c, dgamma != nil, dbeta != nil, bcol, part, out)
				}
				continue
			}
			// A warp per row: each warp adds its rows into its own sums,
			// which the block then adds in warp order.
			for w := range LayerNormWarps {
				clear(acc)
				for r := b*LayerNormWarps + w; r < p.Rows; r += p.Blocks * LayerNormWarps {
					addParamsRow(o, p.Eps, x, dy, r, c, dgamma != nil, dbeta != nil, bcol, part, acc)
				}
				if w == 0 {
					copy(out, acc)
					continue
				}
				for j, v := range acc {
					out[j] += v
				}
			}
		}
	})
	out := make([]T, n)
	ColSum(p.Blocks, n, partial, out)
	if dgamma != nil {
		copy(dgamma, out[:c])
	}
	if dbeta != nil {
		copy(dbeta, out[bcol:bcol+c])
	}
}

// addParamsRow adds row r's dy*xhat (into sums[:c]) and dy (into
// sums[bcol:bcol+c]), as asked for.
func addParamsRow[T Float](o rowOrder, eps float64, x, dy []T, r, c int, dgamma, dbeta bool, bcol int, part, sums []T) {
	dyr := dy[r*c : (r+1)*c]
	if dgamma {
		xr := x[r*c : (r+1)*c]
		mean, rstd := layerNormStats(o, eps, xr, part)
		for j, v := range xr {
			sums[j] += T(dyr[j] * T((v-mean)*rstd))
		}
	}
	if dbeta {
		for j, v := range dyr {
			sums[bcol+j] += v
		}
	}
}

// ColSum sets out[j] to the sum over r < rows of in[r*cols+j], as the
// kernel layernorm_colsum adds it: ColSumWarps partial sums, the w-th of
// rows w, w+ColSumWarps, ... from zero, then those in order.
func ColSum[T Float](rows, cols int, in, out []T) {
	parallelFor(cols, 256, func(lo, hi int) {
		var part [ColSumWarps]T
		for j := lo; j < hi; j++ {
			for w := range ColSumWarps {
				var s T
				for r := w; r < rows; r += ColSumWarps {
					s += in[r*cols+j]
				}
				part[w] = s
			}
			t := part[0]
			for _, v := range part[1:] {
				t += v
			}
			out[j] = t
		}
	})
}
