package model

import (
	"fmt"
	"math"

	G "gorgonia.org/gorgonia"

	"github.com/stheno-ml/stheno/examples/detr/posembed"
	"github.com/stheno-ml/stheno/examples/internal/resnet"
	"github.com/stheno-ml/stheno/ops"
)

// levels are the feature maps' sizes, as MSDeformAttn takes them.
func (b *builder) levels() []ops.Level {
	ls := make([]ops.Level, NumLevels)
	for l := range ls {
		s := b.cfg.LevelSize(l)
		ls[l] = ops.Level{H: s, W: s}
	}
	return ls
}

// backbone returns the outputs of the backbone's last three stages
// (Config.Backbone), finest first.
func (b *builder) backbone(x *G.Node) []*G.Node {
	if b.cfg.Backbone == BackboneResNet50 {
		return b.resNet50(x)
	}
	return b.basicResNet(x)
}

// resNet50 is BackboneResNet50, laid out by resnet.ResNet50: every
// BatchNorm frozen, the stem's and layer1's convolutions frozen too (the
// reference trains layer2 to layer4 only), so that no gradient is made
// for them. It returns C3, C4 and C5.
func (b *builder) resNet50(x *G.Node) []*G.Node {
	feats := resnet.ResNet50(resNetLayers{b, map[*G.Node]bool{}}, x, b.cfg.Width)
	if feats == nil {
		return nil
	}
	return feats[1:]
}

// resNetLayers makes resnet.ResNet50's layers, named under "backbone.".
// frozen holds the outputs of the frozen layers: the trainable layers that
// read one (layer2's first) make no gradient for it.
type resNetLayers struct {
	b      *builder
	frozen map[*G.Node]bool
}

func (r resNetLayers) ConvBN(x *G.Node, l resnet.Layer, residual *G.Node) *G.Node {
	trainable := l.Stage >= 2
	y := r.b.frozenBNConvBN(x, "backbone."+l.Name, l.Out, l.Kernel, l.Stride, l.Act, residual, trainable, r.frozen[x])
	if !trainable && y != nil {
		r.frozen[y] = true
	}
	return y
}

func (r resNetLayers) Check(n *G.Node, err error) *G.Node { return r.b.check(n, err) }

// basicResNet is BackboneBasic: a stride-2 3x3 stem, then Stages stages of
// basic blocks (two 3x3 ConvBN layers and a shortcut, 1x1 ConvBN where the
// shape changes) whose first block halves the resolution. It returns the
// outputs of the last three stages.
func (b *builder) basicResNet(x *G.Node) []*G.Node {
	cfg := b.cfg
	c := b.convBN(x, "backbone.stem", cfg.Width, 3, 2, ops.ActReLU, nil)
	var feats []*G.Node
	for s := range cfg.Stages {
		ch := cfg.Width << s
		for blk := range cfg.Depth {
			name := fmt.Sprintf("backbone.stage%d.%d", s, blk)
			stride := 1
			if blk == 0 {
				stride = 2
			}
			shortcut := c
			if b.err == nil && (stride != 1 || c.Shape()[1] != ch) {
				shortcut = b.convBN(c, name+".down", ch, 1, stride, ops.ActNone, nil)
			}
			y := b.convBN(c, name+".conv1", ch, 3, stride, ops.ActReLU, nil)
			c = b.convBN(y, name+".conv2", ch, 3, 1, ops.ActReLU, shortcut)
		}
		if s >= cfg.Stages-3 {
			feats = append(feats, c)
		}
	}
	return feats
}

// inputProj brings the backbone's three levels to DModel channels (a 1x1
// convolution and GroupNorm each) and makes the fourth from the last
// backbone level (a stride-2 3x3 convolution and GroupNorm), as the
// reference's input_proj; the convolutions are Xavier-initialised with
// zero bias.
func (b *builder) inputProj(feats []*G.Node) []*G.Node {
	if b.err != nil {
		return nil
	}
	d := b.cfg.DModel
	out := make([]*G.Node, NumLevels)
	for l, f := range feats {
		cin := f.Shape()[1]
		name := fmt.Sprintf("input_proj.%d", l)
		out[l] = b.groupNorm(b.conv(f, name+".conv", d, 1, 1, xavier(cin, d), GroupTransformer), name+".gn")
	}
	last := feats[len(feats)-1]
	if b.err != nil {
		return nil
	}
	cin := last.Shape()[1]
	name := fmt.Sprintf("input_proj.%d", NumLevels-1)
	out[NumLevels-1] = b.groupNorm(b.conv(last, name+".conv", d, 3, 2, xavier(cin*9, d*9), GroupTransformer), name+".gn")
	return out
}

