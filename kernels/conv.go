package kernels

import "runtime"

// ConvParams describes one 2-D convolution as PyTorch's conv2d computes it
// (cross-correlation, NCHW, groups=1): x [N,Cin,H,W], w [Cout,Cin,KH,KW],
// y [N,Cout,OutH,OutW] with
//
//	y[n,co,oh,ow] = act(bias[co] + sum_{ci,kh,kw} w[co,ci,kh,kw] *
//	                x[n,ci,oh*StrideH-PadH+kh*DilationH, ow*StrideW-PadW+kw*DilationW])
//
// where x is zero outside the image. The CUDA kernels take the same struct by
// value. Strides and dilations are positive, pads non-negative, and OutH,
// OutW = (H+2*PadH-DilationH*(KH-1)-1)/StrideH+1 (likewise for W) are
// positive: the ops package checks this before a kernel runs.
type ConvParams struct {
	N, Cin, H, W         int
	Cout, KH, KW         int
	StrideH, StrideW     int
	PadH, PadW           int
	DilationH, DilationW int
	OutH, OutW           int
	// ReLU makes the forward pass apply max(.,0) in its epilogue and the
	// backward passes read dy masked by y > 0 (PyTorch's threshold_backward),
	// so the layer needs no separate activation pass either way.
	ReLU bool
}

// The convolution as GEMMs, per image n, with K = Cin*KH*KW reduction rows
// kk = (ci,kh,kw) and P = OutH*OutW output pixels:
//
//	forward: y[n]  (Cout x P) = w (Cout x K) * col(x[n]) (K x P), + bias, act
//	dgrad:   dx[n] = col2im(w^T (K x Cout) * dy'[n] (Cout x P))
//	wgrad:   dw (Cout x K) = sum_n dy'[n] (Cout x P) * col(x[n])^T (P x K)
//
// where dy' is dy masked by the ReLU and col(x[n])[kk, j] is the input pixel
// that weight kk meets at output pixel j (zero in the padding). col is never
// built: the packing routines gather each block of it straight into panels.

func (p *ConvParams) reduction() int { return p.Cin * p.KH * p.KW }
func (p *ConvParams) pixels() int    { return p.OutH * p.OutW }

// rowRun is a run of consecutive output pixels on one output row: block
// columns [j, j+n) are pixels (oh, ow..ow+n-1).
type rowRun struct{ j, n, oh, ow int }

// pixelRuns splits output pixels [j0, j1) into runs along output rows.
func (p *ConvParams) pixelRuns(j0, j1 int, runs []rowRun) []rowRun {
	runs = runs[:0]
	for j := j0; j < j1; {
		oh, ow := j/p.OutW, j%p.OutW
		n := min(p.OutW-ow, j1-j)
		runs = append(runs, rowRun{j: j - j0, n: n, oh: oh, ow: ow})
		j += n
	}
	return runs
}

// tap is the position of reduction row kk = (ci, kh, kw) in the input: its
// channel and its offset from an output pixel's top-left input position.
type tap struct{ ci, kh, kw, dh, dw int }

func (p *ConvParams) tap(kk int) tap {
	t := tap{ci: kk / (p.KW * p.KH), kh: kk / p.KW % p.KH, kw: kk % p.KW}
	t.dh, t.dw = t.kh*p.DilationH-p.PadH, t.kw*p.DilationW-p.PadW
	return t
}

// next moves t to reduction row kk+1 without the divisions of tap, which
// would cost more than the copying they steer.
func (p *ConvParams) next(t *tap) {
	t.kw++
	t.dw += p.DilationW
	if t.kw < p.KW {
		return
	}
	t.kw, t.dw = 0, -p.PadW
	t.kh++
	t.dh += p.DilationH
	if t.kh < p.KH {
		return
	}
	t.kh, t.dh = 0, -p.PadH
	t.ci++
}

