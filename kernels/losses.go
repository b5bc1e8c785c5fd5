package kernels

import (
	"fmt"
	"math"
)

// LossKind is one of the losses of kernels/losses.cu, in the order of its
// Kind enum.
type LossKind int

const (
	LossBCE      LossKind = iota // binary_cross_entropy_with_logits
	LossSmoothL1                 // smooth_l1_loss
	LossL1                       // l1_loss
	LossFocal                    // torchvision's sigmoid_focal_loss
	LossCE                       // cross_entropy over rows of logits
	LossGIoU                     // torchvision's generalized_box_iou_loss
)

// LossParams describes a weighted loss sum over N items: elements, or rows
// of C logits (LossCE) or of 4 box coordinates (LossGIoU). Beta is
// SmoothL1's; Alpha (< 0: no weighting) and Gamma are Focal's.
type LossParams struct {
	Kind               LossKind
	N, C               int
	Beta, Alpha, Gamma float64
}

// LossForward returns sum_i w[i] * term_i(x, t), reduction="sum" with a
// weight per item, as losses.cu's forward kernels: each term in T (see
// losses.cu for the terms), the weighted terms summed in float64. Items of
// weight 0 are skipped (their x and t may hold anything). For LossCE, t
// holds class labels; one that is not an integer in [0, C) is an error,
// whatever its weight. A NaN weight is an error.
func LossForward[T Float](p LossParams, x, t, w []T) (float64, error) {
	var sum float64
	for i := range p.N {
		if w[i] != w[i] {
			return 0, fmt.Errorf("weight %d is NaN", i)
		}
		if p.Kind == LossCE {
			if _, err := classOf(t[i], p.C); err != nil {
				return 0, fmt.Errorf("row %d: %w", i, err)
			}
		}
		if w[i] == 0 {
			continue
		}
		sum += float64(w[i]) * float64(lossTerm(p, x, t, i))
	}
	return sum, nil
}

// LossBackward writes dx = g * w * dterm/dx item by item, as losses.cu's
// backward kernels; 0 for items of weight 0. Errors as LossForward's.
func LossBackward[T Float](p LossParams, x, t, w []T, g T, dx []T) error {
	for i := range p.N {
		wi := w[i]
		if wi != wi {
			return fmt.Errorf("weight %d is NaN", i)
		}
		switch p.Kind {
		case LossCE:
			row, drow := x[i*p.C:(i+1)*p.C], dx[i*p.C:(i+1)*p.C]
			k, err := classOf(t[i], p.C)
			if err != nil {
				return fmt.Errorf("row %d: %w", i, err)
			}
			if wi == 0 {
				clear(drow)
				continue
			}
			lse, scale := rowLSE(row), g*wi
			for j, v := range row {
				pj := expOf(v - lse)
				if j == k {
					pj--
				}
				drow[j] = scale * pj
			}
		case LossGIoU:
			d := dx[4*i : 4*i+4]
			if wi == 0 {
				clear(d)
				continue
			}
			giouGrad(x[4*i:4*i+4], t[4*i:4*i+4], g*wi, d)
		default:
			if wi == 0 {
				dx[i] = 0
				continue
			}
			dx[i] = g * wi * elementGrad(p, x[i], t[i])
		}
	}
	return nil
}

// lossTerm is the term of item i (losses.cu's term_of).
func lossTerm[T Float](p LossParams, x, t []T, i int) T {
	switch p.Kind {
	case LossBCE:
		return bceTerm(x[i], t[i])
	case LossSmoothL1:
		d, beta := absOf(x[i]-t[i]), T(p.Beta)
		if d < beta {
			return 0.5 * d * d / beta
		}
		return d - 0.5*beta
	case LossL1:
		return absOf(x[i] - t[i])
	case LossFocal:
		v, tv := x[i], t[i]
		pr := sigmoidOf(v)
		pt := pr*tv + (1-pr)*(1-tv)
		l := bceTerm(v, tv) * powOf(1-pt, T(p.Gamma))
		if p.Alpha >= 0 {
			l *= alphaT(tv, T(p.Alpha))
		}
		return l
	case LossCE:
		row := x[i*p.C : (i+1)*p.C]
		k, _ := classOf(t[i], p.C)
		return rowLSE(row) - row[k]
	case LossGIoU:
		return giouOf(x[4*i:4*i+4], t[4*i:4*i+4]).loss
	}
	panic(fmt.Sprintf("kernels: loss kind %d", p.Kind))
}