// flatten lays the levels [B, D, H, W] out as tokens [B, S, D], level
// after level, pixels row-major: the reference's src_flatten.
func (b *builder) flatten(srcs []*G.Node) *G.Node {
	if b.err != nil {
		return nil
	}
	d := b.cfg.DModel
	parts := make([]*G.Node, len(srcs))
	for l, s := range srcs {
		hw := s.Shape()[2] * s.Shape()[3]
		parts[l] = b.check(ops.Permute(b.reshape(s, b.batch, d, hw), 0, 2, 1))
		if b.err != nil {
			return nil
		}
	}
	return b.check(ops.Concat(1, parts...))
}

// positions is the encoder's position embedding of every token [B, S, D]:
// the sine embedding of each level (normalised, scale 2π, temperature
// 10000, of an all-valid mask: the batches have no padding) plus the
// level's learned embedding (level_embed, normal).
func (b *builder) positions() *G.Node {
	if b.err != nil {
		return nil
	}
	cfg := b.cfg
	d, s := cfg.DModel, cfg.Tokens()
	pos := make([]float64, b.batch*s*d)
	onehot := make([]float64, s*NumLevels)
	start := 0
	for l := range NumLevels {
		h := cfg.LevelSize(l)
		hw := h * h
		emb, err := posembed.Sine[float64](make([]bool, b.batch*hw), b.batch, h, h, posembed.Config{Feats: d / 2})
		if err != nil {
			return b.check(nil, err)
		}
		// emb is [B, D, h, w]; the tokens take it as [B, hw, D].
		for n := range b.batch {
			for c := range d {
				for p := range hw {
					pos[(n*s+start+p)*d+c] = emb[(n*d+c)*hw+p]
				}
			}
		}
		for p := range hw {
			onehot[(start+p)*NumLevels+l] = 1
		}
		start += hw
	}
	sine := b.constant("pos_embed", pos, b.batch, s, d)
	levelEmbed := b.param("level_embed", []int{NumLevels, d}, normal(1), GroupTransformer)
	lvl := b.constant("level_of_token", onehot, s, NumLevels)
	if b.err != nil {
		return nil
	}
	return b.add(sine, b.check(ops.MatMul(lvl, levelEmbed)))
}

// EncoderReferencePoints is the reference's get_reference_points for the
// encoder: for each image n and token (pixel (i, j) of level l, in the
// token order), the normalised pixel centre ((j+0.5)/(vx_l*W_l),
// (i+0.5)/(vy_l*H_l)) multiplied by every level's valid ratio (vx, vy):
// [N, S, L, 2] row-major. validRatios[n][l] is image n's (vx, vy) on level
// l, the fraction of the level that is not padding (1, 1 for the
// unpadded batches this package builds).
func EncoderReferencePoints(levels []ops.Level, validRatios [][][2]float64) []float64 {
	s := 0
	for _, lv := range levels {
		s += lv.H * lv.W
	}
	nl := len(levels)
	out := make([]float64, 0, len(validRatios)*s*nl*2)
	for _, vr := range validRatios {
		for l, lv := range levels {
			for i := range lv.H {
				for j := range lv.W {
					x := (float64(j) + 0.5) / (vr[l][0] * float64(lv.W))
					y := (float64(i) + 0.5) / (vr[l][1] * float64(lv.H))
					for m := range nl {
						out = append(out, x*vr[m][0], y*vr[m][1])
					}
				}
			}
		}
	}
	return out
}

// samplingOffsetBias is the reference's initial bias of sampling_offsets
// [M*L*P*2]: head m points in direction 2πm/M, scaled so that the larger
// coordinate is 1, and its point p lies p+1 times as far, on every level.
func samplingOffsetBias(heads, levels, points int) []float64 {
	out := make([]float64, 0, heads*levels*points*2)
	for m := range heads {
		theta := float64(m) * 2 * math.Pi / float64(heads)
		x, y := math.Cos(theta), math.Sin(theta)
		s := math.Max(math.Abs(x), math.Abs(y))
		x, y = x/s, y/s
		for range levels {
			for p := range points {
				out = append(out, x*float64(p+1), y*float64(p+1))
			}
		}
	}
	return out
}

