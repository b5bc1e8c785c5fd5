package model

import (
	"math/rand/v2"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
)

// TestGradCheck: the float64 gradient of the whole network's total loss
// (backbone, input projections, encoder, decoder, heads, the three losses
// of both decoder layers) against central differences, with the
// matching's targets fixed (they are constants with respect to the
// parameters). The parameters are moved off their initial values (the
// sampling offsets' zero weights put every sampling point on a pixel
// centre, where bilinear sampling has a kink) and the gradient is checked
// for a parameter or two of each part of the network.
//
// Under BoxRefine the reference detaches each layer's boxes before the
// next layer refines them: the gradient leaves out a path that central
// differences, which see the whole forward function, take. So the whole
// network is checked without BoxRefine, and with it only the parameters
// after the last detach (the last decoder layer and its heads, whose
// cross-attention samples around box references).
func TestGradCheck(t *testing.T) {
	for _, c := range []struct {
		name    string
		refine  bool
		checked []string
	}{
		{"shared heads", false, []string{
			"backbone.stem.bn.bias", "backbone.stage2.0.conv2.bn.weight",
			"input_proj.0.gn.weight", "input_proj.3.conv.bias", "level_embed",
			"encoder.0.self_attn.sampling_offsets.bias", "encoder.0.self_attn.attention_weights.bias",
			"reference_points.weight", "reference_points.bias",
			"decoder.0.self_attn.in_proj_bias", "decoder.0.cross_attn.sampling_offsets.bias",
			"decoder.1.norm3.weight", "head.class_embed.bias", "head.bbox_embed.layers.2.bias",
		}},
		{"box refinement, after the detach", true, []string{
			"decoder.1.cross_attn.sampling_offsets.bias", "decoder.1.cross_attn.value_proj.bias",
			"decoder.1.self_attn.in_proj_bias", "decoder.1.norm3.weight",
			"head1.class_embed.bias", "head1.bbox_embed.layers.2.bias",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := tinyConfig()
			cfg.Dropout, cfg.BoxRefine = 0, c.refine
			gradCheckNetwork(t, cfg, c.checked)
		})
	}
}

func gradCheckNetwork(t *testing.T, cfg Config, checkedNames []string) {
	params := mustParams(t, 3, tensor.Float64)
	pix, targets := tinyBatch(cfg.ImageSize)
	n, err := Build(cfg, params, Train, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.TrainStep(pix, targets); err != nil {
		t.Fatal(err)
	}
	n.Close()
	fixed := n.lastTargets

	checked := map[string]bool{}
	for _, name := range checkedNames {
		checked[name] = true
	}
	rng := rand.New(rand.NewPCG(5, 6))
	var inputs []autograd.Input
	for _, name := range n.ParamNames() {
		v := params.Value(name).Clone().(*tensor.Dense)
		for i, x := range v.Float64s() {
			v.Float64s()[i] = x + 0.05*rng.NormFloat64()
		}
		inputs = append(inputs, autograd.Input{Name: name, Value: v, NoGrad: !checked[name]})
		delete(checked, name)
	}
	if len(checked) > 0 {
		t.Fatalf("no such parameters: %v", checked)
	}
	names := n.ParamNames()
	build := func(g *G.ExprGraph, nodes G.Nodes) (*G.Node, error) {
		bind := map[string]*G.Node{}
		for i, name := range names {
			bind[name] = nodes[i]
		}
		net, err := build(cfg, params, Train, 2, nil, buildOpts{bind: bind, fixed: fixed, g: g, noVM: true, noGrad: true})
		if err != nil {
			return nil, err
		}
		if err := net.setImages(pix); err != nil {
			return nil, err
		}
		return net.total, nil
	}
	results, err := autograd.CheckGrad(build, inputs, 1)
	for _, r := range results {
		t.Log(r)
	}
	if err != nil {
		t.Fatal(err)
	}
}
