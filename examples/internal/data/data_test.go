package data

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// maskFrom builds a mask from rows of '#' (set) and '.' (unset).
func maskFrom(rows ...string) *Mask {
	m := NewMask(len(rows[0]), len(rows))
	for y, r := range rows {
		for x, c := range r {
			m.Bits[y*m.W+x] = c == '#'
		}
	}
	return m
}

func maskString(m *Mask) string {
	var b strings.Builder
	for y := range m.H {
		for x := range m.W {
			if m.At(x, y) {
				b.WriteByte('#')
			} else {
				b.WriteByte('.')
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func TestBoxOfAndArea(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    *Mask
		box  [4]float64
		area int
	}{
		{"empty", maskFrom("...", "..."), [4]float64{}, 0},
		{"nil", nil, [4]float64{}, 0},
		{"one pixel", maskFrom("...", "..#"), [4]float64{2, 1, 3, 2}, 1},
		{"two corners", maskFrom("...#", "....", ".#.."), [4]float64{1, 0, 4, 3}, 2},
		{"full", maskFrom("##", "##"), [4]float64{0, 0, 2, 2}, 4},
	} {
		if got := BoxOf(tc.m); got != tc.box {
			t.Errorf("%s: BoxOf = %v, want %v", tc.name, got, tc.box)
		}
		if got := tc.m.Area(); got != tc.area {
			t.Errorf("%s: Area = %d, want %d", tc.name, got, tc.area)
		}
	}
}

func TestRLE(t *testing.T) {
	for _, tc := range []struct {
		name   string
		m      *Mask
		counts []int
	}{
		// Column-major: column 0 is (0,0),(0,1) = 1,1; column 1 is 0,1;
		// column 2 is 0,0. Runs: 0 unset, 2 set, 1 unset, 1 set, 2 unset.
		{"3x2", maskFrom("#..", "##."), []int{0, 2, 1, 1, 2}},
		{"empty", maskFrom("..", ".."), []int{4}},
		{"full", maskFrom("##", "##"), []int{0, 4}},
		// Column 0 = 0,1,1; column 1 = 1,0,0.
		{"2x3", maskFrom(".#", "#.", "#."), []int{1, 3, 2}},
		{"last pixel", maskFrom("..", ".#"), []int{3, 1}},
	} {
		got := EncodeRLE(tc.m)
		if !reflect.DeepEqual(got, tc.counts) {
			t.Errorf("%s: EncodeRLE = %v, want %v", tc.name, got, tc.counts)
		}
		back, err := DecodeRLE(tc.counts, tc.m.W, tc.m.H)
		if err != nil {
			t.Errorf("%s: DecodeRLE: %v", tc.name, err)
			continue
		}
		if !reflect.DeepEqual(back, tc.m) {
			t.Errorf("%s: DecodeRLE =\n%swant\n%s", tc.name, maskString(back), maskString(tc.m))
		}
	}
}

func TestDecodeRLEErrors(t *testing.T) {
	for _, tc := range []struct {
		counts []int
		w, h   int
		want   string
	}{
		{[]int{1, 2}, 2, 2, "sum to 3"},
		{[]int{3, 2}, 2, 2, "sum to"},
		{[]int{5, -1}, 2, 2, "negative"},
		{[]int{4}, -2, -2, "negative"},
	} {
		_, err := DecodeRLE(tc.counts, tc.w, tc.h)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("DecodeRLE(%v, %d, %d) = %v, want an error with %q", tc.counts, tc.w, tc.h, err, tc.want)
		}
	}
}

// The compressed strings are worked out by hand from pycocotools'
// rleToString: counts from the fourth on are differences to the count two
// before; each number goes out as 5-bit groups, low first, as '0'+group,
// with 0x20 on every group but the last, and the last group's 0x10 bit is
// the sign.
func TestCompressRLE(t *testing.T) {
	for _, tc := range []struct {
		counts []int
		s      string
	}{
		{nil, ""},
		{[]int{3}, "3"}, // 3 fits one group: '0'+3
		{[]int{15}, "?"},
		// 16 has the sign bit set in one group, so it needs a second: 16|0x20
		// = 48 -> '`', then 0 -> '0'.
		{[]int{16}, "`0"},
		// 100 = 3<<5 | 4: 4|0x20 = 36 -> 'T', then 3 -> '3'.
		{[]int{100}, "T3"},
		// The fourth count is stored as 7-5 = 2.
		{[]int{0, 5, 2, 7}, "0522"},
		// 10 -> ':'; the fourth is 3-10 = -7, whose low 5 bits 11001 = 25
		// carry the sign: 'I'.
		{[]int{1, 10, 2, 3}, "1:2I"},
		// 2-100 = -98 = -4<<5 | 30: 30|0x20 = 62 -> 'n', then -4 & 31 = 28
		// -> 'L'.
		{[]int{0, 100, 0, 2}, "0T30nL"},
		// The third count is not differenced (pycocotools' i>2): 40 =
		// 1<<5 | 8 gives 8|0x20 = 40 -> 'X', then '1'; the fourth is 1-1 = 0.
		{[]int{1, 1, 40, 1}, "11X10"},
	} {
		if got := CompressRLE(tc.counts); got != tc.s {
			t.Errorf("CompressRLE(%v) = %q, want %q", tc.counts, got, tc.s)
		}
		back, err := DecompressRLE(tc.s)
		if err != nil {
			t.Errorf("DecompressRLE(%q): %v", tc.s, err)
			continue
		}
		if len(back) != len(tc.counts) || (len(back) > 0 && !reflect.DeepEqual(back, tc.counts)) {
			t.Errorf("DecompressRLE(%q) = %v, want %v", tc.s, back, tc.counts)
		}
	}
}

func TestDecompressRLEErrors(t *testing.T) {
	for _, tc := range []struct{ s, want string }{
		{"T", "cut short"},        // 0x20 set: another group must follow
		{"3 ", "outside"},         // a space is not a group
		{"I", "negative"},         // -7 as a first count
		{"0522~", "outside"},      // '~' is past '0'+63
		{"oooooooooooo3", "long"}, // more groups than an int64 holds
	} {
		_, err := DecompressRLE(tc.s)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("DecompressRLE(%q) = %v, want an error with %q", tc.s, err, tc.want)
		}
	}
}

func TestRLERoundTripSynthetic(t *testing.T) {
	ds, err := Synthetic(DefaultSynthetic(3, 10))
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range ds.Images {
		for i, o := range img.Objects {
			counts, err := DecompressRLE(CompressRLE(EncodeRLE(o.Mask)))
			if err != nil {
				t.Fatalf("image %d object %d: %v", img.ID, i, err)
			}
			m, err := DecodeRLE(counts, o.Mask.W, o.Mask.H)
			if err != nil || !reflect.DeepEqual(m, o.Mask) {
				t.Fatalf("image %d object %d: mask changed through RLE (%v)", img.ID, i, err)
			}
		}
	}
}

func TestRasterizePolygon(t *testing.T) {
	for _, tc := range []struct {
		name string
		poly []float64
		w, h int
		want []string
	}{
		{"rectangle with integer corners", []float64{1, 1, 4, 1, 4, 3, 1, 3}, 5, 4,
			[]string{".....", ".###.", ".###.", "....."}},
		{"same rectangle clockwise", []float64{1, 1, 1, 3, 4, 3, 4, 1}, 5, 4,
			[]string{".....", ".###.", ".###.", "....."}},
		// Centres on the left/top edges are in, on the right/bottom out.
		{"rectangle through centres", []float64{0.5, 0.5, 2.5, 0.5, 2.5, 2.5, 0.5, 2.5}, 4, 4,
			[]string{"##..", "##..", "....", "...."}},
		// Row y: the centre line y+0.5 meets the hypotenuse x+y=4 at
		// x = 3.5-y, which is a pixel centre and so excluded: x < 3-y.
		{"right triangle", []float64{0, 0, 4, 0, 0, 4}, 4, 4,
			[]string{"###.", "##..", "#...", "...."}},
		{"sub-pixel sliver misses every centre", []float64{1.1, 0, 1.4, 0, 1.4, 3, 1.1, 3}, 3, 3,
			[]string{"...", "...", "..."}},
		{"clipped to the mask", []float64{-5, -5, 2, -5, 2, 2, -5, 2}, 3, 3,
			[]string{"##.", "##.", "..."}},
		// A diamond with its vertices on pixel centres: the tie rule keeps
		// the left vertex and drops the top, right and bottom ones (each
		// is on a right or bottom edge of its span).
		{"diamond", []float64{2.5, 0.5, 4.5, 2.5, 2.5, 4.5, 0.5, 2.5}, 5, 5,
			[]string{".....", ".##..", "####.", ".##..", "....."}},
	} {
		m, err := RasterizePolygon(tc.poly, tc.w, tc.h)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got, want := maskString(m), strings.Join(tc.want, "\n")+"\n"; got != want {
			t.Errorf("%s: got\n%swant\n%s", tc.name, got, want)
		}
	}
}

func TestRasterizePolygonEvenOdd(t *testing.T) {
	// A pentagram: under the even-odd rule its central pentagon is crossed
	// twice and stays empty; its points are filled.
	var poly []float64
	for i := range 5 {
		a := -math.Pi/2 + float64(2*i)*2*math.Pi/5
		poly = append(poly, 10.5+10*math.Cos(a), 10.5+10*math.Sin(a))
	}
	m, err := RasterizePolygon(poly, 21, 21)
	if err != nil {
		t.Fatal(err)
	}
	if m.At(10, 10) {
		t.Errorf("centre of the pentagram is set; even-odd leaves it empty\n%s", maskString(m))
	}
	if !m.At(10, 3) {
		t.Errorf("top point of the pentagram is not set\n%s", maskString(m))
	}
}

func TestRasterizePolygonErrors(t *testing.T) {
	for _, poly := range [][]float64{nil, {1, 2, 3, 4}, {1, 2, 3, 4, 5}, {0, 0, 1, 0, math.NaN(), 1}} {
		if _, err := RasterizePolygon(poly, 4, 4); err == nil {
			t.Errorf("RasterizePolygon(%v): no error", poly)
		}
	}
}

func TestSyntheticDeterministic(t *testing.T) {
	a, err := Synthetic(DefaultSynthetic(42, 5))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Synthetic(DefaultSynthetic(42, 5))
	if !reflect.DeepEqual(a, b) {
		t.Error("same config, different datasets")
	}
	// Image i depends on the seed and i alone.
	c, _ := Synthetic(DefaultSynthetic(42, 8))
	if !reflect.DeepEqual(a.Images, c.Images[:5]) {
		t.Error("the first 5 of 8 images differ from a dataset of 5")
	}
	d, _ := Synthetic(DefaultSynthetic(43, 5))
	if reflect.DeepEqual(a.Images[0].Pix, d.Images[0].Pix) {
		t.Error("seeds 42 and 43 give the same first image")
	}
}

func TestSyntheticInvariants(t *testing.T) {
	for _, cfg := range []SyntheticConfig{
		DefaultSynthetic(7, 40),
		{Seed: 1, Count: 10, Size: 32, MinObjects: 1, MaxObjects: 6},
		{Seed: 2, Count: 3, Size: 96}, // defaults for the object counts
	} {
		name := fmt.Sprintf("%+v", cfg)
		ds, err := Synthetic(cfg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(ds.Classes, []string{"circle", "square", "triangle"}) {
			t.Fatalf("%s: classes %v", name, ds.Classes)
		}
		maxObjects := max(cfg.MaxObjects, 4)
		seen := make([]int, 3)
		for i, img := range ds.Images {
			s := cfg.Size
			if img.ID != i+1 || img.W != s || img.H != s || len(img.Pix) != 3*s*s {
				t.Fatalf("%s: image %d: id %d, %dx%d, %d values", name, i, img.ID, img.W, img.H, len(img.Pix))
			}
			for _, v := range img.Pix {
				if q := v * 255; !(v >= 0 && v <= 1) || level(uint8(math.Round(float64(q)))) != v {
					t.Fatalf("%s: image %d: pixel value %v is not an 8-bit level", name, img.ID, v)
				}
			}
			if len(img.Objects) > maxObjects {
				t.Errorf("%s: image %d has %d objects", name, img.ID, len(img.Objects))
			}
			owner := make([]int, s*s)
			for k, o := range img.Objects {
				seen[o.Class]++
				if o.Box != BoxOf(o.Mask) {
					t.Errorf("%s: image %d object %d: box %v, mask's box %v", name, img.ID, k, o.Box, BoxOf(o.Mask))
				}
				if a := o.Mask.Area(); a < s*s/128 {
					t.Errorf("%s: image %d object %d: visible area %d below the drop limit", name, img.ID, k, a)
				}
				if w := o.Box[2] - o.Box[0]; w > float64(s)*40/64+1 {
					t.Errorf("%s: image %d object %d: %v px wide", name, img.ID, k, w)
				}
				for p, b := range o.Mask.Bits {
					if b {
						if owner[p] != 0 {
							t.Fatalf("%s: image %d: objects %d and %d share pixel %d", name, img.ID, owner[p]-1, k, p)
						}
						owner[p] = k + 1
					}
				}
			}
		}
		for c, n := range seen {
			if len(ds.Images) >= 10 && n == 0 {
				t.Errorf("%s: no object of class %d", name, c)
			}
		}
	}
}

// Each object's mask is exactly where its colour was painted: every pixel of
// a mask differs from the neighbouring pixels outside all masks only by the
// object's shading and noise, so the mean inside is far from the background
// just around it. Checked loosely: objects must be visible.
func TestSyntheticObjectsStandOut(t *testing.T) {
	ds, _ := Synthetic(DefaultSynthetic(11, 20))
	for _, img := range ds.Images {
		n := img.W * img.H
		for k, o := range img.Objects {
			var in, ring [3]float64
			nin, nring := 0, 0
			for y := range img.H {
				for x := range img.W {
					p := y*img.W + x
					near := o.Mask.At(x-2, y) || o.Mask.At(x+2, y) || o.Mask.At(x, y-2) || o.Mask.At(x, y+2)
					switch {
					case o.Mask.Bits[p]:
						nin++
						for c := range 3 {
							in[c] += float64(img.Pix[c*n+p])
						}
					case near && !anyMask(img, x, y):
						nring++
						for c := range 3 {
							ring[c] += float64(img.Pix[c*n+p])
						}
					}
				}
			}
			if nring < 8 {
				continue // surrounded by other objects
			}
			d := 0.0
			for c := range 3 {
				diff := in[c]/float64(nin) - ring[c]/float64(nring)
				d += diff * diff
			}
			if math.Sqrt(d) < 0.12 {
				t.Errorf("image %d object %d: colour distance to its surroundings only %.3f", img.ID, k, math.Sqrt(d))
			}
		}
	}
}

func anyMask(img *Image, x, y int) bool {
	for _, o := range img.Objects {
		if o.Mask.At(x, y) {
			return true
		}
	}
	return false
}

func TestSyntheticBadConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  SyntheticConfig
		want string
	}{
		{SyntheticConfig{Count: -1}, "Count"},
		{SyntheticConfig{Count: 1, Size: 8}, "Size"},
		{SyntheticConfig{Count: 1, MinObjects: 3, MaxObjects: 2}, "MinObjects"},
		{SyntheticConfig{Count: 1, MinObjects: -1, MaxObjects: 2}, "MinObjects"},
		{SyntheticConfig{Count: 1, MaxObjects: 1000}, "MaxObjects"},
	} {
		_, err := Synthetic(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "data: ") {
			t.Errorf("Synthetic(%+v) = %v, want a data: error naming %s", tc.cfg, err, tc.want)
		}
	}
}

