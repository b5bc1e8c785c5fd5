package ops

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
	"github.com/stheno-ml/stheno/kernels/cuda"
)

// AttentionWeights are the parameters of a multi-head attention layer,
// shaped as torch.nn.MultiheadAttention's (kdim = vdim = E): the packed
// input projections of the query, the key and the value, InProjWeight
// [3E, E] and InProjBias [3E] (nil: none), and the output projection,
// OutProjWeight [E, E] and OutProjBias [E] (nil: none).
type AttentionWeights struct {
	InProjWeight, InProjBias   *G.Node
	OutProjWeight, OutProjBias *G.Node
}

// AttentionConfig configures MultiHeadAttention.
type AttentionConfig struct {
	// NumHeads splits E into heads of E/NumHeads features.
	NumHeads int
	// BatchFirst: query, key, value and the output are [N, L, E] rather
	// than PyTorch's default [L, N, E].
	BatchFirst bool
	// NeedWeights asks for the attention weights averaged over the heads,
	// [N, L, S], as need_weights=True (average_attn_weights=True).
	NeedWeights bool
}

// MultiHeadAttention is torch.nn.MultiheadAttention's forward with dropout
// 0 (there is no dropout): query [L, N, E], key and value [S, N, E] ([N,
// L, E] and [N, S, E] with BatchFirst) give
//
//	out = concat over heads of softmax(q_h·k_hᵀ/sqrt(d) + mask)·v_h, then out_proj
//
// with q, k and v the input projections (Linear with the thirds of
// InProjWeight and InProjBias) split into NumHeads heads of d = E/NumHeads.
// keyPaddingMask, if not nil, is [N, S] of x's dtype and is added to every
// query's scores: 0 keeps a key, -inf ignores it (torch's bool mask, true
// to ignore, becomes this through KeyPaddingMask). A query whose keys are
// all ignored gets NaN, as in PyTorch. query, key and value may be the same
// node (self-attention) or not (cross-attention).
//
// It is a composition of graph nodes: Linear, Reshape and Permute (the
// heads' layout, as PyTorch's [N*H, L, d]), BatchedMatMul for the scores
// and for the weighted sum, Softmax, and one op of this file that scales
// the scores by 1/sqrt(d) and adds the mask in one pass (attention.cu's
// scale_mask; PyTorch scales q before the product instead, which rounds
// alike to float32's precision). Everything runs on the GPU when the inputs
// are there, and the gradients are those of the parts. weights is nil
// unless cfg.NeedWeights.
func MultiHeadAttention(query, key, value *G.Node, w AttentionWeights, keyPaddingMask *G.Node, cfg AttentionConfig) (out, weights *G.Node, err error) {
	s, err := attentionShapeOf(query, key, value, w, keyPaddingMask, cfg)
	if err != nil {
		return nil, nil, err
	}
	e, h, d := s.e, s.h, s.e/s.h
	third := func(x *G.Node, i int) (*G.Node, error) {
		if x == nil {
			return nil, nil
		}
		return Slice(x, 0, i*e, (i+1)*e)
	}
	// heads projects x ([T, N, E] or [N, T, E]) with the i-th third of the
	// input projection and lays it out as [N*H, T, d].
	heads := func(x *G.Node, i, t int) (*G.Node, error) {
		wi, err := third(w.InProjWeight, i)
		if err != nil {
			return nil, err
		}
		bi, err := third(w.InProjBias, i)
		if err != nil {
			return nil, err
		}
		p, err := Linear(x, wi, bi)
		if err != nil {
			return nil, err
		}
		if s.batchFirst {
			if p, err = Reshape(p, s.n, t, h, d); err != nil {
				return nil, err
			}
			if p, err = Permute(p, 0, 2, 1, 3); err != nil {
				return nil, err
			}
			return Reshape(p, s.n*h, t, d)
		}
		if p, err = Reshape(p, t, s.n*h, d); err != nil {
			return nil, err
		}
		return Permute(p, 1, 0, 2)
	}
	q, err := heads(query, 0, s.l)
	if err != nil {
		return nil, nil, s.wrap(err)
	}
	k, err := heads(key, 1, s.s)
	if err != nil {
		return nil, nil, s.wrap(err)
	}
	v, err := heads(value, 2, s.s)
	if err != nil {
		return nil, nil, s.wrap(err)
	}
	scores, err := BatchedMatMul(q, k, false, true) // [N*H, L, S]
	if err != nil {
		return nil, nil, s.wrap(err)
	}
	sm := scaleMaskShape{p: kernels.AttentionParams{N: s.n, H: h, L: s.l, S: s.s, Scale: 1 / math.Sqrt(float64(d))}, mask: keyPaddingMask != nil, dt: s.dt}
	if keyPaddingMask != nil {
		scores, err = G.ApplyOp(scaleMaskOp(sm), scores, keyPaddingMask)
	} else {
		scores, err = G.ApplyOp(scaleMaskOp(sm), scores)
	}
	if err != nil {
		return nil, nil, s.wrap(err)
	}
	probs, err := Softmax(scores, -1)
	if err != nil {
		return nil, nil, s.wrap(err)
	}
	o, err := BatchedMatMul(probs, v, false, false) // [N*H, L, d]
	if err != nil {
		return nil, nil, s.wrap(err)
	}
	if s.batchFirst {
		if o, err = Reshape(o, s.n, h, s.l, d); err == nil {
			if o, err = Permute(o, 0, 2, 1, 3); err == nil {
				o, err = Reshape(o, s.n, s.l, e)
			}
		}
	} else {
		if o, err = Permute(o, 1, 0, 2); err == nil {
			o, err = Reshape(o, s.l, s.n, e)
		}
	}
	if err != nil {
		return nil, nil, s.wrap(err)
	}
	if out, err = Linear(o, w.OutProjWeight, w.OutProjBias); err != nil {
		return nil, nil, s.wrap(err)
	}
	if cfg.NeedWeights {
		if weights, err = G.ApplyOp(headMeanOp(sm), probs); err != nil {
			return nil, nil, s.wrap(err)
		}
	}
	return out, weights, nil
}

