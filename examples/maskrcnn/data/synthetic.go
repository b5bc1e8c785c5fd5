package data

import "errors"

// The synthetic dataset's classes, indexing its Dataset.Classes.
const (
	Circle = iota
	Square
	Triangle
)

// SyntheticClasses are the class names of the synthetic dataset.
var SyntheticClasses = []string{"circle", "square", "triangle"}

// SyntheticConfig configures Synthetic. Zero Size, MinObjects and MaxObjects
// take the defaults of DefaultSynthetic.
type SyntheticConfig struct {
	// Seed determines the dataset: the same config gives the same images.
	Seed uint64
	// Count is the number of images.
	Count int
	// Size is the side of the square images in pixels (default 64).
	Size int
	// MinObjects and MaxObjects bound the number of objects drawn in an
	// image (default 2 and 4). Heavily occluded objects are dropped, so an
	// image may end up with fewer than MinObjects annotated objects.
	MinObjects, MaxObjects int
}

// DefaultSynthetic returns the configuration meant for training on a CPU:
// 64x64 images with 2 to 4 objects of 12 to 40 pixels.
func DefaultSynthetic(seed uint64, count int) SyntheticConfig {
	return SyntheticConfig{Seed: seed, Count: count, Size: 64, MinObjects: 2, MaxObjects: 4}
}

// Synthetic generates the synthetic dataset described by cfg.
func Synthetic(cfg SyntheticConfig) (*Dataset, error) {
	return nil, errors.New("data: Synthetic: not implemented yet")
}