func TestCOCORoundTrip(t *testing.T) {
	ds, err := Synthetic(SyntheticConfig{Seed: 5, Count: 6, Size: 48, MinObjects: 2, MaxObjects: 5})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := WriteCOCO(ds, dir); err != nil {
		t.Fatal(err)
	}
	back, err := ReadCOCO(filepath.Join(dir, "annotations.json"), filepath.Join(dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, ds) {
		t.Fatal("dataset changed through WriteCOCO and ReadCOCO")
	}
	// The image directory defaults to the annotations file's; here it is
	// not there, so reading must fail and name the image.
	if _, err := ReadCOCO(filepath.Join(dir, "annotations.json"), ""); err == nil || !strings.Contains(err.Error(), "000001.png") {
		t.Errorf("ReadCOCO with the wrong image directory: %v", err)
	}
}

func TestCOCOWrittenFields(t *testing.T) {
	ds := &Dataset{Classes: []string{"a", "b"}, Images: []*Image{{
		ID: 7, W: 3, H: 2, Pix: make([]float32, 18),
		Objects: []Object{{Class: 1, Box: [4]float64{0, 0, 2, 2}, Mask: maskFrom("#..", "##.")}},
	}}}
	dir := t.TempDir()
	if err := WriteCOCO(ds, dir); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "annotations.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f map[string]any
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	ann := f["annotations"].([]any)[0].(map[string]any)
	seg := ann["segmentation"].(map[string]any)
	// Counts [0 2 1 1 2] (see TestRLE) compress to "021O1": the fourth
	// count is 1-2 = -1, five one bits, 'O'; the fifth 2-1 = 1.
	if seg["counts"] != "021O1" || fmt.Sprint(seg["size"]) != "[2 3]" {
		t.Errorf("segmentation %v, want counts \"021O1\" and size [2 3]", seg)
	}
	if fmt.Sprint(ann["bbox"]) != "[0 0 2 2]" || ann["area"] != 3.0 || ann["category_id"] != 2.0 || ann["image_id"] != 7.0 || ann["iscrowd"] != 0.0 {
		t.Errorf("annotation %v", ann)
	}
	img := f["images"].([]any)[0].(map[string]any)
	if img["file_name"] != "000007.png" || img["width"] != 3.0 || img["height"] != 2.0 {
		t.Errorf("image %v", img)
	}
	if _, err := os.Stat(filepath.Join(dir, "images", "000007.png")); err != nil {
		t.Error(err)
	}
}

// writeTiny writes a 4x3 black PNG as images/a.png under dir via WriteCOCO
// and returns the image directory.
func writeTiny(t *testing.T, dir string) string {
	t.Helper()
	ds := &Dataset{Images: []*Image{{ID: 1, File: "a.png", W: 4, H: 3, Pix: make([]float32, 36)}}}
	if err := WriteCOCO(ds, dir); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "images")
}

