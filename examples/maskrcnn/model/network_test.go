package model

import (
	"slices"
	"strings"
	"testing"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/ops"
)

func TestBuildRejects(t *testing.T) {
	ok := DefaultConfig(3, 32)
	bad := ok
	bad.ImageSize = 40
	for _, c := range []struct {
		cfg   Config
		mode  Mode
		batch int
		want  string
	}{
		{bad, Infer, 1, "ImageSize must be a multiple of 16"},
		{ok, Train, 1, "batch must be at least 2"},
		{ok, Infer, 0, "batch must be at least 1"},
	} {
		_, err := Build(c.cfg, NewParams(1, nil), c.mode, c.batch)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got error %v, want one containing %q", err, c.want)
		}
	}
}

// Training and inference graphs built from one Params share its tensors:
// the inference graph asks for exactly the tensors training made.
func TestGraphsShareParams(t *testing.T) {
	cfg := DefaultConfig(3, 32)
	p := NewParams(1, nil)
	tr, err := Build(cfg, p, Train, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	n := len(p.Names())
	inf, err := Build(cfg, p, Infer, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer inf.Close()
	if len(p.Names()) != n || len(inf.ParamNames()) != n || len(tr.ParamNames()) != n {
		t.Errorf("training made %d tensors and uses %d, inference uses %d and added %d",
			n, len(tr.ParamNames()), len(inf.ParamNames()), len(p.Names())-n)
	}
}

// The device graphs place: every op that reads device values runs on the
// device, and host values reach the host steps (ops.CheckPlacement, as
// ops.NewTapeMachine runs it), in training and inference.
func TestGraphsPlaceOnADevice(t *testing.T) {
	dev := new(backend.Device) // never opened: placement only compares the pointer
	cfg := DefaultConfig(3, 32)
	p := NewParams(1, nil)
	for _, c := range []struct {
		mode  Mode
		batch int
	}{{Train, 2}, {Infer, 1}} {
		n, err := build(cfg, p, c.mode, c.batch, dev, false)
		if err != nil {
			t.Fatalf("mode %d: %v", c.mode, err)
		}
		if err := ops.CheckPlacement(n.g); err != nil {
			t.Errorf("mode %d: %v", c.mode, err)
		}
	}
}

// The r50fpn preset is torchvision's maskrcnn_resnet50_fpn layer for layer:
// its training graph at 512x512 x 8 places on a device, and it has as
// many learnable scalars as torchvision's model for the same classes,
// less what the layouts differ in (see r50fpnParams).
func TestR50FPNPreset(t *testing.T) {
	cfg := R50FPNConfig(3, 512)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Strides(), []int{4, 8, 16, 32, 64}; !slices.Equal(got, want) || cfg.PoolLevels() != 4 {
		t.Fatalf("strides %v and %d pooled levels, want %v and 4", got, cfg.PoolLevels(), want)
	}
	p := NewParams(1, nil)
	n, err := build(cfg, p, Train, 8, new(backend.Device), false)
	if err != nil {
		t.Fatal(err)
	}
	if err := ops.CheckPlacement(n.g); err != nil {
		t.Error(err)
	}
	if got := p.Size(); got != r50fpnParams {
		t.Errorf("%d learnable scalars, want %d", got, r50fpnParams)
	}
}

// r50fpnParams is the learnable scalars of
// maskrcnn_resnet50_fpn(weights=None, weights_backbone=None,
// num_classes=4) in torchvision 0.14, 43,986,279
// (testdata/count_r50fpn.py counts them), less torchvision's box regression for the background class
// (1024*4 weights and 4 biases: this model regresses foreground classes
// only) and its mask logits of the background class (256 weights and a
// bias).
const r50fpnParams = 43986279 - (1024*4 + 4) - (256 + 1)