// span returns the input row ih and the first input column iw0 that tap t
// meets along run r, with the range [lo, hi) of the run's pixels that fall
// inside the image (lo == hi when none does).
func (p *ConvParams) span(t *tap, r *rowRun) (ih, iw0, lo, hi int) {
	ih = r.oh*p.StrideH + t.dh
	iw0 = r.ow*p.StrideW + t.dw
	if ih < 0 || ih >= p.H {
		return ih, iw0, 0, 0
	}
	if s := p.StrideW; s == 1 {
		lo, hi = max(0, -iw0), min(r.n, p.W-iw0)
	} else {
		if iw0 < 0 {
			lo = (-iw0 + s - 1) / s
		}
		if last := p.W - 1 - iw0; last >= 0 {
			hi = min(r.n, last/s+1)
		}
	}
	lo = min(lo, r.n)
	return ih, iw0, lo, max(lo, hi)
}

// panelRun is a rowRun cut at panel boundaries: block columns [j, j+n) lie
// in panel q at columns c.., and run pixels [i, i+n) fill them.
type panelRun struct{ i, n, q, c int }

// panelRuns cuts run r at the boundaries of panels of nr columns.
func panelRuns(r rowRun, nr int, out []panelRun) []panelRun {
	out = out[:0]
	for i := 0; i < r.n; {
		j := r.j + i
		q, c := j/nr, j%nr
		n := min(nr-c, r.n-i)
		out = append(out, panelRun{i: i, n: n, q: q, c: c})
		i += n
	}
	return out
}

// im2colScratch holds what packing a block needs besides its output, reused
// from block to block.
type im2colScratch struct {
	runs  []rowRun
	cuts  [][]panelRun
	chans []chanRun
}

// packIm2col packs rows [k0,k1) and pixel columns [j0,j1) of col(xn) into
// B panels of nr columns (zero past j1, up to the next multiple of nr).
func packIm2col[T Float](dst, xn []T, p *ConvParams, k0, k1, j0, j1, nr int, s *im2colScratch) {
	kc := k1 - k0
	plane := p.H * p.W
	s.runs = p.pixelRuns(j0, j1, s.runs)
	for len(s.cuts) < len(s.runs) {
		s.cuts = append(s.cuts, nil)
	}
	for i, r := range s.runs {
		s.cuts[i] = panelRuns(r, nr, s.cuts[i])
	}
	// Columns past j1 in the last panel.
	if n := j1 - j0; n%nr != 0 {
		q := n / nr
		for row := range kc {
			clear(dst[(q*kc+row)*nr+n%nr : (q*kc+row+1)*nr])
		}
	}
	t := p.tap(k0)
	for row := range kc {
		xc := xn[t.ci*plane : (t.ci+1)*plane]
		for ri := range s.runs {
			r := &s.runs[ri]
			ih, iw0, lo, hi := p.span(&t, r)
			var src []T
			if hi > lo {
				src = xc[ih*p.W : (ih+1)*p.W]
			}
			for _, pr := range s.cuts[ri] {
				d := dst[(pr.q*kc+row)*nr+pr.c : (pr.q*kc+row)*nr+pr.c+pr.n]
				// Pixels [a, b) of this piece are inside the image. Most
				// pieces lie wholly inside: skip the empty clears.
				a, b := min(max(lo-pr.i, 0), pr.n), min(max(hi-pr.i, 0), pr.n)
				if b <= a {
					clear(d)
					continue
				}
				if a > 0 {
					clear(d[:a])
				}
				if p.StrideW == 1 {
					copy(d[a:b], src[iw0+pr.i+a:iw0+pr.i+b])
				} else {
					for k := a; k < b; k++ {
						d[k] = src[iw0+(pr.i+k)*p.StrideW]
					}
				}
				if b < len(d) {
					clear(d[b:])
				}
			}
		}
		p.next(&t)
	}
}

