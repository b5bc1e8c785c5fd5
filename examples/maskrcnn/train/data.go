package train

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"

	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
)

// Resize returns img scaled to size x size: pixels bilinearly (pixel-centre
// aligned), masks by nearest neighbour, boxes by the same factors. An image
// of that size already is returned as is. Objects whose box collapses
// below a pixel are dropped.
func Resize(img *data.Image, size int) *data.Image {
	if img.W == size && img.H == size {
		return img
	}
	sx, sy := float64(img.W)/float64(size), float64(img.H)/float64(size)
	out := &data.Image{ID: img.ID, File: img.File, W: size, H: size, Pix: make([]float32, 3*size*size)}
	n, m := img.W*img.H, size*size
	for y := range size {
		fy := (float64(y)+0.5)*sy - 0.5
		for x := range size {
			fx := (float64(x)+0.5)*sx - 0.5
			for c := range 3 {
				out.Pix[c*m+y*size+x] = sampleBilinear(img.Pix[c*n:(c+1)*n], img.W, img.H, fx, fy)
			}
		}
	}
	for _, o := range img.Objects {
		b := model.Box{o.Box[0] / sx, o.Box[1] / sy, o.Box[2] / sx, o.Box[3] / sy}
		if b[2]-b[0] < 1 || b[3]-b[1] < 1 {
			continue
		}
		no := data.Object{Class: o.Class, Box: b, Crowd: o.Crowd}
		if o.Mask != nil {
			no.Mask = data.NewMask(size, size)
			for y := range size {
				my := min(int((float64(y)+0.5)*sy), img.H-1)
				for x := range size {
					no.Mask.Bits[y*size+x] = o.Mask.At(min(int((float64(x)+0.5)*sx), img.W-1), my)
				}
			}
		}
		out.Objects = append(out.Objects, no)
	}
	return out
}

func sampleBilinear(p []float32, w, h int, x, y float64) float32 {
	x = min(max(x, 0), float64(w-1))
	y = min(max(y, 0), float64(h-1))
	x0, y0 := int(x), int(y)
	x1, y1 := min(x0+1, w-1), min(y0+1, h-1)
	fx, fy := float32(x-float64(x0)), float32(y-float64(y0))
	top := p[y0*w+x0]*(1-fx) + p[y0*w+x1]*fx
	bot := p[y1*w+x0]*(1-fx) + p[y1*w+x1]*fx
	return top*(1-fy) + bot*fy
}

// Flip returns img mirrored left to right.
func Flip(img *data.Image) *data.Image {
	w, h := img.W, img.H
	out := &data.Image{ID: img.ID, File: img.File, W: w, H: h, Pix: make([]float32, len(img.Pix))}
	for c := range 3 {
		for y := range h {
			src := img.Pix[(c*h+y)*w : (c*h+y+1)*w]
			dst := out.Pix[(c*h+y)*w : (c*h+y+1)*w]
			for x, v := range src {
				dst[w-1-x] = v
			}
		}
	}
	for _, o := range img.Objects {
		no := data.Object{Class: o.Class, Crowd: o.Crowd,
			Box: [4]float64{float64(w) - o.Box[2], o.Box[1], float64(w) - o.Box[0], o.Box[3]}}
		if o.Mask != nil {
			no.Mask = data.NewMask(o.Mask.W, o.Mask.H)
			for y := range o.Mask.H {
				for x := range o.Mask.W {
					no.Mask.Bits[y*o.Mask.W+x] = o.Mask.Bits[y*o.Mask.W+o.Mask.W-1-x]
				}
			}
		}
		out.Objects = append(out.Objects, no)
	}
	return out
}

// TargetOf is an image's ground truth as the model trains on it. Crowd
// regions and boxes thinner than a pixel are left out: neither makes a
// useful training target.
func TargetOf(img *data.Image) model.Target {
	var t model.Target
	for _, o := range img.Objects {
		if o.Crowd || o.Box[2]-o.Box[0] < 1 || o.Box[3]-o.Box[1] < 1 {
			continue
		}
		t.Boxes = append(t.Boxes, o.Box)
		t.Classes = append(t.Classes, o.Class)
		t.Masks = append(t.Masks, o.Mask)
	}
	return t
}