// msDeform is the reference's MSDeformAttn module: value_proj of the
// tokens, sampling offsets and attention weights (softmax over levels and
// points) from the query, sampling locations from the reference, the
// deformable attention and output_proj. ref is, for the encoder, the
// constant [B, S, 1, L, 1, 2] of EncoderReferencePoints; for the decoder
// [B, Q, 2] (points) or [B, Q, 4] (boxes, under BoxRefine): a point's
// offsets are in pixels of each level, a box's in eighths (1/(2P)) of its
// size. (A decoder point reference would be multiplied by the levels'
// valid ratios; they are all 1 here, so the product is left out.)
func (b *builder) msDeform(query, tokens, ref *G.Node, name string) *G.Node {
	if b.err != nil {
		return nil
	}
	cfg := b.cfg
	d, m, l, p := cfg.DModel, cfg.Heads, NumLevels, cfg.Points
	n, lq, s := query.Shape()[0], query.Shape()[1], tokens.Shape()[1]
	value := b.linear(tokens, name+".value_proj", d, xavier(d, d), zeros(), GroupTransformer)
	value = b.reshape(value, n, s, m, d/m)
	off := b.linear(query, name+".sampling_offsets", m*l*p*2, zeros(), values(samplingOffsetBias(m, l, p)), GroupLinearProj)
	off = b.reshape(off, n, lq, m, l, p, 2)
	aw := b.linear(query, name+".attention_weights", m*l*p, zeros(), zeros(), GroupTransformer)
	aw = b.reshape(b.check(ops.Softmax(b.reshape(aw, n, lq, m, l*p), -1)), n, lq, m, l, p)
	if b.err != nil {
		return nil
	}
	var loc *G.Node
	switch ref.Shape()[ref.Dims()-1] {
	case 2:
		inv := make([]float64, 0, 2*l)
		for _, lv := range b.levels() {
			inv = append(inv, 1/float64(lv.W), 1/float64(lv.H))
		}
		scaled := b.check(ops.Mul(off, b.constant(name+".offset_normalizer", inv, l, 1, 2)))
		if ref.Dims() == 3 {
			ref = b.reshape(ref, n, lq, 1, 1, 1, 2)
		}
		loc = b.add(ref, scaled)
	case 4:
		xy := b.reshape(b.check(ops.Slice(ref, 2, 0, 2)), n, lq, 1, 1, 1, 2)
		wh := b.reshape(b.check(ops.Slice(ref, 2, 2, 4)), n, lq, 1, 1, 1, 2)
		if b.err != nil {
			return nil
		}
		loc = b.add(xy, b.check(ops.Mul(b.check(ops.Scale(off, 0.5/float64(p))), wh)))
	}
	if b.err != nil {
		return nil
	}
	out := b.check(ops.MSDeformAttn(value, loc, aw, b.levels()))
	return b.linear(out, name+".output_proj", d, xavier(d, d), zeros(), GroupTransformer)
}

// ffn is linear2(dropout(relu(linear1(x)))), dropped out: the layers'
// feed-forward branch, Xavier weights and nn.Linear's biases.
func (b *builder) ffn(x *G.Node, name string) *G.Node {
	d, f := b.cfg.DModel, b.cfg.FFN
	h := b.linear(x, name+".linear1", f, xavier(d, f), torchLinear(d), GroupTransformer)
	if b.err != nil {
		return nil
	}
	h = b.dropout(b.check(ops.ReLU(h)))
	return b.dropout(b.linear(h, name+".linear2", d, xavier(f, d), torchLinear(f), GroupTransformer))
}

// encoderLayer is the reference's post-norm encoder layer: deformable
// self-attention of the tokens (queries with their positions), residual,
// LayerNorm, FFN, residual, LayerNorm.
func (b *builder) encoderLayer(src, pos, ref *G.Node, name string) *G.Node {
	attn := b.msDeform(b.add(src, pos), src, ref, name+".self_attn")
	src = b.layerNorm(b.add(src, b.dropout(attn)), name+".norm1")
	return b.layerNorm(b.add(src, b.ffn(src, name)), name+".norm2")
}

// expand repeats x [T, D] over the batch: [B, T, D].
func (b *builder) expand(x *G.Node) *G.Node {
	return b.add(x, b.constant("batch_zeros", make([]float64, b.batch), b.batch, 1, 1))
}

