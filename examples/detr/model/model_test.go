package model

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/ops"
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
// cross-attention samples around box references). Under TwoStage the
// top-k selection is fixed as the targets are (its output is detached in
// the reference too) and the decoder has one layer, so that no detach is
// left: the whole network is checked, the proposals' layers and heads
// included.
func TestGradCheck(t *testing.T) {
	for _, c := range []struct {
		name     string
		refine   bool
		twoStage bool
		checked  []string
	}{
		{"shared heads", false, false, []string{
			"backbone.stem.bn.bias", "backbone.stage2.0.conv2.bn.weight",
			"input_proj.0.gn.weight", "input_proj.3.conv.bias", "level_embed",
			"encoder.0.self_attn.sampling_offsets.bias", "encoder.0.self_attn.attention_weights.bias",
			"reference_points.weight", "reference_points.bias",
			"decoder.0.self_attn.in_proj_bias", "decoder.0.cross_attn.sampling_offsets.bias",
			"decoder.1.norm3.weight", "head.class_embed.bias", "head.bbox_embed.layers.2.bias",
		}},
		{"box refinement, after the detach", true, false, []string{
			"decoder.1.cross_attn.sampling_offsets.bias", "decoder.1.cross_attn.value_proj.bias",
			"decoder.1.self_attn.in_proj_bias", "decoder.1.norm3.weight",
			"head1.class_embed.bias", "head1.bbox_embed.layers.2.bias",
		}},
		{"two stage, one decoder layer", true, true, []string{
			"backbone.stem.bn.bias", "input_proj.1.gn.bias", "level_embed",
			"encoder.0.self_attn.sampling_offsets.bias", "encoder.0.norm2.weight",
			"enc_output.bias", "enc_output_norm.weight",
			"head1.class_embed.bias", "head1.bbox_embed.layers.2.bias", "head1.bbox_embed.layers.0.bias",
			"pos_trans.bias", "pos_trans_norm.weight", "pos_trans_norm.bias",
			"decoder.0.self_attn.in_proj_bias", "decoder.0.cross_attn.sampling_offsets.bias",
			"head0.class_embed.bias", "head0.bbox_embed.layers.2.bias",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := tinyConfig()
			cfg.Dropout, cfg.BoxRefine, cfg.TwoStage = 0, c.refine, c.twoStage
			if c.twoStage {
				cfg.DecLayers = 1
			}
			gradCheckNetwork(t, cfg, c.checked)
		})
	}
}

