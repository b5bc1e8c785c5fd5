package train

import (
	"fmt"
	"math/rand/v2"

	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/maskrcnn/model"
)

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

// stepRNG is the random stream of iteration it's anchor and RoI sampling.
func stepRNG(seed uint64, it int) *rand.Rand {
	return rand.New(rand.NewPCG(seed^0x5a3b1e, uint64(it)))
}

// ExportSynthetic writes the synthetic dataset that a run of c trains and
// validates on (c.TrainImages then c.ValImages images of c.Model.ImageSize
// pixels, from c.Seed) to dir in COCO format, as data.ExportSynthetic does,
// and returns the number of images. Training with -data on the file holds
// out its last tenth, which is the validation images only when they are a
// tenth of the whole.
func ExportSynthetic(dir string, c RunConfig) (int, error) {
	if c.Data != "" {
		return 0, fmt.Errorf("train: ExportSynthetic: the run uses %s, not the synthetic dataset", c.Data)
	}
	return data.ExportSynthetic(dir, c.Seed, c.TrainImages, c.ValImages, c.Model.ImageSize)
}