// KeyPaddingMask turns torch's bool key_padding_mask [N, S] (true: ignore
// the key) into MultiHeadAttention's additive mask of dtype dt: -inf where
// ignore is true, 0 elsewhere. ignore holds N*S values, row by row.
func KeyPaddingMask(ignore []bool, n, s int, dt tensor.Dtype) (*tensor.Dense, error) {
	if n <= 0 || s <= 0 || len(ignore) != n*s {
		return nil, fmt.Errorf("ops: KeyPaddingMask: %d values for a mask of [%d %d]", len(ignore), n, s)
	}
	v := make([]float64, n*s)
	for i, ig := range ignore {
		if ig {
			v[i] = math.Inf(-1)
		}
	}
	switch dt {
	case tensor.Float64:
		return tensor.New(tensor.WithShape(n, s), tensor.WithBacking(v)), nil
	case tensor.Float32:
		f := make([]float32, len(v))
		for i, x := range v {
			f[i] = float32(x)
		}
		return tensor.New(tensor.WithShape(n, s), tensor.WithBacking(f)), nil
	}
	return nil, fmt.Errorf("ops: KeyPaddingMask: dtype %v: want float32 or float64", dt)
}

// attentionShape is MultiHeadAttention's geometry.
type attentionShape struct {
	l, s, n, e, h int
	batchFirst    bool
	dt            tensor.Dtype
}

func (s attentionShape) wrap(err error) error {
	return fmt.Errorf("ops: MultiHeadAttention: %w", err)
}