func TestReadCOCOSegmentations(t *testing.T) {
	dir := t.TempDir()
	imgDir := writeTiny(t, dir)
	js := `{
	  "images": [{"id": 1, "file_name": "a.png", "width": 4, "height": 3}],
	  "categories": [{"id": 9, "name": "late"}, {"id": 3, "name": "early"}],
	  "annotations": [
	    {"id": 1, "image_id": 1, "category_id": 3, "bbox": [0, 0, 2, 1], "iscrowd": 0,
	     "segmentation": [[0, 0, 2, 0, 2, 1, 0, 1], [3, 2, 4, 2, 4, 3, 3, 3]]},
	    {"id": 2, "image_id": 1, "category_id": 9, "bbox": [1, 0, 1, 3], "iscrowd": 1,
	     "segmentation": {"size": [3, 4], "counts": [3, 3, 6]}},
	    {"id": 3, "image_id": 1, "category_id": 9, "bbox": [1.5, 0.5, 2, 2.5], "iscrowd": 0,
	     "segmentation": {"size": [3, 4], "counts": "0:2"}},
	    {"id": 4, "image_id": 1, "category_id": 3, "bbox": [0, 0, 1, 1]}
	  ]}`
	path := filepath.Join(dir, "hand.json")
	if err := os.WriteFile(path, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err := ReadCOCO(path, imgDir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ds.Classes, []string{"early", "late"}) || !reflect.DeepEqual(ds.CategoryIDs, []int{3, 9}) {
		t.Errorf("classes %v with ids %v, want categories in id order, ids kept", ds.Classes, ds.CategoryIDs)
	}
	objs := ds.Images[0].Objects
	for _, tc := range []struct {
		i     int
		class int
		box   [4]float64
		crowd bool
		mask  []string
	}{
		// Two polygons: their union.
		{0, 0, [4]float64{0, 0, 2, 1}, false, []string{"##..", "....", "...#"}},
		// Uncompressed RLE, column-major: 3 unset (column 0), 3 set
		// (column 1), 6 unset.
		{1, 1, [4]float64{1, 0, 2, 3}, true, []string{".#..", ".#..", ".#.."}},
		// Compressed "0:2" = counts [0 10 2]: the first 10 pixels down the
		// columns set, the last 2 (column 3, rows 1 and 2) unset.
		{2, 1, [4]float64{1.5, 0.5, 3.5, 3}, false, []string{"####", "###.", "###."}},
	} {
		o := objs[tc.i]
		if o.Class != tc.class || o.Box != tc.box || o.Crowd != tc.crowd {
			t.Errorf("annotation %d: class %d box %v crowd %v, want %d %v %v", tc.i+1, o.Class, o.Box, o.Crowd, tc.class, tc.box, tc.crowd)
		}
		if got, want := maskString(o.Mask), strings.Join(tc.mask, "\n")+"\n"; got != want {
			t.Errorf("annotation %d: mask\n%swant\n%s", tc.i+1, got, want)
		}
	}
	if objs[3].Mask != nil {
		t.Error("annotation 4 has no segmentation but got a mask")
	}
}

func TestReadCOCOErrors(t *testing.T) {
	dir := t.TempDir()
	imgDir := writeTiny(t, dir)
	img := `"images": [{"id": 1, "file_name": "a.png", "width": 4, "height": 3}], "categories": [{"id": 1, "name": "x"}]`
	ann := func(a string) string { return `{` + img + `, "annotations": [` + a + `]}` }
	for _, tc := range []struct {
		name, json, want string
	}{
		{"not JSON", `{"images": [`, "unexpected end"},
		{"unknown image", ann(`{"id": 5, "image_id": 2, "category_id": 1, "bbox": [0,0,1,1]}`), "annotation 5: image_id 2"},
		{"unknown category", ann(`{"id": 5, "image_id": 1, "category_id": 4, "bbox": [0,0,1,1]}`), "annotation 5 (image 1): category_id 4"},
		{"short bbox", ann(`{"id": 5, "image_id": 1, "category_id": 1, "bbox": [0,0,1]}`), "annotation 5 (image 1): bbox has 3"},
		{"negative bbox", ann(`{"id": 5, "image_id": 1, "category_id": 1, "bbox": [0,0,-1,1]}`), "annotation 5 (image 1): bad bbox"},
		{"bbox right of the image", ann(`{"id": 5, "image_id": 1, "category_id": 1, "bbox": [4.5,0,2,2]}`), "annotation 5 (image 1): bbox [4.5 0 2 2] lies outside the 4x3 image"},
		{"bbox touching the left edge", ann(`{"id": 5, "image_id": 1, "category_id": 1, "bbox": [-2,0,2,2]}`), "lies outside"},
		{"bbox above the image", ann(`{"id": 5, "image_id": 1, "category_id": 1, "bbox": [0,-9,2,2]}`), "lies outside"},
		{"RLE size", ann(`{"id": 5, "image_id": 1, "category_id": 1, "bbox": [0,0,1,1], "segmentation": {"size": [4,3], "counts": [12]}}`), "annotation 5 (image 1): segmentation: RLE size [4 3]"},
		{"RLE sum", ann(`{"id": 5, "image_id": 1, "category_id": 1, "bbox": [0,0,1,1], "segmentation": {"size": [3,4], "counts": [11]}}`), "sum to 11"},
		{"RLE string", ann(`{"id": 5, "image_id": 1, "category_id": 1, "bbox": [0,0,1,1], "segmentation": {"size": [3,4], "counts": "T"}}`), "annotation 5 (image 1): segmentation: data: RLE string"},
		{"RLE counts type", ann(`{"id": 5, "image_id": 1, "category_id": 1, "bbox": [0,0,1,1], "segmentation": {"size": [3,4], "counts": 12}}`), "string or a list"},
		{"short polygon", ann(`{"id": 5, "image_id": 1, "category_id": 1, "bbox": [0,0,1,1], "segmentation": [[0,0,1,1]]}`), "annotation 5 (image 1): segmentation: polygon 0 has 4"},
		{"segmentation type", ann(`{"id": 5, "image_id": 1, "category_id": 1, "bbox": [0,0,1,1], "segmentation": 3}`), "polygons or an RLE"},
		{"missing image file", `{"images": [{"id": 1, "file_name": "b.png", "width": 4, "height": 3}]}`, "b.png"},
		{"image size", `{"images": [{"id": 1, "file_name": "a.png", "width": 5, "height": 3}]}`, "is 4x3, annotations say 5x3"},
		{"duplicate image", `{"images": [{"id": 1, "file_name": "a.png", "width": 4, "height": 3}, {"id": 1, "file_name": "a.png", "width": 4, "height": 3}]}`, "image id 1 appears twice"},
		{"duplicate category", `{"categories": [{"id": 1, "name": "x"}, {"id": 1, "name": "y"}]}`, "category id 1 appears twice"},
	} {
		path := filepath.Join(dir, "bad.json")
		if err := os.WriteFile(path, []byte(tc.json), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := ReadCOCO(path, imgDir)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "bad.json") {
			t.Errorf("%s: err = %v, want one naming bad.json and containing %q", tc.name, err, tc.want)
		}
	}
	if _, err := ReadCOCO(filepath.Join(dir, "missing.json"), ""); err == nil || !strings.Contains(err.Error(), "missing.json") {
		t.Errorf("missing file: %v", err)
	}
}

// Boxes that cross the image's border are clipped to it and counted.
func TestReadCOCOClipsBoxes(t *testing.T) {
	dir := t.TempDir()
	imgDir := writeTiny(t, dir)
	js := `{"images": [{"id": 1, "file_name": "a.png", "width": 4, "height": 3}],
	  "categories": [{"id": 1, "name": "x"}],
	  "annotations": [
	    {"id": 1, "image_id": 1, "category_id": 1, "bbox": [-1, 1, 3, 5]},
	    {"id": 2, "image_id": 1, "category_id": 1, "bbox": [1, 1, 2, 1]},
	    {"id": 3, "image_id": 1, "category_id": 1, "bbox": [3, -0.5, 4, 1]},
	    {"id": 4, "image_id": 1, "category_id": 1, "bbox": [2, 2, 0, 0]}
	  ]}`
	path := filepath.Join(dir, "clip.json")
	if err := os.WriteFile(path, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	ds, err := ReadCOCO(path, imgDir)
	if err != nil {
		t.Fatal(err)
	}
	want := [][4]float64{{0, 1, 2, 3}, {1, 1, 3, 2}, {3, 0, 4, 0.5}, {2, 2, 2, 2}}
	for i, o := range ds.Images[0].Objects {
		if o.Box != want[i] {
			t.Errorf("annotation %d: box %v, want %v", i+1, o.Box, want[i])
		}
	}
	if ds.ClippedBoxes != 2 {
		t.Errorf("ClippedBoxes = %d, want 2", ds.ClippedBoxes)
	}
}

// WriteCOCO writes the dataset's own category ids.
func TestWriteCOCOCategoryIDs(t *testing.T) {
	ds := &Dataset{Classes: []string{"cat", "dog"}, CategoryIDs: []int{17, 18}, Images: []*Image{{
		ID: 1, W: 2, H: 2, Pix: make([]float32, 12),
		Objects: []Object{{Class: 1, Box: [4]float64{0, 0, 1, 1}}},
	}}}
	dir := t.TempDir()
	if err := WriteCOCO(ds, dir); err != nil {
		t.Fatal(err)
	}
	back, err := ReadCOCO(filepath.Join(dir, "annotations.json"), filepath.Join(dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.CategoryIDs, []int{17, 18}) || back.Images[0].Objects[0].Class != 1 {
		t.Errorf("ids %v, object class %d; want [17 18] and class 1", back.CategoryIDs, back.Images[0].Objects[0].Class)
	}
	ds.CategoryIDs = []int{17}
	if err := WriteCOCO(ds, t.TempDir()); err == nil || !strings.Contains(err.Error(), "1 category ids for 2 classes") {
		t.Errorf("WriteCOCO with too few ids: %v", err)
	}
}

func TestWriteCOCOErrors(t *testing.T) {
	good := func() *Dataset {
		return &Dataset{Classes: []string{"a"}, Images: []*Image{{ID: 1, W: 2, H: 2, Pix: make([]float32, 12),
			Objects: []Object{{Class: 0, Box: [4]float64{0, 0, 1, 1}, Mask: NewMask(2, 2)}}}}}
	}
	for _, tc := range []struct {
		name   string
		modify func(*Dataset)
		want   string
	}{
		{"class", func(d *Dataset) { d.Images[0].Objects[0].Class = 1 }, "class 1"},
		{"mask size", func(d *Dataset) { d.Images[0].Objects[0].Mask = NewMask(3, 2) }, "mask is 3x2"},
		{"pixels", func(d *Dataset) { d.Images[0].Pix = nil }, "Pix"},
		{"file name", func(d *Dataset) { d.Images[0].File = "../x.png" }, "leaves"},
		{"duplicate id", func(d *Dataset) { d.Images = append(d.Images, d.Images[0]) }, "appears twice"},
		{"duplicate file", func(d *Dataset) {
			other := *d.Images[0]
			other.ID, other.File = 2, "000001.png"
			d.Images = append(d.Images, &other)
		}, `images 1 and 2 both have the file name "000001.png"`},
	} {
		ds := good()
		tc.modify(ds)
		err := WriteCOCO(ds, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}
