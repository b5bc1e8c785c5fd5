package data

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// Load returns the training and validation sets of a run, resized to size
// x size pixels, the model's input: the synthetic dataset (trainCount and valCount images from
// two disjoint streams of the seed) when path is empty, else the COCO
// annotations file at path, whose last tenth (at least one image) is held
// out for validation. Training images without a single object are an
// error.
func Load(path string, seed uint64, trainCount, valCount, size int) (train, val *Dataset, err error) {
	if path == "" {
		cfg := DefaultSynthetic(seed, trainCount)
		cfg.Size = size
		if train, err = Synthetic(cfg); err != nil {
			return nil, nil, err
		}
		cfg = DefaultSynthetic(seed^0x7a1, valCount)
		cfg.Size = size
		if val, err = Synthetic(cfg); err != nil {
			return nil, nil, err
		}
		return train, val, nil
	}
	all, err := readCOCO(path)
	if err != nil {
		return nil, nil, err
	}
	if len(all.Images) < 2 {
		return nil, nil, fmt.Errorf("data: %s has %d images; training and validation need at least 2", path, len(all.Images))
	}
	if len(all.Classes) == 0 {
		return nil, nil, fmt.Errorf("data: %s has no categories", path)
	}
	nVal := max(1, int(math.Round(float64(len(all.Images))/10)))
	cut := len(all.Images) - nVal
	train = &Dataset{Classes: all.Classes, CategoryIDs: all.CategoryIDs, ClippedBoxes: all.ClippedBoxes}
	val = &Dataset{Classes: all.Classes, CategoryIDs: all.CategoryIDs}
	for i, img := range all.Images {
		r := Resize(img, size)
		if i < cut {
			train.Images = append(train.Images, r)
		} else {
			val.Images = append(val.Images, r)
		}
	}
	if train.CountObjects() == 0 {
		return nil, nil, fmt.Errorf("data: the training images of %s (the first %d) have no annotations that are not crowd regions: nothing to learn from", path, cut)
	}
	return train, val, nil
}

// readCOCO reads a COCO annotations file, with its images from the
// "images" directory beside it when there is one (the layout
// WriteCOCO makes) and from the file's own directory otherwise.
func readCOCO(path string) (*Dataset, error) {
	dir := filepath.Join(filepath.Dir(path), "images")
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		dir = ""
	}
	return ReadCOCO(path, dir)
}

// ExportSynthetic writes the synthetic dataset that Load gives a run
// without a path (trainCount then valCount images of size x size pixels,
// from seed) to dir in COCO format, as WriteCOCO lays it out, and returns
// the number of images. The validation images are renumbered to follow
// the training ones. Load on the file holds out its last tenth, which is
// the validation images only when they are a tenth of the whole.
func ExportSynthetic(dir string, seed uint64, trainCount, valCount, size int) (int, error) {
	trainSet, valSet, err := Load("", seed, trainCount, valCount, size)
	if err != nil {
		return 0, err
	}
	all := &Dataset{Classes: trainSet.Classes, CategoryIDs: trainSet.CategoryIDs, Images: slices.Clone(trainSet.Images)}
	for i, img := range valSet.Images {
		renumbered := *img
		// A new id, and the file name that goes with it: the synthetic
		// sets name their files after their own ids.
		renumbered.ID = len(trainSet.Images) + i + 1
		renumbered.File = fmt.Sprintf("%06d.png", renumbered.ID)
		all.Images = append(all.Images, &renumbered)
	}
	if err := WriteCOCO(all, dir); err != nil {
		return 0, err
	}
	return len(all.Images), nil
}