func attentionShapeOf(query, key, value *G.Node, w AttentionWeights, mask *G.Node, cfg AttentionConfig) (attentionShape, error) {
	const op = "MultiHeadAttention"
	var none attentionShape
	layout := "[L N E]"
	kvLayout := "[S N E]"
	if cfg.BatchFirst {
		layout, kvLayout = "[N L E] (BatchFirst)", "[N S E] (BatchFirst)"
	}
	if err := checkRank(op, "query", query, 3, layout); err != nil {
		return none, err
	}
	if err := checkRank(op, "key", key, 3, kvLayout); err != nil {
		return none, err
	}
	if err := checkRank(op, "value", value, 3, kvLayout); err != nil {
		return none, err
	}
	dt, err := floatDtype(op, "query", query)
	if err != nil {
		return none, err
	}
	args := map[string]*G.Node{"key": key, "value": value}
	for name, n := range map[string]*G.Node{"InProjWeight": w.InProjWeight, "OutProjWeight": w.OutProjWeight, "InProjBias": w.InProjBias, "OutProjBias": w.OutProjBias, "keyPaddingMask": mask} {
		if n != nil {
			args[name] = n
		}
	}
	if err := sameDtype(op, dt, args); err != nil {
		return none, err
	}
	qs, ks, vs := query.Shape(), key.Shape(), value.Shape()
	for name, sh := range map[string]tensor.Shape{"query": qs, "key": ks, "value": vs} {
		if err := positiveSizes(op, name, sh); err != nil {
			return none, err
		}
	}
	s := attentionShape{batchFirst: cfg.BatchFirst, dt: dt, e: qs[2], h: cfg.NumHeads}
	if cfg.BatchFirst {
		s.n, s.l, s.s = qs[0], qs[1], ks[1]
	} else {
		s.l, s.n, s.s = qs[0], qs[1], ks[0]
	}
	if s.h <= 0 || s.e%s.h != 0 {
		return none, fmt.Errorf("ops: %s: NumHeads %d must be positive and divide E = %d", op, s.h, s.e)
	}
	if !ks.Eq(vs) {
		return none, fmt.Errorf("ops: %s: key %v and value %v must have one shape %s", op, ks, vs, kvLayout)
	}
	nk, ek := ks[1], ks[2]
	if cfg.BatchFirst {
		nk = ks[0]
	}
	if nk != s.n || ek != s.e {
		return none, fmt.Errorf("ops: %s: key %v must be %s with query %v's N = %d and E = %d (kdim = vdim = E)", op, ks, kvLayout, qs, s.n, s.e)
	}
	e := s.e
	for _, c := range []struct {
		name  string
		n     *G.Node
		want  tensor.Shape
		maybe bool
	}{
		{"InProjWeight", w.InProjWeight, tensor.Shape{3 * e, e}, false},
		{"InProjBias", w.InProjBias, tensor.Shape{3 * e}, true},
		{"OutProjWeight", w.OutProjWeight, tensor.Shape{e, e}, false},
		{"OutProjBias", w.OutProjBias, tensor.Shape{e}, true},
		{"keyPaddingMask", mask, tensor.Shape{s.n, s.s}, true},
	} {
		if c.n == nil {
			if !c.maybe {
				return none, fmt.Errorf("ops: %s: %s is nil, want shape %v", op, c.name, c.want)
			}
			continue
		}
		if !c.n.Shape().Eq(c.want) {
			return none, fmt.Errorf("ops: %s: %s must have shape %v, got %v", op, c.name, c.want, c.n.Shape())
		}
	}
	return s, nil
}

// scaleMaskShape is the scores' scale and mask step: scores [N*H, L, S],
// mask [N, S] if any.
type scaleMaskShape struct {
	p    kernels.AttentionParams
	mask bool
	dt   tensor.Dtype
}

func (s scaleMaskShape) String() string {
	return fmt.Sprintf("n=%d,h=%d,l=%d,s=%d,scale=%v,mask=%t,%v", s.p.N, s.p.H, s.p.L, s.p.S, s.p.Scale, s.mask, s.dt)
}

func (s scaleMaskShape) scores() tensor.Shape { return tensor.Shape{s.p.N * s.p.H, s.p.L, s.p.S} }

// scaleMaskOp is y = scale*x + mask. Differentiable with respect to x:
// scale*dy, the same op without a mask (its own gradient, so it is
// differentiable again).
func scaleMaskOp(s scaleMaskShape) *specOp {
	inputs := []argSpec{{name: "scores", shape: s.scores()}}
	diff := []bool{true}
	if s.mask {
		inputs = append(inputs, argSpec{name: "keyPaddingMask", shape: tensor.Shape{s.p.N, s.p.S}})
		diff = append(diff, false)
	}
	return newOp(&opSpec{
		name: "MultiHeadAttention scale and mask", config: s.String(),
		inputs: inputs, out: s.scores(), dtype: s.dt,
		cpu:     floatTwin(s, scaleMask[float32], scaleMask[float64]),
		device:  s.device,
		diffWRT: diff,
		grad: func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			plain := s
			plain.mask = false
			dx, err := G.ApplyOp(scaleMaskOp(plain), grad)
			if err != nil {
				return nil, fmt.Errorf("ops: MultiHeadAttention scale backward: %w", err)
			}
			if s.mask {
				return G.Nodes{dx, nil}, nil
			}
			return G.Nodes{dx}, nil
		},
	})
}

func scaleMask[T kernels.Float](s scaleMaskShape, in [][]T, y []T) error {
	kernels.AttentionScaleMask(s.p, in[0], optional(in, 1), y)
	return nil
}

