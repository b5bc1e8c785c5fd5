package model

import (
	"fmt"
	"math"
)

// Backbones.
const (
	// BackboneBasic (the zero value, "") is a small ResNet of basic blocks:
	// a stride-2 3x3 stem of Width channels, then three stages of Depth
	// blocks of 2*Width, 4*Width and 8*Width channels, ending at strides 4,
	// 8 and 16. Small images (64 pixels) leave no room for the coarser
	// levels of a full-size Mask R-CNN.
	BackboneBasic = ""
	// BackboneResNet50 is torchvision's ResNet-50 (v1.5: the stride on the
	// 3x3 convolution) with trainable BatchNorm, as
	// maskrcnn_resnet50_fpn builds it without pretrained weights: a 7x7
	// stride-2 stem of Width (64) channels and a 3x3 stride-2 max pooling,
	// then stages of 3, 4, 6 and 3 bottleneck blocks of Width, 2*Width,
	// 4*Width and 8*Width channels (four times that out), ending at strides
	// 4, 8, 16 and 32. Depth is not used.
	BackboneResNet50 = "resnet50"
)

// Config describes the network and its training-time sampling. The zero
// value is not usable; start from DefaultConfig.
type Config struct {
	// ImageSize is the side of the square input images, a multiple of 16.
	ImageSize  int
	NumClasses int // foreground classes; the model adds background as class 0

	// Backbone is BackboneBasic or BackboneResNet50, of Width (and for
	// the basic one Depth) as they say.
	Backbone     string
	Width, Depth int
	FPNChannels  int // channels of every pyramid level
	// ExtraLevel adds a pyramid level above the backbone's coarsest, its
	// max pooling by 2 (FPN's P6, torchvision's LastLevelMaxPool), which
	// only the RPN reads.
	ExtraLevel bool

	// Anchors: one size (in pixels) per level, each with every ratio
	// (height/width).
	AnchorSizes  []float64
	AnchorRatios []float64

	// RPN training: anchors with IoU >= RPNFgIoU to a ground-truth box are
	// positive, below RPNBgIoU negative (the best anchors of each box are
	// positive too); RPNBatch anchors per image are sampled, at most half
	// positive.
	RPNFgIoU, RPNBgIoU float64
	RPNBatch           int
	// Proposals: the RPNPreNMS best-scored boxes of each level are decoded,
	// NMS'd at RPNNMS, and the best RPNPostNMSTrain (RPNPostNMSTest at
	// inference) of the image kept.
	RPNPreNMS, RPNPostNMSTrain, RPNPostNMSTest int
	RPNNMS                                     float64

	// RoI heads, training: RoIsPerImage proposals (and ground-truth boxes)
	// per image, at most RoIPositiveFraction of them foreground (IoU >=
	// RoIFgIoU); the mask head sees at most MaskRoIsPerImage of the
	// foreground RoIs.
	RoIsPerImage        int
	RoIPositiveFraction float64
	RoIFgIoU            float64
	MaskRoIsPerImage    int

	// RoIs are pooled from the level MultiLevelRoIAlign assigns them: a RoI
	// of side CanonicalSize from level CanonicalLevel (0 is P2), one level
	// coarser per doubling.
	CanonicalSize  float64
	CanonicalLevel int

	// Box head: RoIAlign to PoolSize x PoolSize, two fully connected layers
	// of BoxHeadDim.
	PoolSize, BoxHeadDim int
	// Mask head: RoIAlign to MaskPoolSize x MaskPoolSize, MaskConvs 3x3
	// ConvBN layers of MaskChannels (convolutions with a bias and ReLU,
	// no BatchNorm, when MaskConvBias: torchvision's MaskRCNNHeads), a 2x2
	// stride-2 transposed convolution (masks of 2*MaskPoolSize), and a 1x1
	// convolution per class.
	MaskPoolSize, MaskConvs, MaskChannels int
	MaskConvBias                          bool

	// Detection: boxes scoring at least ScoreThresh, NMS'd per class at
	// DetNMS, at most MaxDetections per image.
	ScoreThresh, DetNMS float64
	MaxDetections       int
}

// DefaultConfig is the configuration the example trains on a CPU in about
// ten minutes: 64x64 images with objects of 12 to 40 pixels.
func DefaultConfig(numClasses, imageSize int) Config {
	return Config{
		ImageSize: imageSize, NumClasses: numClasses,
		Width: 16, Depth: 1, FPNChannels: 64,
		AnchorSizes:  []float64{12, 24, 48},
		AnchorRatios: []float64{0.5, 1, 2},
		RPNFgIoU:     0.7, RPNBgIoU: 0.3, RPNBatch: 256,
		RPNPreNMS: 400, RPNPostNMSTrain: 200, RPNPostNMSTest: 100, RPNNMS: 0.7,
		RoIsPerImage: 32, RoIPositiveFraction: 0.25, RoIFgIoU: 0.5, MaskRoIsPerImage: 4,
		// A RoI spans 3.5 to 7 cells of its level, about the 7x7 grid it is
		// pooled to (the FPN paper's 224 pixels at stride 16 is 14 cells).
		CanonicalSize: 56, CanonicalLevel: 1,
		PoolSize: 7, BoxHeadDim: 256,
		MaskPoolSize: 14, MaskConvs: 2, MaskChannels: 32,
		ScoreThresh: 0.05, DetNMS: 0.5, MaxDetections: 20,
	}
}

