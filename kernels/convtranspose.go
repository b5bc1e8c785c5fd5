package kernels

// ConvTransposeEpilogueParams describes the pass of a transposed convolution after
// its GEMM (kernels/convtranspose.cu's conv_transpose_epilogue): z [N, C*FH*FW, H, W]
// to y [N, C, H*FH, W*FW], channel c*FH*FW + a*FW + b of z holding the
// pixels (i*FH + a, j*FW + b) of channel c of y (depth to space; FH = FW =
// 1: y is z), with y = act(z + bias[c]).
type ConvTransposeEpilogueParams struct {
	N, C, H, W, FH, FW int
	ReLU               bool
}

// convTGrain is the fewest planes of y a goroutine is given.
const convTGrain = 4

// ConvTransposeEpilogue writes y from z as p says, element by element in
// y's order as the kernel: with a bias (nil: none) or a ReLU, v = z +
// bias[c] (0 without one) and the ReLU writes 0 where !(v > 0), NaN
// included; with neither, y = z. With FH = FW = 1, y may be z.
func ConvTransposeEpilogue[T Float](p ConvTransposeEpilogueParams, z, bias, y []T) {
	oh, ow := p.H*p.FH, p.W*p.FW
	affine := bias != nil || p.ReLU
	parallelFor(p.N*p.C, convTGrain, func(lo, hi int) {
		for plane := lo; plane < hi; plane++ {
			img, c := plane/p.C, plane%p.C
			var b T
			if bias != nil {
				b = bias[c]
			}
			out := y[plane*oh*ow : (plane+1)*oh*ow]
			for r := range oh {
				i, a := r/p.FH, r%p.FH
				for col := range ow {
					j, bb := col/p.FW, col%p.FW
					zc := (img*p.C+c)*p.FH*p.FW + a*p.FW + bb
					v := z[(zc*p.H+i)*p.W+j]
					if affine {
						v += b
						if p.ReLU && !(v > 0) {
							v = 0
						}
					}
					out[r*ow+col] = v
				}
			}
		}
	})
}

// ConvTransposeBiasGrad writes db[c], the sum of channel c of dy [N, C,
// HW]: each plane summed in pixel order, the planes added in image order,
// so that the result does not depend on any blocking. (conv_transpose_bias_grad
// sums each plane as a tree: the same function, other roundings.)
func ConvTransposeBiasGrad[T Float](n, c, hw int, dy, db []T) {
	clear(db)
	for i := range n * c {
		var s T
		for _, x := range dy[i*hw : (i+1)*hw] {
			s += x
		}
		db[i%c] += s
	}
}