// decoderLayer is the reference's decoder layer: self-attention of the
// queries (query and key with their positions), residual, LayerNorm;
// deformable cross-attention to the encoder's tokens from ref, residual,
// LayerNorm; FFN, residual, LayerNorm. ops.MultiHeadAttention has no
// dropout of its attention weights (the reference's nn.MultiheadAttention
// drops them at the layer's rate); its output is dropped out as the
// reference's.
func (b *builder) decoderLayer(tgt, pos, ref, memory *G.Node, name string) *G.Node {
	if b.err != nil {
		return nil
	}
	d := b.cfg.DModel
	w := ops.AttentionWeights{
		InProjWeight:  b.param(name+".self_attn.in_proj_weight", []int{3 * d, d}, xavier(d, 3*d), GroupTransformer),
		InProjBias:    b.param(name+".self_attn.in_proj_bias", []int{3 * d}, zeros(), GroupTransformer),
		OutProjWeight: b.param(name+".self_attn.out_proj.weight", []int{d, d}, xavier(d, d), GroupTransformer),
		OutProjBias:   b.param(name+".self_attn.out_proj.bias", []int{d}, zeros(), GroupTransformer),
	}
	q := b.add(tgt, pos)
	if b.err != nil {
		return nil
	}
	sa, _, err := ops.MultiHeadAttention(q, q, tgt, w, nil, ops.AttentionConfig{NumHeads: b.cfg.Heads, BatchFirst: true})
	tgt = b.layerNorm(b.add(tgt, b.dropout(b.check(sa, err))), name+".norm2")
	ca := b.msDeform(b.add(tgt, pos), memory, ref, name+".cross_attn")
	tgt = b.layerNorm(b.add(tgt, b.dropout(ca)), name+".norm1")
	return b.layerNorm(b.add(tgt, b.ffn(tgt, name)), name+".norm3")
}

// layerOutput is one decoder layer's predictions: class logits [B, Q, C]
// (nil where an inference graph needs none) and boxes [B, Q, 4],
// normalised (cx, cy, w, h).
type layerOutput struct {
	logits, boxes *G.Node
}

// headName names layer lid's heads: one pair per layer under BoxRefine,
// else one pair shared by every layer (the reference's ModuleList of one
// module).
func (b *builder) headName(lid int) string {
	if b.cfg.BoxRefine {
		return fmt.Sprintf("head%d", lid)
	}
	return "head"
}

// cloneOf starts head lid's copy of a head tensor at the first head's
// values, as the reference's _get_clones deep-copies the initialised
// heads: the first is head 0, or under TwoStage the proposals' head
// DecLayers, which the graph makes before the decoder's. Other tensors
// and the first head take in.
func (b *builder) cloneOf(lid int, suffix string, in initializer) initializer {
	first := 0
	if b.cfg.TwoStage {
		first = b.cfg.DecLayers
	}
	if lid == first || !b.cfg.BoxRefine {
		return in
	}
	src := b.headName(first) + suffix
	if b.params.Value(src) == nil {
		return in
	}
	h, err := b.params.HostValue(src)
	if err != nil {
		b.check(nil, fmt.Errorf("model: %s: %w", src, err))
		return in
	}
	vs, err := float64sOf(h)
	if err != nil {
		return in
	}
	return values(vs)
}

// classHead is the class Linear: nn.Linear's weight, every bias
// -log((1-0.01)/0.01) so that every class starts at probability 0.01.
func (b *builder) classHead(x *G.Node, lid int) *G.Node {
	d, c := b.cfg.DModel, b.cfg.NumClasses
	name := b.headName(lid) + ".class_embed"
	prior := -math.Log((1 - 0.01) / 0.01)
	return b.linear(x, name, c, b.cloneOf(lid, ".class_embed.weight", torchLinear(d)),
		b.cloneOf(lid, ".class_embed.bias", constant(prior)), GroupTransformer)
}