// packIm2colT packs the transpose of col(xn): pixel rows [q0,q1) (the
// reduction of wgrad) by reduction-row columns [j0,j1), into B panels of nr
// columns.
func packIm2colT[T Float](dst, xn []T, p *ConvParams, q0, q1, j0, j1, nr int, s *im2colScratch) {
	kc := q1 - q0
	plane := p.H * p.W
	s.runs = p.pixelRuns(q0, q1, s.runs)
	t := p.tap(j0)
	for c0 := j0; c0 < j1; c0 += nr {
		panel := dst[(c0-j0)*kc : (c0-j0+nr)*kc]
		if c0+nr > j1 {
			clear(panel)
		}
		for c := range min(nr, j1-c0) {
			xc := xn[t.ci*plane : (t.ci+1)*plane]
			for ri := range s.runs {
				r := &s.runs[ri]
				ih, iw0, lo, hi := p.span(&t, r)
				d := panel[r.j*nr+c:]
				for i := 0; i < lo; i++ {
					d[i*nr] = 0
				}
				if hi > lo {
					row := xc[ih*p.W : (ih+1)*p.W]
					if p.StrideW == 1 {
						for i, v := range row[iw0+lo : iw0+hi] {
							d[(lo+i)*nr] = v
						}
					} else {
						for i := lo; i < hi; i++ {
							d[i*nr] = row[iw0+i*p.StrideW]
						}
					}
				}
				for i := hi; i < r.n; i++ {
					d[i*nr] = 0
				}
			}
			p.next(&t)
		}
	}
}

// colBlock is the widest block of output pixels one GEMM job handles: a
// packed B block of kcMax x colBlock stays in L2. It is a multiple of every
// micro-kernel's NR (4, 8, 16, 32).
const colBlock = 256

// ConvForward computes y = act(conv(x, w) + bias); bias may be nil. x, w and
// y are contiguous NCHW / OIHW tensors as ConvParams describes.
func ConvForward[T Float](p ConvParams, x, w, bias, y []T) {
	convForward(chosenKernel[T](), p, x, w, bias, y)
}

func convForward[T Float](mk microKernel[T], p ConvParams, x, w, bias, y []T) {
	K, P := p.reduction(), p.pixels()
	mr, nr := mk.mr, mk.nr
	mPad := roundUp(p.Cout, mr)
	nkb, kc := depthBlocks(K)

	// The weights are the A operand of every job: pack them once.
	ap := getBuf[T](mPad * K)
	defer putBuf(ap)
	a := *ap
	parallelFor(nkb, 1, func(lo, hi int) {
		for b := lo; b < hi; b++ {
			k0, k1 := b*kc, min((b+1)*kc, K)
			packPanels(a[k0*mPad:k1*mPad], w[k0:], nil, K, 1, p.Cout, k1-k0, mr)
		}
	})

	// One job per block of output pixels of one image. Every output element
	// is one dot product whatever the blocking, so the block width can
	// shrink to give every worker several jobs.
	nc := roundUp(min(P, colBlock), nr)
	for workers := runtime.GOMAXPROCS(0); nc > nr && p.N*ceilDiv(P, nc) < 4*workers; {
		nc = roundUp(nc/2, nr)
	}
	perImage := ceilDiv(P, nc)
	xSize, ySize := p.Cin*p.H*p.W, p.Cout*P
	parallelFor(p.N*perImage, 1, func(lo, hi int) {
		bp, cp := getBuf[T](kc*nc), getBuf[T](mPad*nc)
		defer putBuf(bp)
		defer putBuf(cp)
		b, c := *bp, *cp
		var scratch im2colScratch
		for job := lo; job < hi; job++ {
			n := job / perImage
			j0 := job % perImage * nc
			j1 := min(j0+nc, P)
			nPad := roundUp(j1-j0, nr)
			xn := x[n*xSize : (n+1)*xSize]
			for kb := range nkb {
				k0, k1 := kb*kc, min((kb+1)*kc, K)
				packIm2col(b, xn, &p, k0, k1, j0, j1, nr, &scratch)
				macroKernel(&mk, k1-k0, a[k0*mPad:k1*mPad], b, mPad, nPad, c, nc, kb > 0)
			}
			// Epilogue: bias and activation on the tile while it is in
			// cache, written straight to y.
			yn := y[n*ySize : (n+1)*ySize]
			for co := range p.Cout {
				var bv T
				if bias != nil {
					bv = bias[co]
				}
				affine(yn[co*P+j0:co*P+j1], c[co*nc:co*nc+j1-j0], nil, 0, 1, bv, p.ReLU)
			}
		}
	})
}