// elementGrad is dterm/dx of an elementwise loss (losses.cu's loss_bwd).
func elementGrad[T Float](p LossParams, v, tv T) T {
	switch p.Kind {
	case LossBCE:
		return sigmoidOf(v) - tv
	case LossSmoothL1:
		d, beta := v-tv, T(p.Beta)
		if absOf(d) < beta {
			return d / beta
		}
		return signOf(d)
	case LossL1:
		return signOf(v - tv)
	case LossFocal:
		pr, gamma := sigmoidOf(v), T(p.Gamma)
		m := 1 - (pr*tv + (1-pr)*(1-tv))
		// PyTorch's pow backward is 0 for gamma = 0.
		var dpow T
		if gamma != 0 {
			dpow = gamma * powOf(m, gamma-1)
		}
		// Back through p_t = p*t + (1-p)*(1-t) and p = sigmoid(x) in
		// PyTorch's steps, so that an infinite dpow (0 < gamma < 1, p_t
		// rounded to 1) gives its NaN, not a signed infinity.
		gpt := -(bceTerm(v, tv) * dpow)
		gp := gpt*tv - gpt*(1-tv)
		gd := (pr-tv)*powOf(m, gamma) + gp*((1-pr)*pr)
		if p.Alpha >= 0 {
			gd *= alphaT(tv, T(p.Alpha))
		}
		return gd
	}
	panic(fmt.Sprintf("kernels: loss kind %d is not elementwise", p.Kind))
}

// bceTerm is max(x,0) - x*t + log1p(exp(-|x|)): no exp overflows, and
// log1p keeps exp(-|x|) when it is tiny.
func bceTerm[T Float](x, t T) T {
	return max(x, 0) - x*t + log1pOf(expOf(-absOf(x)))
}

func sigmoidOf[T Float](x T) T { return 1 / (1 + expOf(-x)) }

// alphaT is torchvision's alpha_t: alpha for positives, 1 - alpha for
// negatives.
func alphaT[T Float](t, alpha T) T { return alpha*t + (1-alpha)*(1-t) }

// classOf converts a label stored as a float into a class index in [0, c).
// NaN fails the range test.
func classOf[T Float](v T, c int) (int, error) {
	f := float64(v)
	if !(f >= 0 && f < float64(c)) || f != math.Trunc(f) {
		return 0, fmt.Errorf("label %v is not a class index in [0, %d)", f, c)
	}
	return int(f), nil
}

// rowLSE is log(sum(exp(row))), shifted by the row's max so that no
// exponential overflows; a NaN makes it NaN.
func rowLSE[T Float](row []T) T {
	m := T(math.Inf(-1))
	for _, v := range row {
		m = nanMax(m, v)
	}
	if math.IsInf(float64(m), 0) {
		return m // all -inf: the sum is 0; +inf: it is +inf
	}
	var s T
	for _, v := range row {
		s += expOf(v - m)
	}
	return m + logOf(s)
}

func absOf[T Float](v T) T { return T(math.Abs(float64(v))) }

// signOf is torch.sign: 0 at 0 (and for NaN, which takes no branch).
func signOf[T Float](v T) T {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}

func log1pOf[T Float](v T) T  { return T(math.Log1p(float64(v))) }
func powOf[T Float](a, b T) T { return T(math.Pow(float64(a), float64(b))) }

// tmax and tmin are torch.maximum and torch.minimum: a NaN of either wins.
func tmax[T Float](a, b T) T {
	if a > b || a != a {
		return a
	}
	return b
}

func tmin[T Float](a, b T) T {
	if a < b || a != a {
		return a
	}
	return b
}