// R50FPNConfig is torchvision's maskrcnn_resnet50_fpn layer for layer,
// with its default counts, for numClasses foreground classes on square
// images of imageSize: ResNet-50 with trainable BatchNorm, FPN P2-P6 of
// 256 channels, anchors of 32 to 512 pixels at three ratios, RPN
// pre/post-NMS 2000/2000 in training and 1000/1000 at inference, 512 RoIs
// per image at 25% positives (up to 128 of them with masks), a 1024-wide
// box head, four 256-channel mask convolutions and the deconvolution to
// 28x28 masks, 100 detections per image.
func R50FPNConfig(numClasses, imageSize int) Config {
	return Config{
		ImageSize: imageSize, NumClasses: numClasses,
		Backbone: BackboneResNet50, Width: 64, Depth: 1, FPNChannels: 256, ExtraLevel: true,
		AnchorSizes:  []float64{32, 64, 128, 256, 512},
		AnchorRatios: []float64{0.5, 1, 2},
		RPNFgIoU:     0.7, RPNBgIoU: 0.3, RPNBatch: 256,
		RPNPreNMS: 2000, RPNPostNMSTrain: 2000, RPNPostNMSTest: 1000, RPNNMS: 0.7,
		RoIsPerImage: 512, RoIPositiveFraction: 0.25, RoIFgIoU: 0.5, MaskRoIsPerImage: 128,
		// torchvision's LevelMapper: 224 pixels on P4 (k0 = 4).
		CanonicalSize: 224, CanonicalLevel: 2,
		PoolSize: 7, BoxHeadDim: 1024,
		MaskPoolSize: 14, MaskConvs: 4, MaskChannels: 256, MaskConvBias: true,
		ScoreThresh: 0.05, DetNMS: 0.5, MaxDetections: 100,
	}
}

// Strides are the pyramid levels' strides: the backbone's stages', then
// the extra level's.
func (c Config) Strides() []int {
	s := []int{4, 8, 16}
	if c.Backbone == BackboneResNet50 {
		s = append(s, 32)
	}
	if c.ExtraLevel {
		s = append(s, 2*s[len(s)-1])
	}
	return s
}

// PoolLevels is the number of pyramid levels RoIs are pooled from: the
// backbone's (the extra level feeds the RPN only).
func (c Config) PoolLevels() int {
	n := len(c.Strides())
	if c.ExtraLevel {
		n--
	}
	return n
}

// MaskSize is the side of the predicted masks.
func (c Config) MaskSize() int { return 2 * c.MaskPoolSize }

// NumAnchors is the number of anchors per position of each level.
func (c Config) NumAnchors() int { return len(c.AnchorRatios) }

// LevelSize is the side of level l's feature map.
func (c Config) LevelSize(l int) int { return c.ImageSize / c.Strides()[l] }

// Validate reports the first problem with c.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("model: config: "+format, args...)
	}
	strides := c.Strides()
	top := strides[len(strides)-1]
	switch {
	case c.Backbone != BackboneBasic && c.Backbone != BackboneResNet50:
		return bad("Backbone must be %q or %q, got %q", BackboneBasic, BackboneResNet50, c.Backbone)
	case c.ImageSize < 32 || c.ImageSize%top != 0:
		return bad("ImageSize must be a multiple of %d (the coarsest level's stride) and at least 32, got %d", top, c.ImageSize)
	case c.NumClasses < 1:
		return bad("NumClasses must be at least 1, got %d", c.NumClasses)
	case c.Width < 1 || c.Depth < 1 || c.FPNChannels < 1:
		return bad("Width, Depth and FPNChannels must be positive, got %d, %d, %d", c.Width, c.Depth, c.FPNChannels)
	case len(c.AnchorSizes) != len(strides):
		return bad("AnchorSizes needs one size per level (%d), got %d", len(strides), len(c.AnchorSizes))
	case len(c.AnchorRatios) == 0:
		return bad("AnchorRatios is empty")
	case !(c.RPNBgIoU <= c.RPNFgIoU && c.RPNBgIoU >= 0 && c.RPNFgIoU <= 1):
		return bad("need 0 <= RPNBgIoU <= RPNFgIoU <= 1, got %v and %v", c.RPNBgIoU, c.RPNFgIoU)
	case c.RPNBatch < 1 || c.RPNPreNMS < 1 || c.RPNPostNMSTrain < 1 || c.RPNPostNMSTest < 1:
		return bad("RPN counts must be positive")
	case !(c.RPNNMS > 0 && c.RPNNMS <= 1) || !(c.DetNMS > 0 && c.DetNMS <= 1):
		return bad("NMS thresholds must be in (0, 1]")
	case c.RoIsPerImage < 1 || c.MaskRoIsPerImage < 1 || c.MaxDetections < 1:
		return bad("RoIsPerImage, MaskRoIsPerImage and MaxDetections must be positive")
	case !(c.RoIPositiveFraction > 0 && c.RoIPositiveFraction <= 1) || !(c.RoIFgIoU > 0 && c.RoIFgIoU <= 1):
		return bad("RoIPositiveFraction and RoIFgIoU must be in (0, 1]")
	case c.PoolSize < 1 || c.BoxHeadDim < 1 || c.MaskPoolSize < 1 || c.MaskConvs < 0 || c.MaskChannels < 1:
		return bad("head sizes must be positive")
	case !(c.CanonicalSize > 0) || c.CanonicalLevel < 0 || c.CanonicalLevel >= c.PoolLevels():
		return bad("CanonicalSize must be positive and CanonicalLevel in [0, %d)", c.PoolLevels())
	case !(c.ScoreThresh >= 0 && c.ScoreThresh < 1):
		return bad("ScoreThresh must be in [0, 1), got %v", c.ScoreThresh)
	}
	for _, s := range append(append([]float64{}, c.AnchorSizes...), c.AnchorRatios...) {
		if !(s > 0) || math.IsInf(s, 0) {
			return bad("anchor sizes and ratios must be positive, got %v and %v", c.AnchorSizes, c.AnchorRatios)
		}
	}
	return nil
}