// boxHead is the box MLP (Linear, ReLU, Linear, ReLU, Linear to 4), the
// last layer zero; its bias starts at (0, 0, -2, -2) in the first layer's
// head under BoxRefine and in the shared head without (the first
// reference is a point, and sigmoid(-2) its boxes' size), at zero in the
// other layers' heads, and in every head under TwoStage (whose references
// are boxes from the first layer on). Head DecLayers is the encoder's
// proposals' (TwoStage).
func (b *builder) boxHead(x *G.Node, lid int) *G.Node {
	d := b.cfg.DModel
	name := b.headName(lid) + ".bbox_embed"
	h := x
	for i := range 2 {
		sfx := fmt.Sprintf(".bbox_embed.layers.%d", i)
		h = b.linear(h, fmt.Sprintf("%s.layers.%d", name, i), d, b.cloneOf(lid, sfx+".weight", torchLinear(d)),
			b.cloneOf(lid, sfx+".bias", torchLinear(d)), GroupTransformer)
		if b.err != nil {
			return nil
		}
		h = b.check(ops.ReLU(h))
	}
	bias := []float64{0, 0, -2, -2}
	if lid > 0 && b.cfg.BoxRefine || b.cfg.TwoStage {
		bias = []float64{0, 0, 0, 0}
	}
	return b.linear(h, name+".layers.2", 4, zeros(), values(bias), GroupTransformer)
}

// refine is the layer's boxes, sigmoid(delta + inverse_sigmoid(ref)), the
// delta's size untouched by a point reference (RefineBox is its host
// twin).
func (b *builder) refine(delta, ref *G.Node) *G.Node {
	if b.err != nil {
		return nil
	}
	inv := b.check(ops.InverseSigmoid(ref, 0))
	if ref.Shape()[2] == 2 {
		n, q := ref.Shape()[0], ref.Shape()[1]
		inv = b.check(ops.Concat(2, inv, b.constant("zero_size", make([]float64, n*q*2), n, q, 2)))
	}
	return b.check(ops.Sigmoid(b.add(delta, inv)))
}

// transformer runs the encoder over the projected levels and the decoder
// over the queries, and returns every decoder layer's predictions (class
// logits of the last layer only when allLogits is false) and, under
// TwoStage, the encoder's proposals' (else zero).
func (b *builder) transformer(srcs []*G.Node, allLogits bool) ([]layerOutput, layerOutput) {
	cfg := b.cfg
	s := cfg.Tokens()
	memory := b.flatten(srcs)
	pos := b.positions()
	ones := make([][][2]float64, b.batch)
	for n := range ones {
		ones[n] = make([][2]float64, NumLevels)
		for l := range ones[n] {
			ones[n][l] = [2]float64{1, 1}
		}
	}
	encRef := b.constant("encoder_reference_points", EncoderReferencePoints(b.levels(), ones), b.batch, s, 1, NumLevels, 1, 2)
	for i := range cfg.EncLayers {
		memory = b.encoderLayer(memory, pos, encRef, fmt.Sprintf("encoder.%d", i))
	}

	var tgt, qpos, ref *G.Node
	var enc layerOutput
	if cfg.TwoStage {
		tgt, qpos, ref, enc = b.twoStageQueries(memory)
	} else {
		tgt, qpos, ref = b.learnedQueries()
	}
	if b.err != nil {
		return nil, enc
	}

	var outs []layerOutput
	for lid := range cfg.DecLayers {
		tgt = b.decoderLayer(tgt, qpos, ref, memory, fmt.Sprintf("decoder.%d", lid))
		var o layerOutput
		if allLogits || lid == cfg.DecLayers-1 {
			o.logits = b.classHead(tgt, lid)
		}
		o.boxes = b.refine(b.boxHead(tgt, lid), ref)
		if b.err != nil {
			return nil, enc
		}
		if cfg.BoxRefine {
			// The next layer refines these boxes, without gradients
			// through them (the reference's detach).
			ref = b.check(ops.Detach(o.boxes))
		}
		outs = append(outs, o)
	}
	return outs, enc
}

// learnedQueries are the decoder's queries without TwoStage: query_embed
// (normal) split into the query positions and the queries, both expanded
// over the batch, and reference points sigmoid(Linear(position)).
func (b *builder) learnedQueries() (tgt, qpos, ref *G.Node) {
	d := b.cfg.DModel
	queryEmbed := b.param("query_embed", []int{b.cfg.Queries, 2 * d}, normal(1), GroupTransformer)
	if b.err != nil {
		return nil, nil, nil
	}
	queryPos := b.check(ops.Slice(queryEmbed, 1, 0, d))
	tgt = b.expand(b.check(ops.Slice(queryEmbed, 1, d, 2*d)))
	refLin := b.linear(queryPos, "reference_points", 2, xavier(d, 2), zeros(), GroupLinearProj)
	if b.err != nil {
		return nil, nil, nil
	}
	return tgt, b.expand(queryPos), b.expand(b.check(ops.Sigmoid(refLin)))
}