// ConvBackwardData computes dx, the gradient of the convolution with respect
// to x, from dy (masked by y > 0 when p.ReLU; y is not read otherwise and may
// be nil). dx is overwritten.
func ConvBackwardData[T Float](p ConvParams, w, y, dy, dx []T) {
	convBackwardData(chosenKernel[T](), p, w, y, dy, dx)
}

func convBackwardData[T Float](mk microKernel[T], p ConvParams, w, y, dy, dx []T) {
	K, P := p.reduction(), p.pixels()
	KK := p.KH * p.KW
	mr, nr := mk.mr, mk.nr
	nkb, kc := depthBlocks(p.Cout)
	pPad := roundUp(P, nr)
	// Pixel blocks start on panel boundaries. colBlock is a multiple of
	// every micro-kernel's NR, so the blocks, and with them the order in
	// which col2im adds into each element of dx, are the same whatever the
	// kernel (TestTileShapesAgree).
	cb := max(nr, colBlock/nr*nr)
	ySize, xSize, plane := p.Cout*P, p.Cin*p.H*p.W, p.H*p.W
	if !p.ReLU {
		y = nil
	}

	// Jobs own groups of input channels, so that the col2im scatter of one
	// job never touches another's part of dx: no locks, and every element of
	// dx is summed in the same order whatever the number of workers. A group
	// spans at least one micro-kernel tile of rows.
	workers := runtime.GOMAXPROCS(0)
	groups := max(1, min(p.Cin, 4*workers, p.Cin*KK/mr))
	cg := ceilDiv(p.Cin, groups)
	groups = ceilDiv(p.Cin, cg)
	rowsMax := roundUp(cg*KK, mr)

	// dy'[n] is the B operand of every job of image n: pack it once per
	// image, masking it on the way (the ReLU backward costs no pass). With
	// few channel groups, several images share a phase, so that every
	// worker has jobs.
	perPhase := max(1, min(p.N, ceilDiv(4*workers, groups)))
	bSize := p.Cout * pPad
	bp := getBuf[T](perPhase * bSize)
	defer putBuf(bp)
	chunks := ceilDiv(pPad, cb)
	for n0 := 0; n0 < p.N; n0 += perPhase {
		images := min(perPhase, p.N-n0)
		parallelFor(images*nkb*chunks, 1, func(lo, hi int) {
			for job := lo; job < hi; job++ {
				n := n0 + job/(nkb*chunks)
				kb, j0 := job/chunks%nkb, job%chunks*cb
				c0, c1 := kb*kc, min((kb+1)*kc, p.Cout)
				j1 := min(j0+cb, P)
				dyn := dy[n*ySize : (n+1)*ySize]
				var m []T
				if y != nil {
					m = y[n*ySize+c0*P+j0:]
				}
				b := (*bp)[(n-n0)*bSize:]
				dst := b[c0*pPad+j0*(c1-c0) : c0*pPad+roundUp(j1, nr)*(c1-c0)]
				packPanels(dst, dyn[c0*P+j0:], m, 1, P, j1-j0, c1-c0, nr)
			}
		})
		parallelFor(images*groups, 1, func(lo, hi int) {
			ap, cp := getBuf[T](rowsMax*p.Cout), getBuf[T](rowsMax*cb)
			defer putBuf(ap)
			defer putBuf(cp)
			a, c := *ap, *cp
			var runs []rowRun
			for job := lo; job < hi; job++ {
				n, g := n0+job/groups, job%groups
				b := (*bp)[(n-n0)*bSize : (n-n0+1)*bSize]
				ci0, ci1 := g*cg, min((g+1)*cg, p.Cin)
				r0, r1 := ci0*KK, ci1*KK
				rPad := roundUp(r1-r0, mr)
				// A = w^T restricted to the group's rows: tiny, packed per job.
				for kb := range nkb {
					c0, c1 := kb*kc, min((kb+1)*kc, p.Cout)
					packPanels(a[c0*rPad:c1*rPad], w[c0*K+r0:], nil, 1, K, r1-r0, c1-c0, mr)
				}
				dxg := dx[n*xSize+ci0*plane : n*xSize+ci1*plane]
				clear(dxg)
				for j0 := 0; j0 < P; j0 += cb {
					j1 := min(j0+cb, P)
					nPad := roundUp(j1-j0, nr)
					for kb := range nkb {
						c0, c1 := kb*kc, min((kb+1)*kc, p.Cout)
						bb := b[c0*pPad+j0*(c1-c0):]
						macroKernel(&mk, c1-c0, a[c0*rPad:c1*rPad], bb, rPad, nPad, c, cb, kb > 0)
					}
					// col2im: add each row of the tile onto the input pixels
					// its tap meets.
					runs = p.pixelRuns(j0, j1, runs)
					t := p.tap(r0)
					for i := range r1 - r0 {
						dxc := dxg[(t.ci-ci0)*plane : (t.ci-ci0+1)*plane]
						ci := c[i*cb : i*cb+j1-j0]
						for ri := range runs {
							r := &runs[ri]
							ih, iw0, lo, hi := p.span(&t, r)
							if hi <= lo {
								continue
							}
							src := ci[r.j+lo : r.j+hi]
							row := dxc[ih*p.W : (ih+1)*p.W]
							if p.StrideW == 1 {
								addTo(row[iw0+lo:iw0+hi], src)
							} else {
								for j, v := range src {
									row[iw0+(lo+j)*p.StrideW] += v
								}
							}
						}
						p.next(&t)
					}
				}
			}
		})
	}
}