// maxShare and minShare are the share of the gradient of
// torch.maximum(a, b) (torch.minimum) that goes to a: all of it where a
// wins, half on a tie, as PyTorch splits it.
func maxShare[T Float](a, b T) T {
	switch {
	case a == b:
		return 0.5
	case a < b:
		return 0
	}
	return 1
}

func minShare[T Float](a, b T) T {
	switch {
	case a == b:
		return 0.5
	case a > b:
		return 0
	}
	return 1
}

// giou holds the steps of GIoU of a box against another, torchvision's.
type giou[T Float] struct {
	xk1, yk1, xk2, yk2 T // intersection corners
	overlap            bool
	inter, uni, iou    T
	xc1, yc1, xc2, yc2 T // enclosing box
	areaC, loss        T
}

// giouEps is torchvision's generalized_box_iou_loss's eps.
const giouEps = 1e-7

// giouOf computes 1 - GIoU(a, b) of boxes (x1, y1, x2, y2) every step as
// torchvision does: no check of the boxes' order, eps added to the union
// and to the enclosing area.
func giouOf[T Float](a, b []T) giou[T] {
	eps := T(giouEps)
	var g giou[T]
	g.xk1, g.yk1 = tmax(a[0], b[0]), tmax(a[1], b[1])
	g.xk2, g.yk2 = tmin(a[2], b[2]), tmin(a[3], b[3])
	g.overlap = g.yk2 > g.yk1 && g.xk2 > g.xk1
	if g.overlap {
		g.inter = (g.xk2 - g.xk1) * (g.yk2 - g.yk1)
	}
	g.uni = (a[2]-a[0])*(a[3]-a[1]) + (b[2]-b[0])*(b[3]-b[1]) - g.inter
	g.iou = g.inter / (g.uni + eps)
	g.xc1, g.yc1 = tmin(a[0], b[0]), tmin(a[1], b[1])
	g.xc2, g.yc2 = tmax(a[2], b[2]), tmax(a[3], b[3])
	g.areaC = (g.xc2 - g.xc1) * (g.yc2 - g.yc1)
	g.loss = 1 - (g.iou - (g.areaC-g.uni)/(g.areaC+eps))
	return g
}

// giouGrad writes the gradient of gl*(1 - GIoU(a, b)) with respect to a:
// PyTorch's autograd of torchvision's steps, one by one.
func giouGrad[T Float](a, b []T, gl T, dx []T) {
	eps := T(giouEps)
	g := giouOf(a, b)
	// loss = 1 - (iou - q), q = (areaC - uni) / (areaC + eps)
	gIoU, gQ := -gl, gl
	denC := g.areaC + eps
	gNum := gQ / denC
	gAreaC := gNum - gQ*((g.areaC-g.uni)/denC)/denC
	gUni := -gNum
	// iou = inter / (uni + eps)
	denU := g.uni + eps
	gInter := gIoU / denU
	gUni -= gIoU * ((g.inter / denU) / denU)
	// uni = area_a + area_b - inter
	gInter -= gUni
	d0, d2 := -gUni*(a[3]-a[1]), gUni*(a[3]-a[1])
	d1, d3 := -gUni*(a[2]-a[0]), gUni*(a[2]-a[0])
	if g.overlap {
		gIW, gIH := gInter*(g.yk2-g.yk1), gInter*(g.xk2-g.xk1)
		d0 -= gIW * maxShare(a[0], b[0])
		d2 += gIW * minShare(a[2], b[2])
		d1 -= gIH * maxShare(a[1], b[1])
		d3 += gIH * minShare(a[3], b[3])
	}
	gCW, gCH := gAreaC*(g.yc2-g.yc1), gAreaC*(g.xc2-g.xc1)
	d0 -= gCW * minShare(a[0], b[0])
	d2 += gCW * maxShare(a[2], b[2])
	d1 -= gCH * minShare(a[1], b[1])
	d3 += gCH * maxShare(a[3], b[3])
	dx[0], dx[1], dx[2], dx[3] = d0, d1, d2, d3
}
