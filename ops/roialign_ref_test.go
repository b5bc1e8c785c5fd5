package ops

import (
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
)

// roiAlignRef is one case of testdata/roialign.json, written by
// testdata/gen_roialign.py from torchvision.ops.roi_align.
type roiAlignRef struct {
	Name          string    `json:"name"`
	XShape        []int     `json:"x_shape"`
	X             []float64 `json:"x"`
	RoIs          []float64 `json:"rois"`
	K             int       `json:"k"`
	PooledH       int       `json:"pooled_h"`
	PooledW       int       `json:"pooled_w"`
	SpatialScale  float64   `json:"spatial_scale"`
	SamplingRatio int       `json:"sampling_ratio"`
	Aligned       bool      `json:"aligned"`
	Out           []float64 `json:"out"`
	Proj          []float64 `json:"proj"`
	GradX         []float64 `json:"grad_x"`
}

// RoIAlign matches torchvision on cases generated independently of this
// package, forward and backward, in float64 and float32.
func TestRoIAlignMatchesTorchvision(t *testing.T) {
	var ref struct {
		Cases []roiAlignRef `json:"cases"`
	}
	loadJSON(t, "testdata/roialign.json", &ref)
	if len(ref.Cases) == 0 {
		t.Fatal("no cases in testdata/roialign.json")
	}
	for _, c := range ref.Cases {
		cfg := RoIAlignConfig{PooledH: c.PooledH, PooledW: c.PooledW, SpatialScale: c.SpatialScale,
			SamplingRatio: c.SamplingRatio, Aligned: c.Aligned}
		for _, dt := range []tensor.Dtype{tensor.Float64, tensor.Float32} {
			t.Run(c.Name+"/"+dt.String(), func(t *testing.T) {
				tol := autograd.TolForward64
				if dt == tensor.Float32 {
					tol = autograd.TolForward32
				}
				x := fromFloat64s(dt, c.X, c.XShape...)
				rois := fromFloat64s(dt, c.RoIs, c.K, 5)
				got, _, err := runGraph(t, []*tensor.Dense{x, rois}, roiAlign(cfg))
				if err != nil {
					t.Fatal(err)
				}
				if err := tol.Compare(got, c.Out); err != nil {
					t.Errorf("forward: %v", err)
				}
				proj := fromFloat64s(dt, c.Proj, c.K, c.XShape[1], c.PooledH, c.PooledW)
				grads := gradOf(t, []*tensor.Dense{x, rois}, proj, []int{0}, func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
					return RoIAlign(in[0], in[1], cfg)
				})
				if err := tol.Compare(grads[0], c.GradX); err != nil {
					t.Errorf("backward: %v", err)
				}
			})
		}
	}
}