// ConvBackwardFilter computes dw, the gradient of the convolution with
// respect to w, and db, that with respect to the bias (skipped when db is
// nil), from x and dy (masked by y > 0 when p.ReLU; y is not read otherwise
// and may be nil). dw and db are overwritten.
func ConvBackwardFilter[T Float](p ConvParams, x, y, dy, dw, db []T) {
	convBackwardFilter(chosenKernel[T](), p, x, y, dy, dw, db)
}

func convBackwardFilter[T Float](mk microKernel[T], p ConvParams, x, y, dy, dw, db []T) {
	K, P := p.reduction(), p.pixels()
	mr, nr := mk.mr, mk.nr
	mPad := roundUp(p.Cout, mr)
	nqb, qc := depthBlocks(P)
	ySize, xSize := p.Cout*P, p.Cin*p.H*p.W
	if !p.ReLU {
		y = nil
	}

	// Jobs own blocks of columns of dw (reduction rows kk) and accumulate
	// over all images and pixels into their own part of one C buffer, so the
	// sum of each element runs in the same order whatever the blocking.
	workers := runtime.GOMAXPROCS(0)
	nc := max(nr, min(roundUp(ceilDiv(K, 4*workers), nr), colBlock))
	jobs := ceilDiv(K, nc)
	ldc := jobs * nc
	cp := getBuf[T](mPad * ldc)
	defer putBuf(cp)
	c := *cp

	// The B operand, col(x)^T, is packed pixel by pixel into rows of NR
	// reduction columns. In im2col's column order (ci, kh, kw) each such row
	// gathers NR scattered inputs, written NR elements apart. With enough
	// channels and taps it pays to transpose each image once to channels-last
	// (H x padded W x Cin) and order the columns (kh, kw, ci): a row of a
	// panel is then a run of consecutive channels, one copy.
	channelsLast := p.useChannelsLast()
	var xt []T
	if channelsLast {
		tp := getBuf[T](p.H * (p.W + 2*p.PadW) * p.Cin)
		defer putBuf(tp)
		xt = *tp
	}

	// dy'[n] is the A operand of every job of image n: pack it once per
	// image, masking it on the way; the bias gradient is summed from the
	// same reads, per depth block, then over blocks and images in order.
	ap := getBuf[T](mPad * P)
	defer putBuf(ap)
	a := *ap
	var partial []T
	if db != nil {
		partial = make([]T, p.N*nqb*p.Cout)
	}
	for n := range p.N {
		dyn := dy[n*ySize : (n+1)*ySize]
		var yn []T
		if y != nil {
			yn = y[n*ySize : (n+1)*ySize]
		}
		parallelFor(nqb, 1, func(lo, hi int) {
			tp := getBuf[T](qc)
			defer putBuf(tp)
			for qb := lo; qb < hi; qb++ {
				q0, q1 := qb*qc, min((qb+1)*qc, P)
				var sums []T
				if partial != nil {
					sums = partial[(n*nqb+qb)*p.Cout : (n*nqb+qb+1)*p.Cout]
				}
				packGradRows(a[q0*mPad:q1*mPad], dyn, yn, sums, *tp, P, q0, q1, p.Cout, mr)
			}
		})
		xn := x[n*xSize : (n+1)*xSize]
		if channelsLast {
			transposeImage(xt, xn, &p)
		}
		parallelFor(jobs, 1, func(lo, hi int) {
			bp := getBuf[T](qc * nc)
			defer putBuf(bp)
			b := *bp
			var scratch im2colScratch
			for job := lo; job < hi; job++ {
				j0, j1 := job*nc, min((job+1)*nc, K)
				nPad := roundUp(j1-j0, nr)
				for qb := range nqb {
					q0, q1 := qb*qc, min((qb+1)*qc, P)
					if channelsLast {
						packChannelsLast(b, xt, &p, q0, q1, j0, j1, nr, &scratch)
					} else {
						packIm2colT(b, xn, &p, q0, q1, j0, j1, nr, &scratch)
					}
					macroKernel(&mk, q1-q0, a[q0*mPad:q1*mPad], b, mPad, nPad, c[j0:], ldc, n > 0 || qb > 0)
				}
			}
		})
	}
	if channelsLast {
		// Columns are (kh, kw, ci); dw's are (ci, kh, kw).
		KK := p.KH * p.KW
		for co := range p.Cout {
			src, dst := c[co*ldc:co*ldc+K], dw[co*K:(co+1)*K]
			for tap := range KK {
				for ci, v := range src[tap*p.Cin : (tap+1)*p.Cin] {
					dst[ci*KK+tap] = v
				}
			}
		}
	} else {
		for co := range p.Cout {
			copy(dw[co*K:(co+1)*K], c[co*ldc:co*ldc+K])
		}
	}
	if db != nil {
		for co := range p.Cout {
			var s T
			for i := range p.N * nqb {
				s += partial[i*p.Cout+co]
			}
			db[co] = s
		}
	}
}