// headMeanOp averages the attention weights [N*H, L, S] over the heads:
// [N, L, S].
func headMeanOp(s scaleMaskShape) *specOp {
	return newOp(&opSpec{
		name: "MultiHeadAttention head mean", config: s.String(),
		inputs: []argSpec{{name: "weights", shape: s.scores()}}, out: tensor.Shape{s.p.N, s.p.L, s.p.S}, dtype: s.dt,
		cpu: floatTwin(s,
			func(s scaleMaskShape, in [][]float32, y []float32) error {
				kernels.AttentionHeadMean(s.p, in[0], y)
				return nil
			},
			func(s scaleMaskShape, in [][]float64, y []float64) error {
				kernels.AttentionHeadMean(s.p, in[0], y)
				return nil
			}),
		device:  func(a *deviceArgs) (*tensor.Dense, error) { return s.headMeanDevice(a, false) },
		diffWRT: []bool{true},
		grad: func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			dx, err := G.ApplyOp(headMeanGradOp(s), grad)
			if err != nil {
				return nil, fmt.Errorf("ops: MultiHeadAttention head mean backward: %w", err)
			}
			return G.Nodes{dx}, nil
		},
	})
}

// headMeanGradOp spreads the gradient of the mean over the heads: dy/H.
func headMeanGradOp(s scaleMaskShape) *specOp {
	return newOp(&opSpec{
		name: "MultiHeadAttention head mean backward", config: s.String(),
		inputs: []argSpec{{name: "grad", shape: tensor.Shape{s.p.N, s.p.L, s.p.S}}}, out: s.scores(), dtype: s.dt,
		cpu: floatTwin(s,
			func(s scaleMaskShape, in [][]float32, dx []float32) error {
				kernels.AttentionHeadMeanBackward(s.p, in[0], dx)
				return nil
			},
			func(s scaleMaskShape, in [][]float64, dx []float64) error {
				kernels.AttentionHeadMeanBackward(s.p, in[0], dx)
				return nil
			}),
		device:  func(a *deviceArgs) (*tensor.Dense, error) { return s.headMeanDevice(a, true) },
		diffWRT: []bool{true},
		grad: func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			d, err := G.ApplyOp(headMeanOp(s), grad)
			if err != nil {
				return nil, fmt.Errorf("ops: MultiHeadAttention head mean backward's gradient: %w", err)
			}
			return G.Nodes{d}, nil
		},
	})
}

// attentionLaunch is a grid-striding launch over total elements.
func attentionLaunch(total int) backend.LaunchConfig {
	return backend.LaunchConfig{
		Grid:  backend.Dim3{X: uint32(max(1, min(ceilDiv(total, cuda.AttentionThreads), 1<<16))), Y: 1, Z: 1},
		Block: backend.Dim3{X: cuda.AttentionThreads, Y: 1, Z: 1},
	}
}

// device is scaleMaskOp's device launcher.
func (s scaleMaskShape) device(a *deviceArgs) (*tensor.Dense, error) {
	const op = "MultiHeadAttention scale and mask"
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	total := s.scores().TotalSize()
	args := cuda.ScaleMaskParams{
		X: a.ptr[0], Out: outPtr, Total: int64(total), Ls: int64(s.p.L * s.p.S), S: int64(s.p.S), Heads: int64(s.p.H), Scale: s.p.Scale,
	}
	if s.mask {
		args.Mask = a.ptr[1]
	}
	k, err := cuda.AttentionScaleMask(s.dt)
	if err == nil {
		err = k.Launch(a.dev, attentionLaunch(total), args)
	}
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", op, err)
	}
	return out, nil
}

// headMeanDevice is the device launcher of headMeanOp and (backward)
// headMeanGradOp.
func (s scaleMaskShape) headMeanDevice(a *deviceArgs, backward bool) (*tensor.Dense, error) {
	out, outPtr, err := a.output()
	if err != nil {
		return nil, err
	}
	total := out.Shape().TotalSize()
	args := cuda.HeadMeanParams{X: a.ptr[0], Out: outPtr, Total: int64(total), Ls: int64(s.p.L * s.p.S), Heads: int64(s.p.H)}
	pick := cuda.AttentionHeadMean
	if backward {
		pick = cuda.AttentionHeadMeanBwd
	}
	k, err := pick(s.dt)
	if err == nil {
		err = k.Launch(a.dev, attentionLaunch(total), args)
	}
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", a.spec.name, err)
	}
	return out, nil
}
