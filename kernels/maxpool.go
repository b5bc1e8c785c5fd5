package kernels

import "math"

// MaxPool2dParams describes a 2-D max pooling of x [Planes, H, W] (NCHW
// with N*C planes) into y [Planes, OutH, OutW], as
// torch.nn.functional.max_pool2d with dilation 1 and ceil_mode false:
// output pixel (oh, ow) is the max of the KH x KW window whose top-left
// input pixel is (oh*StrideH - PadH, ow*StrideW - PadW); pixels of the
// window outside x are padding, which never wins (PyTorch's implicit -inf).
// Callers keep PadH <= KH/2 and PadW <= KW/2 (as PyTorch requires), so that
// every window holds a pixel of x, and OutH = (H+2*PadH-KH)/StrideH+1,
// OutW likewise. The CUDA kernels (kernels/maxpool.cu) take the same view.
type MaxPool2dParams struct {
	Planes, H, W, OutH, OutW int
	KH, KW, StrideH, StrideW int
	PadH, PadW               int
}

// negInf is where a window's best starts.
var negInf = math.Inf(-1)

// maxPoolGrain is the fewest output (or input) pixels a goroutine is given.
const maxPoolGrain = 1 << 12

// maxPoolArgmax returns the offset within plane of the winner of window
// (oh, ow) and its value, PyTorch's rule: the window is scanned row by
// row, left to right, and a pixel wins when it is greater than the best so
// far or is NaN. So the first maximum wins a tie, the last NaN wins over
// everything, and a window of -inf only gives its first pixel (the best
// starts at -inf on the window's first pixel inside x).
func maxPoolArgmax[T Float](p MaxPool2dParams, plane []T, oh, ow int) (int, T) {
	h0, w0 := oh*p.StrideH-p.PadH, ow*p.StrideW-p.PadW
	h1, w1 := min(h0+p.KH, p.H), min(w0+p.KW, p.W)
	h0, w0 = max(h0, 0), max(w0, 0)
	best, arg := T(negInf), h0*p.W+w0
	for ih := h0; ih < h1; ih++ {
		for iw := w0; iw < w1; iw++ {
			i := ih*p.W + iw
			if v := plane[i]; v > best || v != v {
				best, arg = v, i
			}
		}
	}
	return arg, best
}

// MaxPool2dForward writes y, the max of each window of x (see
// MaxPool2dParams and maxPoolArgmax for which pixel wins).
func MaxPool2dForward[T Float](p MaxPool2dParams, x, y []T) {
	hw, ohw := p.H*p.W, p.OutH*p.OutW
	parallelFor(p.Planes*ohw, maxPoolGrain, func(lo, hi int) {
		for o := lo; o < hi; o++ {
			pl, r := o/ohw, o%ohw
			_, y[o] = maxPoolArgmax(p, x[pl*hw:(pl+1)*hw], r/p.OutW, r%p.OutW)
		}
	})
}

// MaxPool2dBackward writes dx, the gradient of x given the gradient dy of
// y: each window's dy goes to the pixel that won it, which is found again
// from x (the forward saves no indices). Each pixel of x gathers from the
// windows that may hold it, in order of oh, then ow, and adds the dy of
// those it won: no scatter, and a fixed order of the sums, as maxpool.cu's
// backward kernel adds them.
func MaxPool2dBackward[T Float](p MaxPool2dParams, x, dy, dx []T) {
	hw, ohw := p.H*p.W, p.OutH*p.OutW
	parallelFor(p.Planes*hw, maxPoolGrain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			pl, r := i/hw, i%hw
			plane, g := x[pl*hw:(pl+1)*hw], dy[pl*ohw:(pl+1)*ohw]
			oh0, oh1 := maxPoolWindows(r/p.W, p.PadH, p.KH, p.StrideH, p.OutH)
			ow0, ow1 := maxPoolWindows(r%p.W, p.PadW, p.KW, p.StrideW, p.OutW)
			var sum T
			for oh := oh0; oh < oh1; oh++ {
				for ow := ow0; ow < ow1; ow++ {
					if arg, _ := maxPoolArgmax(p, plane, oh, ow); arg == r {
						sum += g[oh*p.OutW+ow]
					}
				}
			}
			dx[i] = sum
		}
	})
}

// maxPoolWindows returns the range [lo, hi) of the output rows (or
// columns) whose windows hold input row i: those with o*stride - pad <= i
// < o*stride - pad + k.
func maxPoolWindows(i, pad, k, stride, out int) (lo, hi int) {
	if j := i + pad - k + 1; j > 0 {
		lo = (j + stride - 1) / stride
	}
	hi = min((i+pad)/stride+1, out)
	return lo, max(lo, hi)
}
