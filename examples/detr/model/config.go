package model

import (
	"fmt"
	"math"
)

// NumLevels is the number of feature levels the transformer attends to:
// the outputs of the backbone's last three stages and one more made from
// the last by a stride-2 3x3 convolution, as the reference's
// num_feature_levels = 4.
const NumLevels = 4

// Backbones.
const (
	// BackboneBasic (the zero value, "") is a small ResNet of basic
	// blocks: a stride-2 3x3 stem of Width channels, then Stages stages of
	// Depth blocks (two 3x3 ConvBN layers and a shortcut); stage s has
	// Width<<s channels and ends at stride 2^(s+2). Its BatchNorm trains.
	BackboneBasic = ""
	// BackboneResNet50 is the reference's: torchvision's ResNet-50 (v1.5,
	// the stride on the 3x3 convolution; examples/internal/resnet) of
	// base width Width (64), with FrozenBatchNorm2d (every BatchNorm in
	// inference mode, its statistics and affine constants, not
	// parameters) and the reference's freezing: the stem and layer1 get
	// no gradient, layer2 to layer4 train. Their outputs C3, C4, C5
	// (strides 8, 16, 32; 512, 1024, 2048 channels) are levels 0 to 2.
	// Stages must be 4; Depth is not used.
	BackboneResNet50 = "resnet50"
)

// Config describes the network, its losses and its post-processing. The
// zero value is not usable; start from DefaultConfig or GPUConfig.
type Config struct {
	// ImageSize is the side of the square input images (planar RGB),
	// a multiple of 2^(Stages+2) so that every level's side divides
	// exactly.
	ImageSize int
	// NumClasses is the number of object classes, labelled 0..NumClasses-1.
	// There is no background class: the classifier is NumClasses
	// independent sigmoids, trained with the focal loss.
	NumClasses int

	// Backbone is BackboneBasic or BackboneResNet50. The basic one is a
	// stride-2 3x3 stem of Width channels, then Stages stages of Depth
	// residual blocks; stage s has Width<<s channels and ends at stride
	// 2^(s+2). The last three stages give levels 0..2 (strides 8, 16 and
	// 32 when Stages is 4, as ResNet's C3..C5).
	Backbone             string
	Width, Depth, Stages int

	// Transformer: DModel features, Heads attention heads (in the
	// deformable attention and in the decoder's self-attention), Points
	// sampling points per head and level, FFN hidden features, Dropout
	// after every sub-layer, EncLayers and DecLayers layers, Queries object
	// queries. NormGroups is the GroupNorm groups of the input
	// projections (the reference's 32).
	DModel, Heads, Points, FFN int
	Dropout                    float64
	EncLayers, DecLayers       int
	Queries                    int
	NormGroups                 int

	// BoxRefine is the reference's with_box_refine: every decoder layer has
	// its own heads and refines the boxes of the layer before it, whose
	// (detached) boxes are its reference. Without it the heads are shared
	// and every layer's boxes are relative to the first reference points.
	BoxRefine bool
	// TwoStage is the reference's two_stage: the decoder's queries and
	// reference boxes come from the encoder's Queries best-scored
	// proposals (EncoderProposals, TopProposals, ProposalPosEmbed) instead
	// of learned embeddings, and the proposals are trained as a
	// class-agnostic detector. As in the reference it needs BoxRefine
	// (the proposals' heads are the refinement's extra pair).
	TwoStage bool

	// Matching costs (the reference's set_cost_class, set_cost_bbox,
	// set_cost_giou) and loss weights (cls_loss_coef, bbox_loss_coef,
	// giou_loss_coef); FocalAlpha and FocalGamma are the focal loss's and
	// the class cost's.
	CostClass, CostBox, CostGIoU       float64
	WeightClass, WeightBox, WeightGIoU float64
	FocalAlpha, FocalGamma             float64

	// MaxDetections is the number of (query, class) pairs Predict keeps per
	// image, best scored first (the reference's top 100).
	MaxDetections int
}

// DefaultConfig is a small network for the host: 64x64 images, a backbone
// of three stages (levels at strides 4, 8, 16 and 32), d_model 64, two
// encoder and two decoder layers, 50 queries, with box refinement. Its
// sizes are a starting point, to be tuned by measurement.
func DefaultConfig(numClasses int) Config {
	c := referenceConfig(numClasses)
	c.ImageSize = 64
	c.Width, c.Depth, c.Stages = 16, 1, 3
	c.DModel, c.FFN = 64, 256
	c.EncLayers, c.DecLayers = 2, 2
	c.Queries = 50
	return c
}

// GPUConfig is the reference's network (its R50 model) layer for layer on
// images of imageSize pixels (a multiple of 64): the ResNet-50 backbone
// with frozen BatchNorm, the stem and layer1 frozen (BackboneResNet50),
// levels at strides 8, 16, 32 and 64, d_model 256, 8 heads, 4 points,
// d_ffn 1024, dropout 0.1, 6 encoder and 6 decoder layers, 300 queries,
// with box refinement.
func GPUConfig(numClasses, imageSize int) Config {
	c := referenceConfig(numClasses)
	c.ImageSize = imageSize
	c.Backbone, c.Width, c.Depth, c.Stages = BackboneResNet50, 64, 1, 4
	return c
}

