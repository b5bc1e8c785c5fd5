package data

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The exported synthetic set reads back as the images a run trains and
// validates on: its last tenth, held out by Load, is the validation set.
func TestExportSyntheticRoundTrip(t *testing.T) {
	dir := t.TempDir()
	const seed, size = 1, 32
	n, err := ExportSynthetic(filepath.Join(dir, "coco"), seed, 18, 2, size)
	if err != nil || n != 20 {
		t.Fatalf("ExportSynthetic = %d, %v; want 20 images", n, err)
	}
	trainSet, valSet, err := Load("", seed, 18, 2, size)
	if err != nil {
		t.Fatal(err)
	}
	gotTrain, gotVal, err := Load(filepath.Join(dir, "coco", "annotations.json"), 0, 0, 0, size)
	if err != nil {
		t.Fatal(err)
	}
	for i, img := range gotTrain.Images {
		want := *trainSet.Images[i]
		want.File = img.File // the file name WriteCOCO gave it
		if !reflect.DeepEqual(img, &want) {
			t.Errorf("training image %d read back differently", i)
		}
	}
	if len(gotTrain.Images) != 18 || !reflect.DeepEqual(gotTrain.Classes, trainSet.Classes) || !reflect.DeepEqual(gotTrain.CategoryIDs, trainSet.CategoryIDs) {
		t.Errorf("read back %d training images of classes %v (ids %v)", len(gotTrain.Images), gotTrain.Classes, gotTrain.CategoryIDs)
	}
	if len(gotVal.Images) != 2 {
		t.Fatalf("%d validation images, want 2", len(gotVal.Images))
	}
	for i, img := range gotVal.Images {
		want := *valSet.Images[i]
		want.ID, want.File = 19+i, img.File
		if !reflect.DeepEqual(img, &want) {
			t.Errorf("validation image %d read back differently", i)
		}
	}
}

// A COCO file is refused when it cannot give both sets, or when its
// training images have nothing to learn from.
func TestLoadRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		count  int
		modify func(*Dataset)
		want   string
	}{
		{"one image", 1, func(*Dataset) {}, "has 1 images; training and validation need at least 2"},
		{"no annotations", 4, func(ds *Dataset) {
			for _, img := range ds.Images {
				img.Objects = nil
			}
		}, "have no annotations that are not crowd regions"},
		{"crowds only", 4, func(ds *Dataset) {
			for _, img := range ds.Images {
				for i := range img.Objects {
					img.Objects[i].Crowd = true
				}
			}
		}, "have no annotations that are not crowd regions"},
	} {
		dir := t.TempDir()
		ds, err := Synthetic(SyntheticConfig{Seed: 3, Count: tc.count, Size: 32})
		if err != nil {
			t.Fatal(err)
		}
		tc.modify(ds)
		if err := WriteCOCO(ds, dir); err != nil {
			t.Fatal(err)
		}
		_, _, err = Load(filepath.Join(dir, "annotations.json"), 0, 0, 0, 32)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "data: ") {
			t.Errorf("%s: Load: %v, want a data error containing %q", tc.name, err, tc.want)
		}
	}
}

// A directory gives its PNG files in name order, numbered from 1, at their
// own size; a COCO file gives its images with their objects.
func TestReadImages(t *testing.T) {
	dir := t.TempDir()
	ds, err := Synthetic(SyntheticConfig{Seed: 5, Count: 3, Size: 40})
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteCOCO(ds, dir); err != nil {
		t.Fatal(err)
	}
	// Not an image: skipped.
	if err := os.WriteFile(filepath.Join(dir, "images", "notes.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, annotated, err := ReadImages(filepath.Join(dir, "images"))
	if err != nil || annotated || len(got.Images) != 3 {
		t.Fatalf("a directory: %d images, annotated %t, %v; want 3 images without annotations", len(got.Images), annotated, err)
	}
	for i, img := range got.Images {
		if img.ID != i+1 || img.File != ds.Images[i].File || len(img.Objects) != 0 || !reflect.DeepEqual(img.Pix, ds.Images[i].Pix) {
			t.Errorf("image %d: id %d, file %s, %d objects; want id %d, %s, its pixels and no objects", i, img.ID, img.File, len(img.Objects), i+1, ds.Images[i].File)
		}
	}
	got, annotated, err = ReadImages(filepath.Join(dir, "annotations.json"))
	if err != nil || !annotated || got.CountObjects() != ds.CountObjects() {
		t.Errorf("a COCO file: annotated %t, %d objects (%v); want its %d", annotated, got.CountObjects(), err, ds.CountObjects())
	}
	if _, _, err := ReadImages(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no PNG or JPEG images") {
		t.Errorf("an empty directory: %v", err)
	}
}
