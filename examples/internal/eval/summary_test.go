package eval

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stheno-ml/stheno/examples/internal/data"
)

// Undefined precisions (pycocotools' -1) print as n/a and go to JSON as
// null, and come back NaN.
func TestAPs(t *testing.T) {
	for _, tc := range []struct {
		m          Metrics
		text, json string
	}{
		{Metrics{AP: 0.6691, AP50: 0.93, AP75: 0.7519}, "AP 0.669 AP50 0.930 AP75 0.752", `{"ap":0.6691,"ap50":0.93,"ap75":0.7519}`},
		{Metrics{AP: -1, AP50: -1, AP75: -1}, "AP n/a AP50 n/a AP75 n/a", `{"ap":null,"ap50":null,"ap75":null}`},
		{Metrics{AP: 0, AP50: 1, AP75: -1}, "AP 0.000 AP50 1.000 AP75 n/a", `{"ap":0,"ap50":1,"ap75":null}`},
	} {
		a := tc.m.APs()
		if got := a.String(); got != tc.text {
			t.Errorf("%+v: String() = %q, want %q", tc.m, got, tc.text)
		}
		js, err := json.Marshal(a)
		if err != nil || string(js) != tc.json {
			t.Errorf("%+v: JSON %s (%v), want %s", tc.m, js, err, tc.json)
		}
		var back APs
		if err := json.Unmarshal(js, &back); err != nil {
			t.Fatal(err)
		}
		for i, pair := range [][2]Precision{{back.AP, a.AP}, {back.AP50, a.AP50}, {back.AP75, a.AP75}} {
			if pair[0].Defined() != pair[1].Defined() || pair[0].Defined() && pair[0] != pair[1] {
				t.Errorf("%+v: precision %d read back as %v, want %v", tc.m, i, pair[0], pair[1])
			}
		}
	}
}

// Results carry the mapped category id and the box as x, y, w, h; a mask
// becomes compressed RLE, and a box detector's detections have none.
func TestCOCOResults(t *testing.T) {
	m := data.NewMask(4, 3)
	m.Bits[5], m.Bits[6] = true, true
	dets := []Detection{
		{ImageID: 7, Class: 1, Score: 0.9, Box: [4]float64{1, 1, 3, 2}, Mask: m},
		{ImageID: 8, Class: 0, Score: 0.25, Box: [4]float64{0.5, 0, 4, 2.5}},
	}
	ids := func(k int) int { return []int{40, 7}[k] }
	js, err := json.Marshal(COCOResults(dets, ids))
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"image_id":7,"category_id":7,"bbox":[1,1,2,1],"score":0.9,"segmentation":{"size":[3,4],"counts":"` +
		data.CompressRLE(data.EncodeRLE(m)) + `"}},` +
		`{"image_id":8,"category_id":40,"bbox":[0.5,0,3.5,2.5],"score":0.25}]`
	if string(js) != want {
		t.Errorf("results\n%s\nwant\n%s", js, want)
	}
	path := filepath.Join(t.TempDir(), "predictions.json")
	if err := WriteCOCOResults(path, nil, ids); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "[]" {
		t.Errorf("no detections wrote %q, want []", got)
	}
	if err := WriteCOCOResults(filepath.Join(t.TempDir(), "missing", "p.json"), dets, ids); err == nil || !strings.HasPrefix(err.Error(), "eval: ") {
		t.Errorf("writing into a missing directory: %v", err)
	}
}