// batchOf returns the images of iteration it: the training set is visited
// in a fresh random order every epoch (slot j = it*batch+b of the sequence
// is image perm_epoch[j % len]), each image mirrored with probability 1/2.
// Everything depends on the seed and it alone, so a resumed run sees the
// batches the uninterrupted run would have.
func batchOf(images []*data.Image, seed uint64, it, batch int) []*data.Image {
	out := make([]*data.Image, batch)
	var perm []int
	permEpoch := -1
	for b := range batch {
		j := it*batch + b
		epoch := j / len(images)
		if epoch != permEpoch {
			perm = rand.New(rand.NewPCG(seed, uint64(epoch)<<1|1)).Perm(len(images))
			permEpoch = epoch
		}
		img := images[perm[j%len(images)]]
		if rand.New(rand.NewPCG(seed^0xf11b, uint64(j))).IntN(2) == 1 {
			img = Flip(img)
		}
		out[b] = img
	}
	return out
}

// stepRNG is the random stream of iteration it's anchor and RoI sampling.
func stepRNG(seed uint64, it int) *rand.Rand {
	return rand.New(rand.NewPCG(seed^0x5a3b1e, uint64(it)))
}

// loadData returns the training and validation sets, resized to the model's
// input size: the synthetic dataset (trainCount and valCount images from
// two disjoint streams of the seed) when path is empty, else the COCO
// annotations file at path, whose last tenth (at least one image) is held
// out for validation. Training images without a single object are an
// error.
func loadData(path string, seed uint64, trainCount, valCount, size int) (train, val *data.Dataset, err error) {
	if path == "" {
		cfg := data.DefaultSynthetic(seed, trainCount)
		cfg.Size = size
		if train, err = data.Synthetic(cfg); err != nil {
			return nil, nil, err
		}
		cfg = data.DefaultSynthetic(seed^0x7a1, valCount)
		cfg.Size = size
		if val, err = data.Synthetic(cfg); err != nil {
			return nil, nil, err
		}
		return train, val, nil
	}
	all, err := readCOCO(path)
	if err != nil {
		return nil, nil, err
	}
	if len(all.Images) < 2 {
		return nil, nil, fmt.Errorf("train: %s has %d images; training and validation need at least 2", path, len(all.Images))
	}
	if len(all.Classes) == 0 {
		return nil, nil, fmt.Errorf("train: %s has no categories", path)
	}
	nVal := max(1, int(math.Round(float64(len(all.Images))/10)))
	cut := len(all.Images) - nVal
	train = &data.Dataset{Classes: all.Classes, CategoryIDs: all.CategoryIDs, ClippedBoxes: all.ClippedBoxes}
	val = &data.Dataset{Classes: all.Classes, CategoryIDs: all.CategoryIDs}
	for i, img := range all.Images {
		r := Resize(img, size)
		if i < cut {
			train.Images = append(train.Images, r)
		} else {
			val.Images = append(val.Images, r)
		}
	}
	if train.CountObjects() == 0 {
		return nil, nil, fmt.Errorf("train: the training images of %s (the first %d) have no annotations that are not crowd regions: nothing to learn from", path, cut)
	}
	return train, val, nil
}

// readCOCO reads a COCO annotations file, with its images from the
// "images" directory beside it when there is one (the layout
// data.WriteCOCO makes) and from the file's own directory otherwise.
func readCOCO(path string) (*data.Dataset, error) {
	dir := filepath.Join(filepath.Dir(path), "images")
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		dir = ""
	}
	return data.ReadCOCO(path, dir)
}

// ExportSynthetic writes the synthetic dataset that a run of c trains and
// validates on (c.TrainImages then c.ValImages images of c.Model.ImageSize
// pixels, from c.Seed) to dir in COCO format, as data.WriteCOCO lays it
// out, and returns the number of images. The validation images are
// renumbered to follow the training ones. Training with -data on the file
// holds out its last tenth, which is the validation images only when they
// are a tenth of the whole.
func ExportSynthetic(dir string, c RunConfig) (int, error) {
	if c.Data != "" {
		return 0, fmt.Errorf("train: ExportSynthetic: the run uses %s, not the synthetic dataset", c.Data)
	}
	trainSet, valSet, err := loadData("", c.Seed, c.TrainImages, c.ValImages, c.Model.ImageSize)
	if err != nil {
		return 0, err
	}
	all := &data.Dataset{Classes: trainSet.Classes, CategoryIDs: trainSet.CategoryIDs, Images: slices.Clone(trainSet.Images)}
	for i, img := range valSet.Images {
		renumbered := *img
		// A new id, and the file name that goes with it: the synthetic
		// sets name their files after their own ids.
		renumbered.ID = len(trainSet.Images) + i + 1
		renumbered.File = fmt.Sprintf("%06d.png", renumbered.ID)
		all.Images = append(all.Images, &renumbered)
	}
	if err := data.WriteCOCO(all, dir); err != nil {
		return 0, err
	}
	return len(all.Images), nil
}