// referenceConfig holds the reference's transformer, loss and
// post-processing settings.
func referenceConfig(numClasses int) Config {
	return Config{
		NumClasses: numClasses,
		DModel:     256, Heads: 8, Points: 4, FFN: 1024, Dropout: 0.1,
		EncLayers: 6, DecLayers: 6, Queries: 300, NormGroups: 32,
		BoxRefine: true,
		CostClass: 2, CostBox: 5, CostGIoU: 2,
		WeightClass: 2, WeightBox: 5, WeightGIoU: 2,
		FocalAlpha: 0.25, FocalGamma: 2,
		MaxDetections: 100,
	}
}

// LevelSize is the side of level l's feature map (0..NumLevels-1).
func (c Config) LevelSize(l int) int { return c.ImageSize >> (c.Stages - 3 + l + 2) }

// LevelStride is level l's stride in pixels.
func (c Config) LevelStride(l int) int { return 1 << (c.Stages - 3 + l + 2) }

// Tokens is the number of encoder tokens: the pixels of every level.
func (c Config) Tokens() int {
	n := 0
	for l := range NumLevels {
		n += c.LevelSize(l) * c.LevelSize(l)
	}
	return n
}

// Validate reports the first problem with c, naming the field and what is
// allowed.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("model: config: "+format, args...)
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case c.TwoStage && !c.BoxRefine:
		return bad("TwoStage needs BoxRefine (the proposals' heads are box refinement's extra pair, as in the reference)")
	case c.Backbone != BackboneBasic && c.Backbone != BackboneResNet50:
		return bad("Backbone must be %q (basic) or %q, got %q", BackboneBasic, BackboneResNet50, c.Backbone)
	case c.Backbone == BackboneResNet50 && c.Stages != 4:
		return bad("Stages must be 4 with the %s backbone (its C3..C5 are stages 2 to 4), got %d", c.Backbone, c.Stages)
	case c.NumClasses < 1:
		return bad("NumClasses must be at least 1, got %d", c.NumClasses)
	case c.Width < 1 || c.Depth < 1:
		return bad("Width and Depth must be positive, got %d and %d", c.Width, c.Depth)
	case c.Stages < 3 || c.Stages > 6:
		return bad("Stages must be 3 to 6 (the last three give feature levels), got %d", c.Stages)
	case c.ImageSize < 1 || c.ImageSize%(1<<(c.Stages+2)) != 0:
		return bad("ImageSize must be a positive multiple of 2^(Stages+2) = %d (the coarsest level's stride), got %d", 1<<(c.Stages+2), c.ImageSize)
	case c.DModel < 4 || c.DModel%4 != 0:
		return bad("DModel must be a positive multiple of 4 (the sine embedding pairs sin and cos per axis), got %d", c.DModel)
	case c.Heads < 1 || c.DModel%c.Heads != 0:
		return bad("Heads must be positive and divide DModel (%d), got %d", c.DModel, c.Heads)
	case c.NormGroups < 1 || c.DModel%c.NormGroups != 0:
		return bad("NormGroups must be positive and divide DModel (%d), got %d", c.DModel, c.NormGroups)
	case c.Points < 1 || c.FFN < 1:
		return bad("Points and FFN must be positive, got %d and %d", c.Points, c.FFN)
	case !(c.Dropout >= 0 && c.Dropout < 1):
		return bad("Dropout must be in [0, 1), got %v", c.Dropout)
	case c.EncLayers < 1 || c.DecLayers < 1:
		return bad("EncLayers and DecLayers must be positive, got %d and %d", c.EncLayers, c.DecLayers)
	case c.Queries < 1:
		return bad("Queries must be positive, got %d", c.Queries)
	case c.TwoStage && c.Queries > c.Tokens():
		return bad("Queries (%d) must not exceed the encoder's %d tokens under TwoStage (the queries are the best tokens)", c.Queries, c.Tokens())
	case c.MaxDetections < 1:
		return bad("MaxDetections must be positive, got %d", c.MaxDetections)
	case !(c.FocalAlpha >= 0 && c.FocalAlpha <= 1):
		return bad("FocalAlpha must be in [0, 1], got %v", c.FocalAlpha)
	case !(c.FocalGamma >= 0) || !finite(c.FocalGamma):
		return bad("FocalGamma must be finite and non-negative, got %v", c.FocalGamma)
	}
	for _, w := range []struct {
		name string
		v    float64
	}{
		{"CostClass", c.CostClass}, {"CostBox", c.CostBox}, {"CostGIoU", c.CostGIoU},
		{"WeightClass", c.WeightClass}, {"WeightBox", c.WeightBox}, {"WeightGIoU", c.WeightGIoU},
	} {
		if !(w.v >= 0) || !finite(w.v) {
			return bad("%s must be finite and non-negative, got %v", w.name, w.v)
		}
	}
	return nil
}
