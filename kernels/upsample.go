package kernels

// UpsampleParams describes a nearest-neighbour upsampling by an integer
// Factor, as PyTorch's interpolate(mode="nearest"): x [N, C, H, W] seen as
// Rows = N*C*H rows of W pixels, y [N, C, H*Factor, W*Factor] as
// Rows*Factor rows of W*Factor. Input row r's block of output rows is
// r*Factor .. r*Factor + Factor-1 (the planes of y follow one another as
// those of x do). The CUDA kernels (kernels/upsample.cu) take the same
// view.
type UpsampleParams struct {
	Rows, W, Factor int
}

// upsampleGrain is the fewest rows of x a goroutine is given.
const upsampleGrain = 64

// UpsampleNearestForward writes y: pixel (r, c) of x copied to the
// Factor x Factor block of y at rows r*Factor.., columns c*Factor...
func UpsampleNearestForward[T Float](p UpsampleParams, x, y []T) {
	f, ow := p.Factor, p.W*p.Factor
	parallelFor(p.Rows, upsampleGrain, func(lo, hi int) {
		for row := lo; row < hi; row++ {
			for col := range p.W {
				v := x[row*p.W+col]
				dst := y[row*f*ow+col*f:]
				for r := range f {
					for c := range f {
						dst[r*ow+c] = v
					}
				}
			}
		}
	})
}

// UpsampleNearestBackward writes dx, the gradient of x given the gradient
// dy of y: each pixel's sum of its block of dy, each row of the block
// summed left to right from zero, the row sums added top to bottom from
// zero, as upsample.cu's kernels add them (bit for bit).
func UpsampleNearestBackward[T Float](p UpsampleParams, dy, dx []T) {
	f, ow := p.Factor, p.W*p.Factor
	parallelFor(p.Rows, upsampleGrain, func(lo, hi int) {
		for row := lo; row < hi; row++ {
			for col := range p.W {
				src := dy[row*f*ow+col*f:]
				var sum T
				for r := range f {
					var rs T
					for c := range f {
						rs += src[r*ow+c]
					}
					sum += rs
				}
				dx[row*p.W+col] = sum
			}
		}
	})
}
