package model

import (
	"math/rand/v2"
	"testing"

	"gorgonia.org/tensor"
)

// tinyConfig is a network small enough for gradient checks and short
// training tests: 32x32 images, levels of 8x8 down to 1x1 (85 tokens),
// d_model 32, one encoder and two decoder layers, 10 queries.
func tinyConfig() Config {
	c := DefaultConfig(3)
	c.ImageSize = 32
	c.Width, c.Depth, c.Stages = 8, 1, 3
	c.DModel, c.Heads, c.Points, c.FFN, c.NormGroups = 32, 4, 2, 64, 8
	c.EncLayers, c.DecLayers, c.Queries = 1, 2, 10
	c.MaxDetections = 5
	return c
}

// tinyBatch is two images, each with coloured rectangles on grey, and
// their targets: a fixed batch the tiny network can learn.
func tinyBatch(size int) ([][]float32, []Target) {
	rng := rand.New(rand.NewPCG(7, 8))
	objs := [][]struct {
		label int
		box   Box
	}{
		{{0, Box{0.3, 0.3, 0.3, 0.4}}, {2, Box{0.7, 0.65, 0.35, 0.3}}},
		{{1, Box{0.5, 0.5, 0.5, 0.4}}},
	}
	colours := [][3]float32{{1, 0, 0}, {0, 1, 0}, {0, 0, 1}}
	var pix [][]float32
	var targets []Target
	for _, img := range objs {
		p := make([]float32, 3*size*size)
		for i := range p {
			p[i] = 0.5 + 0.05*float32(rng.Float64()-0.5)
		}
		var t Target
		for _, o := range img {
			xy := o.box.XYXY()
			for y := int(xy[1] * float64(size)); y < int(xy[3]*float64(size)); y++ {
				for x := int(xy[0] * float64(size)); x < int(xy[2]*float64(size)); x++ {
					for c := range 3 {
						p[(c*size+y)*size+x] = colours[o.label][c]
					}
				}
			}
			t.Labels = append(t.Labels, o.label)
			t.Boxes = append(t.Boxes, o.box)
		}
		pix = append(pix, p)
		targets = append(targets, t)
	}
	return pix, targets
}

func mustParams(t testing.TB, seed uint64, dt tensor.Dtype) *Params {
	t.Helper()
	p, err := newParams(seed, dt, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