// channelsLastMin is the fewest input channels for which wgrad packs from
// a channels-last copy of x: below it the runs of channels are too short for
// a copy to beat gathering element by element.
const channelsLastMin = 16

// useChannelsLast decides how wgrad packs col(x)^T. Measured on AVX-512
// hardware, float32: gathering costs about 0.75 ns per packed element;
// copying runs of channels about 0.15 ns, after a transpose of the image at
// about 1.3 ns per input element. Every input pixel is packed once per tap
// that meets it, KH*KW*OutH*OutW/(H*W) times on average, so the transpose
// pays off from about three taps per pixel: 3x3 convolutions of stride 1,
// not 1x1 ones.
func (p *ConvParams) useChannelsLast() bool {
	return p.Cin >= channelsLastMin && p.KH*p.KW*p.pixels() >= 3*p.H*p.W
}

// transposeImage writes image xn (Cin x H x W) into xt as H rows of W+2*PadW
// pixels of Cin channels, the padding columns zero. It goes tile by tile so
// that the writes, Cin elements apart, land in lines still in L1.
func transposeImage[T Float](xt, xn []T, p *ConvParams) {
	const tile = 32
	wp, plane := p.W+2*p.PadW, p.H*p.W
	parallelFor(p.H, 8, func(lo, hi int) {
		for ih := lo; ih < hi; ih++ {
			row := xt[ih*wp*p.Cin : (ih+1)*wp*p.Cin]
			clear(row[:p.PadW*p.Cin])
			clear(row[(p.PadW+p.W)*p.Cin:])
			for ci0 := 0; ci0 < p.Cin; ci0 += tile {
				for iw0 := 0; iw0 < p.W; iw0 += tile {
					wn := min(tile, p.W-iw0)
					for ci := ci0; ci < min(ci0+tile, p.Cin); ci++ {
						src := xn[ci*plane+ih*p.W+iw0 : ci*plane+ih*p.W+iw0+wn]
						dst := row[(p.PadW+iw0)*p.Cin+ci:]
						for iw, v := range src {
							dst[iw*p.Cin] = v
						}
					}
				}
			}
		}
	})
}