func gradCheckNetwork(t *testing.T, cfg Config, checkedNames []string) {
	params := mustParams(t, 3, tensor.Float64)
	pix, targets := tinyBatch(cfg.ImageSize)
	n, err := Build(cfg, params, Train, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.forward(pix, targets); err != nil {
		t.Fatal(err)
	}
	n.Close()
	fixed, proposals := n.lastTargets, n.lastProposals
	if cfg.TwoStage && proposals == nil {
		t.Fatal("no top-k proposals recorded")
	}

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
		net, err := build(cfg, params, Train, 2, nil, buildOpts{bind: bind, fixed: fixed, fixedProposals: proposals, g: g, noVM: true, noGrad: true})
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

// TestTrainingGraphPlacesOnADevice: the training and inference graphs,
// built for a device, pass ops.CheckPlacement: every op that sees device
// values has device kernels, the matching op is fed through ops.ToHost and
// its targets return through ops.ToDevice. A Device that was never opened
// stands for one (placement compares only its address), so the
// parameters are host nodes read through ops.ToDevice, as ops' own
// placement tests do.
func TestTrainingGraphPlacesOnADevice(t *testing.T) {
	dev := new(backend.Device)
	for _, mode := range []Mode{Train, Infer} {
		for _, c := range []struct{ refine, twoStage bool }{{false, false}, {true, false}, {true, true}} {
			cfg := tinyConfig()
			cfg.BoxRefine, cfg.TwoStage = c.refine, c.twoStage
			n, err := build(cfg, mustParams(t, 1, tensor.Float32), mode, 2, dev, buildOpts{noVM: true})
			if err != nil {
				t.Fatalf("mode %d, %+v: %v", mode, c, err)
			}
			if err := ops.CheckPlacement(n.Graph()); err != nil {
				t.Errorf("mode %d, %+v: %v", mode, c, err)
			}
		}
	}
}

// TestTrainingLossFalls trains the tiny network in float32 on one fixed
// batch with AdamW in the reference's groups (at a higher rate than its
// 2e-4, for a short run), gradients clipped at 0.1 as the reference's; the
// total loss falls clearly.
func TestTrainingLossFalls(t *testing.T) {
	t.Run("learned queries", func(t *testing.T) { trainingLossFalls(t, tinyConfig()) })
	t.Run("two stage", func(t *testing.T) {
		cfg := tinyConfig()
		cfg.TwoStage = true
		trainingLossFalls(t, cfg)
	})
}

func trainingLossFalls(t *testing.T, cfg Config) {
	params := mustParams(t, 11, tensor.Float32)
	n, err := Build(cfg, params, Train, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if err := n.NewOptimizer(ReferenceOptimizer()); err != nil {
		t.Fatal(err)
	}
	pix, targets := tinyBatch(cfg.ImageSize)
	var losses []float64
	for step := range 40 {
		l, err := n.TrainStep(pix, targets, step, 1e-3)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if math.IsNaN(l.Total) || math.IsInf(l.Total, 0) {
			t.Fatalf("step %d: losses %+v", step, l)
		}
		if d := l.Total - (l.Class + l.Box + l.GIoU); math.Abs(d) > 1e-4*l.Total {
			t.Fatalf("step %d: total %v is not the sum of %+v", step, l.Total, l)
		}
		losses = append(losses, l.Total)
	}
	first := (losses[0] + losses[1] + losses[2]) / 3
	last := (losses[37] + losses[38] + losses[39]) / 3
	t.Logf("losses %.3f", losses)
	if !(last < 0.7*first) {
		t.Errorf("the loss fell from %.3f to %.3f only (want below 70%%)", first, last)
	}

	// The trained parameters, in an inference graph: boxes in the image.
	inf, err := Build(cfg, params, Infer, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer inf.Close()
	dets, err := inf.Predict(pix)
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range dets {
		if len(d) != cfg.MaxDetections {
			t.Fatalf("image %d: %d detections, want %d", i, len(d), cfg.MaxDetections)
		}
		t.Logf("image %d: best %+v", i, d[0])
	}
}

// TestParamGroups: the backbone, and the sampling offsets and reference
// points, are the groups at a tenth of the rate.
func TestParamGroups(t *testing.T) {
	cfg := tinyConfig()
	params := mustParams(t, 1, tensor.Float32)
	n, err := build(cfg, params, Train, 1, nil, buildOpts{noVM: true})
	if err != nil {
		t.Fatal(err)
	}
	count := map[Group]int{}
	for _, name := range n.ParamNames() {
		g := params.Group(name)
		count[g]++
		want := GroupTransformer
		switch {
		case strings.HasPrefix(name, "backbone."):
			want = GroupBackbone
		case strings.Contains(name, "sampling_offsets") || strings.HasPrefix(name, "reference_points"):
			want = GroupLinearProj
		}
		if g != want {
			t.Errorf("%s is in group %v, want %v", name, g, want)
		}
	}
	// sampling offsets' weight and bias in 1 encoder and 2 decoder layers,
	// and the reference points' two.
	if count[GroupLinearProj] != 8 {
		t.Errorf("%d tensors in %v, want 8", count[GroupLinearProj], GroupLinearProj)
	}
	groups, _, err := n.ParamGroups(2e-4, 1e-4)
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 3 || groups[0].LR != 2e-4 || math.Abs(groups[1].LR-2e-5) > 1e-12 || math.Abs(groups[2].LR-2e-5) > 1e-12 {
		t.Errorf("groups' rates: %+v", groups)
	}
}

// TestGPUConfigPlaces: the reference's network (GPUConfig, the r50
// preset's) builds, training graph and gradients included, and places on
// a device, as TestTrainingGraphPlacesOnADevice checks the tiny one. One
// image per batch keeps the host memory small; the batch changes no
// placement.
func TestGPUConfigPlaces(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a graph of the full-size network")
	}
	dev := new(backend.Device)
	for _, mode := range []Mode{Train, Infer} {
		n, err := build(GPUConfig(3, 512), mustParams(t, 1, tensor.Float32), mode, 1, dev, buildOpts{noVM: true})
		if err != nil {
			t.Fatalf("mode %d: %v", mode, err)
		}
		if err := ops.CheckPlacement(n.Graph()); err != nil {
			t.Errorf("mode %d: %v", mode, err)
		}
	}
}

// TestR50TrainableParams: the r50 preset at the reference's benchmark
// configuration (91 classes, no box refinement, no two stage) has the
// official model's count of trainable parameters, with box refinement
// the count its six cloned heads add, and with two stage as well the
// count of its proposal layers and heads, less the learned queries. The expected counts are
// the architecture's, worked out below layer by layer;
// testdata/r50_params.py works the same count out with torchvision's
// resnet50 (39847265, the "number of params" the reference prints for
// its R50 model). The stem and layer1 are frozen: no parameter, and the
// training graph computes no gradient for them (one weight-gradient op per
// trainable convolution, and no data gradient into layer1's output or
// the images).
func TestR50TrainableParams(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a graph of the full-size network")
	}
	const d, ffn, heads, levels, points, queries, classes, layers = 256, 1024, 8, 4, 4, 300, 91, 6
	linear := func(in, out int) int { return in*out + out }
	// ResNet-50's layer2 to layer4: bottleneck blocks of 1x1, 3x3, 1x1
	// bias-free convolutions, a 1x1 projection in the first block; the
	// frozen BatchNorms have no parameters.
	backbone, convs := 0, 0
	in := 256 // layer1's output
	for s, blocks := range []int{4, 6, 3} {
		w := 128 << s
		for blk := range blocks {
			backbone += in*w + w*w*9 + w*4*w
			convs += 3
			if blk == 0 {
				backbone += in * 4 * w
				convs++
			}
			in = 4 * w
		}
	}
	inputProj := 0
	for _, c := range []int{512, 1024, 2048} {
		inputProj += linear(c, d) + 2*d // 1x1 convolution, GroupNorm
	}
	inputProj += linear(2048*9, d) + 2*d // the 3x3 stride-2 level
	msDeform := linear(d, heads*levels*points*2) + linear(d, heads*levels*points) + 2*linear(d, d)
	ffnParams := linear(d, ffn) + linear(ffn, d)
	encoder := msDeform + ffnParams + 2*2*d
	selfAttn := 3*d*d + 3*d + linear(d, d)
	decoder := selfAttn + msDeform + ffnParams + 3*2*d
	heads1 := linear(d, classes) + 2*linear(d, d) + linear(d, 4)
	rest := levels*d + linear(d, 2) + queries*2*d // level_embed, reference_points, query_embed
	want := backbone + inputProj + layers*(encoder+decoder) + rest + heads1
	twoStage := want + layers*heads1 - linear(d, 2) - queries*2*d + linear(d, d) + 2*d + linear(2*d, 2*d) + 2*2*d
	if want != 39847265 || twoStage != 40959129 {
		t.Fatalf("the formulas give %d and %d, testdata/r50_params.py 39847265 and 40959129", want, twoStage)
	}

	dev := new(backend.Device)
	for _, c := range []struct{ refine, twoStage bool }{{false, false}, {true, false}, {true, true}} {
		refine := c.refine
		cfg := GPUConfig(classes, 512)
		cfg.BoxRefine, cfg.TwoStage = c.refine, c.twoStage
		params := mustParams(t, 1, tensor.Float32)
		n, err := build(cfg, params, Train, 1, dev, buildOpts{noVM: true})
		if err != nil {
			t.Fatalf("refine %v: %v", refine, err)
		}
		w := want
		switch {
		case c.twoStage:
			w = twoStage
		case refine:
			w += (layers - 1) * heads1
		}
		got := 0
		for _, name := range n.ParamNames() {
			got += params.Value(name).Shape().TotalSize()
			if strings.HasPrefix(name, "backbone.stem") || strings.HasPrefix(name, "backbone.layer1.") || strings.Contains(name, ".bn.") {
				t.Errorf("refine %v: %s is learnable, the reference freezes it", refine, name)
			}
		}
		if got != w || params.Size() != w {
			t.Errorf("refine %v: %d trainable parameters (store %d), want %d", refine, got, params.Size(), w)
		}
		frozen := params.Frozen()
		if !slices.Contains(frozen, "backbone.stem.weight") || !slices.Contains(frozen, "backbone.layer1.2.conv3.weight") || !slices.Contains(frozen, "backbone.layer4.2.conv3.bn.bias") {
			t.Errorf("refine %v: frozen tensors %d, missing the stem's, layer1's or a BatchNorm's", refine, len(frozen))
		}
		ops := map[string]int{}
		for _, x := range n.Graph().AllNodes() {
			if x.Op() == nil {
				continue
			}
			s := x.Op().String()
			for _, k := range []string{"ConvWgrad", "ConvDgrad"} {
				if strings.HasPrefix(s, k+"(") {
					ops[k]++
				}
			}
		}
		// The trainable convolutions: the backbone's and input_proj's
		// four; layer2's first conv1 and projection read frozen layer1.
		if ops["ConvWgrad"] != convs+4 || ops["ConvDgrad"] != convs+4-2 {
			t.Errorf("refine %v: %d weight- and %d data-gradient ops, want %d and %d", refine, ops["ConvWgrad"], ops["ConvDgrad"], convs+4, convs+2)
		}
	}
}

// TestSetImagesNormalizes: the input is (pixel - 0.5) / 0.25, in float32
// exactly the float64 value rounded once, for every image of the batch.
func TestSetImagesNormalizes(t *testing.T) {
	cfg := tinyConfig()
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		n, err := build(cfg, mustParams(t, 1, dt), Infer, 3, nil, buildOpts{noVM: true})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(9, 10))
		pix := make([][]float32, 3)
		for i := range pix {
			pix[i] = make([]float32, 3*cfg.ImageSize*cfg.ImageSize)
			for j := range pix[i] {
				pix[i][j] = rng.Float32() * float32(math.Pow(10, -float64(j%8)))
			}
		}
		if err := n.setImages(pix); err != nil {
			t.Fatal(err)
		}
		got, _ := float64sOf(n.images)
		k := 0
		for _, p := range pix {
			for _, v := range p {
				want := (float64(v) - pixelMean) / pixelStd
				if dt == tensor.Float32 {
					want = float64(float32(want))
				}
				if got[k] != want {
					t.Fatalf("%v: value %d is %v, want %v", dt, k, got[k], want)
				}
				k++
			}
		}
	}
}
