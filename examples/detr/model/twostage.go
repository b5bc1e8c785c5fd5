package model

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sync"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/examples/internal/hostop"
	"github.com/stheno-ml/stheno/ops"
)

// Two-stage Deformable DETR (Config.TwoStage) makes the decoder's queries
// from the encoder's output instead of learning them: every encoder token
// proposes a box (a box head on the token, relative to a fixed proposal
// centred on its pixel), the Queries tokens whose first class scores best
// are kept, and their boxes, detached, become the decoder's reference
// boxes and, through a sine embedding, a linear layer and LayerNorm, its
// queries and their positions. The encoder's proposals are trained as a
// class-agnostic detector: matched and lost like a decoder layer's
// predictions, with every object's class taken as 0.

// invalidProposalLogit stands for the reference's +inf: the inverse-sigmoid
// coordinates of a proposal too close to the image's border to be kept
// (a coordinate outside (0.01, 0.99)). Like +inf it saturates the sigmoid
// to exactly 1, in float32 and float64, whatever the box head adds, and its
// gradient to 0; unlike +inf it keeps a finite-difference gradient check
// finite.
const invalidProposalLogit = 1e4

// EncoderProposals is the reference's gen_encoder_output_proposals for a
// batch without padding: for each encoder token (pixel (i, j) of level l,
// in the token order) the box ((j+0.5)/W_l, (i+0.5)/H_l, 0.05*2^l,
// 0.05*2^l), as inverse-sigmoid coordinates [S, 4], and whether it is
// valid (every coordinate in (0.01, 0.99)). An invalid proposal's
// coordinates are invalidProposalLogit and its token is zeroed before the
// proposal heads, as the reference masks them.
func EncoderProposals(levels []ops.Level) (unact []float64, valid []bool) {
	for l, lv := range levels {
		wh := 0.05 * math.Exp2(float64(l))
		for i := range lv.H {
			for j := range lv.W {
				box := [4]float64{(float64(j) + 0.5) / float64(lv.W), (float64(i) + 0.5) / float64(lv.H), wh, wh}
				ok := true
				for _, v := range box {
					ok = ok && v > 0.01 && v < 0.99
				}
				for _, v := range box {
					if ok {
						unact = append(unact, math.Log(v/(1-v)))
					} else {
						unact = append(unact, invalidProposalLogit)
					}
				}
				valid = append(valid, ok)
			}
		}
	}
	return unact, valid
}

// ProposalPosEmbed is the reference's get_proposal_pos_embed: for boxes in
// inverse-sigmoid coordinates ([K, 4] row-major), the sine embedding of
// each coordinate c of each box, scaled to sigmoid(c)*2π, at feats
// frequencies (temperature 10000): [K, 4*feats], coordinate after
// coordinate, with
//
//	out[k*feats + 2m]   = sin(2π sigmoid(c_k) / 10000^(2m/feats))
//	out[k*feats + 2m+1] = cos(2π sigmoid(c_k) / 10000^(2m/feats))
//
// The reference fixes feats at 128 (a d_model of 256); the model uses
// DModel/2, which is that at 256 and gives 2*DModel features at any
// width. feats must be even.
func ProposalPosEmbed(unact []float64, feats int) []float64 {
	k := len(unact) / 4
	out := make([]float64, 0, k*4*feats)
	inv := make([]float64, feats/2)
	for m := range inv {
		inv[m] = math.Pow(10000, -2*float64(m)/float64(feats))
	}
	for _, c := range unact[:4*k] {
		x := sigmoid(c) * 2 * math.Pi
		for _, f := range inv {
			sin, cos := math.Sincos(x * f)
			out = append(out, sin, cos)
		}
	}
	return out
}

// TopProposals returns the indices of the k tokens of largest score,
// best first; among equal scores the lower index comes first (PyTorch's
// topk leaves their order open). k must not exceed len(scores).
func TopProposals(scores []float64, k int) []int { return topProposals(scores, k) }

func topProposals[F hostop.Float](scores []F, k int) []int {
	idx := make([]int, len(scores))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(scores[b], scores[a]) })
	return idx[:k]
}

// selectProposals is the top-k op's run: in holds the encoder's first
// class logit [B, S, 1] and its boxes' inverse-sigmoid coordinates [B,
// S, 4]; out gets, per image, the coordinates of the Queries best tokens
// [B, K, 4], then their ProposalPosEmbed [B, K, 2*DModel].
func selectProposals[F hostop.Float](cfg Config, batch int) hostRun[F] {
	s, k, d := cfg.Tokens(), cfg.Queries, cfg.DModel
	return func(in [][]F, out []F) error {
		scores, unact := in[0], in[1]
		for _, v := range scores {
			if v != v {
				return fmt.Errorf("the encoder's proposal scores hold NaN")
			}
		}
		coords, embed := out[:batch*k*4], out[batch*k*4:]
		var wg sync.WaitGroup
		for img := range batch {
			wg.Go(func() {
				top := topProposals(scores[img*s:(img+1)*s], k)
				c := coords[img*k*4 : (img+1)*k*4]
				for r, tok := range top {
					copy(c[4*r:4*r+4], unact[(img*s+tok)*4:])
				}
			})
		}
		wg.Wait()
		// The embedding, the op's larger part (a sine and a cosine per
		// pair of features of every box), in chunks of boxes over every
		// core.
		const chunk = 64
		for lo := 0; lo < batch*k; lo += chunk {
			hi := min(lo+chunk, batch*k)
			wg.Go(func() {
				c := make([]float64, 4*(hi-lo))
				for i := range c {
					c[i] = float64(coords[4*lo+i])
				}
				put(embed[lo*2*d:], ProposalPosEmbed(c, d/2))
			})
		}
		wg.Wait()
		return nil
	}
}