// chanRun is a run of reduction columns (kh, kw, ci..ci+n-1) of one tap,
// at offset off of a panel row.
type chanRun struct{ off, n, ci, dh, dwp int }

// packChannelsLast packs the transpose of col(x) for pixels [q0,q1) and
// reduction columns [j0,j1) in (kh, kw, ci) order, from xt as
// transposeImage writes it, into B panels of nr columns.
func packChannelsLast[T Float](dst, xt []T, p *ConvParams, q0, q1, j0, j1, nr int, s *im2colScratch) {
	kc := q1 - q0
	wp := p.W + 2*p.PadW
	s.runs = p.pixelRuns(q0, q1, s.runs)
	for c0 := j0; c0 < j1; c0 += nr {
		panel := dst[(c0-j0)*kc : (c0-j0+nr)*kc]
		cEnd := min(c0+nr, j1)
		s.chans = s.chans[:0]
		for c := c0; c < cEnd; {
			tap, ci := c/p.Cin, c%p.Cin
			n := min(p.Cin-ci, cEnd-c)
			kh, kw := tap/p.KW, tap%p.KW
			// In padded coordinates the column of output pixel ow is
			// ow*StrideW + kw*DilationW.
			s.chans = append(s.chans, chanRun{off: c - c0, n: n, ci: ci, dh: kh*p.DilationH - p.PadH, dwp: kw * p.DilationW})
			c += n
		}
		width := cEnd - c0
		for _, r := range s.runs {
			for i := range r.n {
				d := panel[(r.j+i)*nr : (r.j+i+1)*nr]
				col := (r.ow + i) * p.StrideW
				for _, ch := range s.chans {
					seg := d[ch.off : ch.off+ch.n]
					ih := r.oh*p.StrideH + ch.dh
					if ih < 0 || ih >= p.H {
						clear(seg)
						continue
					}
					at := (ih*wp+col+ch.dwp)*p.Cin + ch.ci
					copy(seg, xt[at:at+ch.n])
				}
				clear(d[width:])
			}
		}
	}
}

// packGradRows packs pixels [q0,q1) of the rows of dy (rows x P, masked by
// y > 0 when y is non-nil) into A panels of mr rows, and when sums is
// non-nil stores each row's sum over those pixels in it. tmp holds q1-q0
// elements.
func packGradRows[T Float](dst, dy, y, sums, tmp []T, P, q0, q1, rows, mr int) {
	kc := q1 - q0
	tmp = tmp[:kc]
	for r0 := 0; r0 < rows; r0 += mr {
		panel := dst[r0*kc : (r0+mr)*kc]
		n := min(mr, rows-r0)
		if n < mr {
			clear(panel)
		}
		for r := range n {
			src := dy[(r0+r)*P+q0 : (r0+r)*P+q1]
			if y != nil {
				gate(tmp, src, y[(r0+r)*P+q0:(r0+r)*P+q1])
				src = tmp
			}
			for q, v := range src {
				panel[q*mr+r] = v
			}
			if sums != nil {
				sums[r0+r] = sum(src)
			}
		}
	}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
