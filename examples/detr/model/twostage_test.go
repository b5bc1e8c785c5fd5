package model

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/ops"
)

// twoStageRef is testdata/twostage.json (gen_twostage.py).
type twoStageRef struct {
	Proposals []struct {
		Levels [][2]int   `json:"levels"`
		Unact  []*float64 `json:"unact"` // nil: +inf
		Valid  []bool     `json:"valid"`
	} `json:"proposals"`
	Embeddings []struct {
		Feats int       `json:"feats"`
		Unact []float64 `json:"unact"`
		Embed []float64 `json:"embed"`
	} `json:"embeddings"`
	TopK []struct {
		K       int       `json:"k"`
		Scores  []float64 `json:"scores"`
		Indices []int     `json:"indices"`
	} `json:"topk"`
}

func loadTwoStageRef(t *testing.T) twoStageRef {
	t.Helper()
	data, err := os.ReadFile("testdata/twostage.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref twoStageRef
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	if len(ref.Proposals) == 0 || len(ref.Embeddings) == 0 || len(ref.TopK) == 0 {
		t.Fatal("testdata/twostage.json has an empty section")
	}
	return ref
}

// TestEncoderProposalsMatchPyTorch: the proposals and their validity are
// PyTorch's, on levels with centres and sizes on both sides of the
// (0.01, 0.99) bounds; an invalid proposal (PyTorch's +inf) has the
// finite stand-in.
func TestEncoderProposalsMatchPyTorch(t *testing.T) {
	for _, c := range loadTwoStageRef(t).Proposals {
		var levels []ops.Level
		for _, hw := range c.Levels {
			levels = append(levels, ops.Level{H: hw[0], W: hw[1]})
		}
		unact, valid := EncoderProposals(levels)
		if !slices.Equal(valid, c.Valid) {
			t.Errorf("levels %v: validity %v, PyTorch %v", c.Levels, valid, c.Valid)
			continue
		}
		if len(unact) != len(c.Unact) {
			t.Fatalf("levels %v: %d coordinates, PyTorch %d", c.Levels, len(unact), len(c.Unact))
		}
		want := make([]float64, len(c.Unact))
		for i, v := range c.Unact {
			want[i] = invalidProposalLogit
			if v != nil {
				want[i] = *v
			}
		}
		if err := autograd.TolForward64.Compare(unact, want); err != nil {
			t.Errorf("levels %v: %v", c.Levels, err)
		}
	}
}

// TestProposalPosEmbedMatchesPyTorch: the embedding is PyTorch's at the
// reference's 128 features and at a small width, a coordinate at the
// invalid proposals' stand-in embedding as PyTorch's +inf does.
func TestProposalPosEmbedMatchesPyTorch(t *testing.T) {
	for _, c := range loadTwoStageRef(t).Embeddings {
		if err := autograd.TolForward64.Compare(ProposalPosEmbed(c.Unact, c.Feats), c.Embed); err != nil {
			t.Errorf("feats %d: %v", c.Feats, err)
		}
	}
}

// TestTopProposals: torch.topk's indices without ties; ties go to the
// lower index; k = 0 selects nothing.
func TestTopProposals(t *testing.T) {
	for _, c := range loadTwoStageRef(t).TopK {
		if got := TopProposals(c.Scores, c.K); !slices.Equal(got, c.Indices) {
			t.Errorf("k %d of %d: %v, PyTorch %v", c.K, len(c.Scores), got, c.Indices)
		}
	}
	if got := TopProposals([]float64{1, 3, 2, 3, 1}, 4); !slices.Equal(got, []int{1, 3, 2, 0}) {
		t.Errorf("ties: %v, want [1 3 2 0]", got)
	}
	if got := TopProposals([]float64{1, 2}, 0); len(got) != 0 {
		t.Errorf("k = 0: %v", got)
	}
}

// TestSelectProposals: the top-k op's output is, per image, the selected
// tokens' coordinates and their embedding; NaN scores are refused.
func TestSelectProposals(t *testing.T) {
	cfg := tinyConfig()
	cfg.TwoStage, cfg.Queries = true, 3
	s, k, d, batch := cfg.Tokens(), cfg.Queries, cfg.DModel, 2
	rng := rand.New(rand.NewPCG(1, 2))
	scores, unact := make([]float64, batch*s), make([]float64, batch*s*4)
	for i := range scores {
		scores[i] = rng.NormFloat64()
	}
	for i := range unact {
		unact[i] = rng.NormFloat64()
	}
	out := make([]float64, batch*k*(4+2*d))
	if err := selectProposals[float64](cfg, batch)([][]float64{scores, unact}, out); err != nil {
		t.Fatal(err)
	}
	for img := range batch {
		top := TopProposals(scores[img*s:(img+1)*s], k)
		var coords []float64
		for _, tok := range top {
			coords = append(coords, unact[(img*s+tok)*4:(img*s+tok)*4+4]...)
		}
		if got := out[img*k*4 : (img+1)*k*4]; !slices.Equal(got, coords) {
			t.Errorf("image %d: coordinates %v, want %v", img, got, coords)
		}
		emb := out[batch*k*4+img*k*2*d : batch*k*4+(img+1)*k*2*d]
		if want := ProposalPosEmbed(coords, d/2); !slices.Equal(emb, want) {
			t.Errorf("image %d: the embedding is not ProposalPosEmbed of the coordinates", img)
		}
	}
	scores[5] = math.NaN()
	if err := selectProposals[float64](cfg, batch)([][]float64{scores, unact}, out); err == nil {
		t.Error("NaN scores were taken")
	}
}

// TestProposalTargets: the proposals' targets are those of a one-class
// layer of S queries matched to the objects with every label 0, and they
// pack after the decoder layers' behind their focal weight.
func TestProposalTargets(t *testing.T) {
	cfg := tinyConfig()
	cfg.TwoStage = true
	_, targets := tinyBatch(cfg.ImageSize)
	batch, q, c, s := len(targets), cfg.Queries, cfg.NumClasses, cfg.Tokens()
	logits, boxes, encLogits, encBoxes := randomPredictions(cfg, batch, rand.New(rand.NewPCG(3, 4)))
	lt, err := buildTargets(cfg, logits, boxes, encLogits, encBoxes, targets, nil)
	if err != nil {
		t.Fatal(err)
	}
	if lt.enc == nil || lt.encScale != cfg.WeightClass/3 {
		t.Fatalf("proposal targets %v, scale %v (want %v: three objects)", lt.enc != nil, lt.encScale, cfg.WeightClass/3)
	}

	one := cfg
	one.TwoStage, one.NumClasses, one.Queries = false, 1, s
	bin := make([]Target, len(targets))
	for i, tg := range targets {
		bin[i] = Target{Labels: make([]int, len(tg.Labels)), Boxes: tg.Boxes}
	}
	want, err := buildTargets(one, [][]float64{encLogits}, [][]float64{encBoxes}, nil, nil, bin, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := want.layers[0]
	for name, pair := range map[string][2][]float64{
		"onehot": {lt.enc.onehot, w.onehot}, "boxT": {lt.enc.boxT, w.boxT}, "l1W": {lt.enc.l1W, w.l1W},
		"giouT": {lt.enc.giouT, w.giouT}, "giouW": {lt.enc.giouW, w.giouW},
	} {
		if !slices.Equal(pair[0], pair[1]) {
			t.Errorf("proposals' %s differ from a one-class layer's", name)
		}
	}
	matched := 0
	for _, v := range lt.enc.onehot {
		if v == 1 {
			matched++
		}
	}
	if matched != 3 {
		t.Errorf("%d proposals matched, want one per object (3)", matched)
	}

	noEnc := *lt
	noEnc.enc = nil
	layersOnly := make([]float64, len(lt.focalW)+2*(batch*q*(c+4+4+4+1)))
	packTargets(&noEnc, layersOnly)
	packed := make([]float64, len(layersOnly)+1+batch*s*(1+4+4+4+1))
	packTargets(lt, packed)
	if !slices.Equal(packed[:len(layersOnly)], layersOnly) {
		t.Error("the proposals' targets moved the layers' in the packed layout")
	}
	rest := packed[len(layersOnly):]
	if rest[0] != lt.encScale || !slices.Equal(rest[1:1+batch*s], lt.enc.onehot) ||
		!slices.Equal(rest[len(rest)-batch*s:], lt.enc.giouW) {
		t.Error("the proposals' part of the packed layout is not scale, onehot, ..., giouW")
	}
}

// TestBuildTargetsReuse: targets built over an earlier step's memory are
// those built afresh, with and without two-stage, whatever the earlier
// step matched.
func TestBuildTargetsReuse(t *testing.T) {
	for _, twoStage := range []bool{false, true} {
		cfg := tinyConfig()
		cfg.TwoStage = twoStage
		_, targets := tinyBatch(cfg.ImageSize)
		batch := len(targets)
		rng := rand.New(rand.NewPCG(5, 6))
		inputs := func() (logits, boxes [][]float64, encLogits, encBoxes []float64) {
			return randomPredictions(cfg, batch, rng)
		}
		l1, b1, el1, eb1 := inputs()
		earlier, err := buildTargets(cfg, l1, b1, el1, eb1, targets, nil)
		if err != nil {
			t.Fatal(err)
		}
		// Fewer objects in the second step, so that the first step's
		// matches would show where they are not written over.
		second := []Target{{Labels: targets[0].Labels[:1], Boxes: targets[0].Boxes[:1]}, targets[1]}
		l2, b2, el2, eb2 := inputs()
		fresh, err := buildTargets(cfg, l2, b2, el2, eb2, second, nil)
		if err != nil {
			t.Fatal(err)
		}
		reused, err := buildTargets(cfg, l2, b2, el2, eb2, second, earlier)
		if err != nil {
			t.Fatal(err)
		}
		if reused != earlier {
			t.Errorf("two stage %v: the earlier targets' memory was not reused", twoStage)
		}
		a, b := make([]float64, packedLen(fresh)), make([]float64, packedLen(reused))
		packTargets(fresh, a)
		packTargets(reused, b)
		if !slices.Equal(a, b) {
			t.Errorf("two stage %v: targets over the earlier step's memory differ from fresh ones", twoStage)
		}
	}
}

// packedLen is the length of lt's packed layout.
func packedLen(lt *lossTargets) int {
	n := len(lt.focalW)
	for _, t := range lt.layers {
		n += len(t.onehot) + len(t.boxT) + len(t.l1W) + len(t.giouT) + len(t.giouW)
	}
	if t := lt.enc; t != nil {
		n += 1 + len(t.onehot) + len(t.boxT) + len(t.l1W) + len(t.giouT) + len(t.giouW)
	}
	return n
}

// randomPredictions are every decoder layer's logits (normal) and boxes
// (coordinates in [0.2, 0.8)) for a batch, and under TwoStage the
// proposals' first-class logits and boxes (else nil).
func randomPredictions(cfg Config, batch int, rng *rand.Rand) (logits, boxes [][]float64, encLogits, encBoxes []float64) {
	random := func(n int, f func() float64) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = f()
		}
		return v
	}
	box := func() float64 { return 0.2 + 0.6*rng.Float64() }
	q, c, s := cfg.Queries, cfg.NumClasses, cfg.Tokens()
	for range cfg.DecLayers {
		logits = append(logits, random(batch*q*c, rng.NormFloat64))
		boxes = append(boxes, random(batch*q*4, box))
	}
	if cfg.TwoStage {
		encLogits, encBoxes = random(batch*s, rng.NormFloat64), random(batch*s*4, box)
	}
	return logits, boxes, encLogits, encBoxes
}