// twoStageQueries makes the decoder's queries from the encoder's memory
// [B, S, D], as the reference's two-stage branch: the memory of valid
// proposals through enc_output (Linear, LayerNorm), the proposal heads
// (the class and box heads after the decoder's, head DecLayers), the
// top-Queries selection by first-class logit (a host op; its output is
// detached), and pos_trans (Linear, LayerNorm) of the selected boxes'
// embedding, split into the query positions and the queries. It returns
// the queries [B, K, D], their positions [B, K, D], the reference boxes
// [B, K, 4] and the proposals' predictions (all tokens' logits and boxes),
// which the encoder's loss takes.
func (b *builder) twoStageQueries(memory *G.Node) (tgt, qpos, ref *G.Node, enc layerOutput) {
	if b.err != nil {
		return
	}
	cfg := b.cfg
	d, s, k := cfg.DModel, cfg.Tokens(), cfg.Queries
	unact, valid := EncoderProposals(b.levels())
	mask := make([]float64, s)
	for i, ok := range valid {
		if ok {
			mask[i] = 1
		}
	}
	out := b.check(ops.Mul(memory, b.constant("proposal_valid", mask, 1, s, 1)))
	out = b.linear(out, "enc_output", d, xavier(d, d), torchLinear(d), GroupTransformer)
	out = b.layerNorm(out, "enc_output_norm")
	enc.logits = b.classHead(out, cfg.DecLayers)
	coordsUnact := b.add(b.boxHead(out, cfg.DecLayers), b.constant("encoder_proposals", unact, 1, s, 4))
	enc.boxes = b.check(ops.Sigmoid(coordsUnact))
	if b.err != nil {
		return
	}

	shapes := []tensor.Shape{{b.batch, k, 4}, {b.batch, k, 2 * d}}
	var packed *G.Node
	if b.fixedProposals != nil {
		packed = b.constant("proposals", b.fixedProposals, autograd.PackedSize(shapes...))
	} else {
		scores := b.check(ops.Slice(enc.logits, 2, 0, 1))
		ins := G.Nodes{scores, coordsUnact}
		if b.dev != nil {
			for i, x := range ins {
				ins[i] = b.check(ops.ToHost(x))
			}
		}
		run64 := selectProposals[float64](cfg, b.batch)
		if record := b.recordProposals; record != nil {
			base := run64
			run64 = func(in [][]float64, out []float64) error {
				err := base(in, out)
				record(out)
				return err
			}
		}
		op := b.hostOps.op("two-stage top-k", "top-k proposals", []tensor.Shape{{b.batch, s, 1}, {b.batch, s, 4}},
			autograd.PackedSize(shapes...), selectProposals[float32](cfg, b.batch), run64)
		if b.err != nil {
			return
		}
		packed = b.check(G.ApplyOp(op, ins...))
		if b.dev != nil {
			packed = b.check(ops.ToDevice(packed, b.dev))
		}
	}
	if b.err != nil {
		return
	}
	parts, err := autograd.Unpack(packed, shapes...)
	if b.check(nil, err); b.err != nil {
		return
	}
	ref = b.check(ops.Sigmoid(parts[0]))
	pt := b.linear(parts[1], "pos_trans", 2*d, xavier(2*d, 2*d), torchLinear(2*d), GroupTransformer)
	pt = b.layerNorm(pt, "pos_trans_norm")
	if b.err != nil {
		return
	}
	qpos = b.check(ops.Slice(pt, 2, 0, d))
	tgt = b.check(ops.Slice(pt, 2, d, 2*d))
	return tgt, qpos, ref, enc
}

// proposalLosses are the encoder's proposals' focal, L1 and GIoU losses
// (the reference's *_enc losses, weighted as a layer's), from the
// matching op's parts for them: the focal weight WeightClass/num_boxes
// [1], the class-0 one-hot [B, S, 1], the box targets and weights [B, S,
// 4], the corner targets [B*S, 4] and weights [B*S]. The focal loss sees
// every class: classes 1 and up are negatives everywhere, a constant, so
// that only the first class's column crosses from the host each step.
func (b *builder) proposalLosses(enc layerOutput, p G.Nodes) (ce, box, giou *G.Node) {
	if b.err != nil {
		return nil, nil, nil
	}
	cfg := b.cfg
	s, c := cfg.Tokens(), cfg.NumClasses
	target := p[1]
	if c > 1 {
		target = b.check(ops.Concat(2, target, b.constant("proposal_negatives", make([]float64, b.batch*s*(c-1)), b.batch, s, c-1)))
	}
	ones := b.constant("proposal_focal_ones", constant(1)(nil, b.batch*s*c), b.batch, s, c)
	w := b.check(ops.Mul(ones, b.reshape(p[0], 1, 1, 1)))
	if b.err != nil {
		return nil, nil, nil
	}
	ce = b.check(ops.SigmoidFocalLoss(enc.logits, target, w, cfg.FocalAlpha, cfg.FocalGamma))
	box = b.check(ops.L1Loss(enc.boxes, p[2], p[3]))
	xy := b.reshape(b.check(ops.BoxCxCyWHToXYXY(enc.boxes)), b.batch*s, 4)
	if b.err != nil {
		return nil, nil, nil
	}
	giou = b.check(ops.GIoULoss(xy, p[4], p[5]))
	return ce, box, giou
}
