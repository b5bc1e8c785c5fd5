package data

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	_ "image/jpeg" // COCO's own images are JPEG
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// cocoFile is the subset of COCO's instance annotation format that the
// example reads and writes.
type cocoFile struct {
	Images      []cocoImage      `json:"images"`
	Annotations []cocoAnnotation `json:"annotations"`
	Categories  []cocoCategory   `json:"categories"`
}

type cocoImage struct {
	ID       int    `json:"id"`
	FileName string `json:"file_name"`
	Width    int    `json:"width"`
	Height   int    `json:"height"`
}

type cocoAnnotation struct {
	ID         int       `json:"id"`
	ImageID    int       `json:"image_id"`
	CategoryID int       `json:"category_id"`
	BBox       []float64 `json:"bbox"`
	Area       float64   `json:"area"`
	IsCrowd    int       `json:"iscrowd"`
	// Segmentation is polygons ([[x1,y1,...],...]) or RLE ({"size":[h,w],
	// "counts": string or [ints]}); absent for box-only annotations.
	Segmentation json.RawMessage `json:"segmentation,omitempty"`
}

type cocoCategory struct {
	ID            int    `json:"id"`
	Name          string `json:"name"`
	Supercategory string `json:"supercategory,omitempty"`
}

type cocoRLE struct {
	Size   []int           `json:"size"`
	Counts json.RawMessage `json:"counts"`
}

// WriteCOCO writes ds in COCO format: every image as dir/images/<File> (PNG;
// "<ID as %06d>.png" when File is empty) and the instance annotations as
// dir/annotations.json. Category ids are ds.CategoryID's; annotation ids
// count from 1 in image and object order; masks are written as compressed
// RLE strings, bbox from Object.Box, area as the mask's area (the box's when
// there is no mask). Objects without a mask get no segmentation.
func WriteCOCO(ds *Dataset, dir string) error {
	imgDir := filepath.Join(dir, "images")
	if err := os.MkdirAll(imgDir, 0o755); err != nil {
		return fmt.Errorf("data: WriteCOCO: %w", err)
	}
	out := cocoFile{Images: []cocoImage{}, Annotations: []cocoAnnotation{}, Categories: []cocoCategory{}}
	if ds.CategoryIDs != nil && len(ds.CategoryIDs) != len(ds.Classes) {
		return fmt.Errorf("data: WriteCOCO: %d category ids for %d classes", len(ds.CategoryIDs), len(ds.Classes))
	}
	for k, name := range ds.Classes {
		out.Categories = append(out.Categories, cocoCategory{ID: ds.CategoryID(k), Name: name})
	}
	seen := map[int]bool{}
	files := map[string]int{} // file name -> image id
	for _, img := range ds.Images {
		if seen[img.ID] {
			return fmt.Errorf("data: WriteCOCO: image id %d appears twice", img.ID)
		}
		seen[img.ID] = true
		file := img.File
		if file == "" {
			file = fmt.Sprintf("%06d.png", img.ID)
		}
		if !filepath.IsLocal(filepath.FromSlash(file)) {
			return fmt.Errorf("data: WriteCOCO: image %d: file name %q leaves the image directory", img.ID, file)
		}
		if other, dup := files[file]; dup {
			return fmt.Errorf("data: WriteCOCO: images %d and %d both have the file name %q", other, img.ID, file)
		}
		files[file] = img.ID
		if err := writeImagePNG(img, filepath.Join(imgDir, filepath.FromSlash(file))); err != nil {
			return fmt.Errorf("data: WriteCOCO: image %d: %w", img.ID, err)
		}
		out.Images = append(out.Images, cocoImage{ID: img.ID, FileName: file, Width: img.W, Height: img.H})
		for i, o := range img.Objects {
			if o.Class < 0 || o.Class >= len(ds.Classes) {
				return fmt.Errorf("data: WriteCOCO: image %d object %d: class %d outside [0,%d)", img.ID, i, o.Class, len(ds.Classes))
			}
			b := o.Box
			a := cocoAnnotation{
				ID: len(out.Annotations) + 1, ImageID: img.ID, CategoryID: ds.CategoryID(o.Class),
				BBox: []float64{b[0], b[1], b[2] - b[0], b[3] - b[1]},
				Area: (b[2] - b[0]) * (b[3] - b[1]),
			}
			if o.Crowd {
				a.IsCrowd = 1
			}
			if o.Mask != nil {
				if o.Mask.W != img.W || o.Mask.H != img.H || len(o.Mask.Bits) != img.W*img.H {
					return fmt.Errorf("data: WriteCOCO: image %d object %d: mask is %dx%d, image %dx%d", img.ID, i, o.Mask.W, o.Mask.H, img.W, img.H)
				}
				counts, _ := json.Marshal(CompressRLE(EncodeRLE(o.Mask)))
				seg, err := json.Marshal(cocoRLE{Size: []int{img.H, img.W}, Counts: counts})
				if err != nil {
					return fmt.Errorf("data: WriteCOCO: %w", err)
				}
				a.Segmentation = seg
				a.Area = float64(o.Mask.Area())
			}
			out.Annotations = append(out.Annotations, a)
		}
	}
	js, err := json.Marshal(out)
	if err != nil {
		return fmt.Errorf("data: WriteCOCO: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "annotations.json"), js, 0o644); err != nil {
		return fmt.Errorf("data: WriteCOCO: %w", err)
	}
	return nil
}

func writeImagePNG(img *Image, path string) error {
	n := img.W * img.H
	if len(img.Pix) != 3*n {
		return fmt.Errorf("has %d values in Pix, want 3*%d*%d", len(img.Pix), img.W, img.H)
	}
	rgba := image.NewNRGBA(image.Rect(0, 0, img.W, img.H))
	for p := range n {
		o := rgba.PixOffset(p%img.W, p/img.W)
		for c := range 3 {
			rgba.Pix[o+c] = quantize(float64(img.Pix[c*n+p]))
		}
		rgba.Pix[o+3] = 255
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	err = png.Encode(w, rgba)
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// ReadCOCO reads COCO instance annotations (a JSON file as written by
// WriteCOCO or distributed with COCO) and the images they name, from
// imageDir (the annotations file's directory if imageDir is "").
//
// Images keep the file's order and ids. Categories sorted by id become the
// classes 0, 1, ..., their ids kept in CategoryIDs; an object's Box is its
// bbox [x, y, w, h] as [x, y, x+w, y+h], clipped to the image when it
// crosses the border (counted in ClippedBoxes; a box wholly outside its
// image is an error); its Mask is rasterised from polygons (the union of the polygons,
// each by RasterizePolygon's pixel-centre even-odd rule) or decoded from RLE,
// compressed or not, and is nil when the annotation has no segmentation.
// iscrowd=1 sets Object.Crowd. Errors name the file and the annotation.
func ReadCOCO(annotationsPath, imageDir string) (*Dataset, error) {
	if imageDir == "" {
		imageDir = filepath.Dir(annotationsPath)
	}
	fail := func(format string, args ...any) error {
		return fmt.Errorf("data: ReadCOCO: %s: %s", annotationsPath, fmt.Sprintf(format, args...))
	}
	raw, err := os.ReadFile(annotationsPath)
	if err != nil {
		return nil, fmt.Errorf("data: ReadCOCO: %w", err)
	}
	var in cocoFile
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, fail("%v", err)
	}

	// Categories in id order become class indices.
	cats := slices.Clone(in.Categories)
	slices.SortStableFunc(cats, func(a, b cocoCategory) int { return cmp.Compare(a.ID, b.ID) })
	classOf := map[int]int{}
	ds := &Dataset{}
	for _, c := range cats {
		if _, dup := classOf[c.ID]; dup {
			return nil, fail("category id %d appears twice", c.ID)
		}
		classOf[c.ID] = len(ds.Classes)
		ds.Classes = append(ds.Classes, c.Name)
		ds.CategoryIDs = append(ds.CategoryIDs, c.ID)
	}

	byID := map[int]*Image{}
	for _, ci := range in.Images {
		if byID[ci.ID] != nil {
			return nil, fail("image id %d appears twice", ci.ID)
		}
		if ci.Width <= 0 || ci.Height <= 0 {
			return nil, fail("image %d (%s): size %dx%d", ci.ID, ci.FileName, ci.Width, ci.Height)
		}
		path := filepath.Join(imageDir, filepath.FromSlash(ci.FileName))
		img, err := readImage(path, ci)
		if err != nil {
			return nil, fail("image %d: %v", ci.ID, err)
		}
		byID[ci.ID] = img
		ds.Images = append(ds.Images, img)
	}

	for _, a := range in.Annotations {
		img := byID[a.ImageID]
		if img == nil {
			return nil, fail("annotation %d: image_id %d is not among the images", a.ID, a.ImageID)
		}
		class, ok := classOf[a.CategoryID]
		if !ok {
			return nil, fail("annotation %d (image %d): category_id %d is not among the categories", a.ID, a.ImageID, a.CategoryID)
		}
		if len(a.BBox) != 4 {
			return nil, fail("annotation %d (image %d): bbox has %d numbers, want 4 (x, y, w, h)", a.ID, a.ImageID, len(a.BBox))
		}
		x, y, w, h := a.BBox[0], a.BBox[1], a.BBox[2], a.BBox[3]
		if !(w >= 0 && h >= 0) || math.IsInf(x+y+w+h, 0) || math.IsNaN(x+y) {
			return nil, fail("annotation %d (image %d): bad bbox %v: want finite [x, y, w, h] with w, h >= 0", a.ID, a.ImageID, a.BBox)
		}
		box := [4]float64{x, y, x + w, y + h}
		clipped := [4]float64{max(box[0], 0), max(box[1], 0), min(box[2], float64(img.W)), min(box[3], float64(img.H))}
		// Outside: no point in common with the image, or a box of positive
		// area that keeps none inside it.
		if clipped[0] > clipped[2] || clipped[1] > clipped[3] || (w > 0 && h > 0 && !(clipped[0] < clipped[2] && clipped[1] < clipped[3])) {
			return nil, fail("annotation %d (image %d): bbox %v lies outside the %dx%d image", a.ID, a.ImageID, a.BBox, img.W, img.H)
		}
		if clipped != box {
			ds.ClippedBoxes++
		}
		mask, err := decodeSegmentation(a.Segmentation, img.W, img.H)
		if err != nil {
			return nil, fail("annotation %d (image %d): segmentation: %v", a.ID, a.ImageID, err)
		}
		img.Objects = append(img.Objects, Object{
			Class: class, Box: clipped, Mask: mask, Crowd: a.IsCrowd != 0,
		})
	}
	return ds, nil
}

// decodeSegmentation turns a COCO segmentation into a w x h mask, nil if
// there is none.
func decodeSegmentation(raw json.RawMessage, w, h int) (*Mask, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	switch raw[0] {
	case '[':
		var polys [][]float64
		if err := json.Unmarshal(raw, &polys); err != nil {
			return nil, fmt.Errorf("polygons: %v", err)
		}
		if len(polys) == 0 {
			return nil, errors.New("no polygons")
		}
		m := NewMask(w, h)
		for i, p := range polys {
			if len(p)%2 != 0 || len(p) < 6 {
				return nil, fmt.Errorf("polygon %d has %d numbers, want x,y pairs of at least 3 points", i, len(p))
			}
			for _, v := range p {
				if math.IsNaN(v) || math.IsInf(v, 0) {
					return nil, fmt.Errorf("polygon %d has coordinate %v", i, v)
				}
			}
			fillPolygon(m, p)
		}
		return m, nil
	case '{':
		var r cocoRLE
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, fmt.Errorf("RLE: %v", err)
		}
		if len(r.Size) != 2 || r.Size[0] != h || r.Size[1] != w {
			return nil, fmt.Errorf("RLE size %v, want [height width] = [%d %d]", r.Size, h, w)
		}
		var counts []int
		c := bytes.TrimSpace(r.Counts)
		switch {
		case len(c) > 0 && c[0] == '"':
			var s string
			if err := json.Unmarshal(c, &s); err != nil {
				return nil, fmt.Errorf("RLE counts: %v", err)
			}
			var err error
			if counts, err = DecompressRLE(s); err != nil {
				return nil, err
			}
		case len(c) > 0 && c[0] == '[':
			if err := json.Unmarshal(c, &counts); err != nil {
				return nil, fmt.Errorf("RLE counts: %v", err)
			}
		default:
			return nil, errors.New("RLE counts must be a string or a list of integers")
		}
		return DecodeRLE(counts, w, h)
	}
	return nil, errors.New("want a list of polygons or an RLE object")
}

// readImage reads the image file of ci, which must have ci's size.
func readImage(path string, ci cocoImage) (*Image, error) {
	src, err := decodeFile(path)
	if err != nil {
		return nil, err
	}
	if b := src.Bounds(); b.Dx() != ci.Width || b.Dy() != ci.Height {
		return nil, fmt.Errorf("%s is %dx%d, annotations say %dx%d", path, b.Dx(), b.Dy(), ci.Width, ci.Height)
	}
	img := planarRGB(src)
	img.ID, img.File = ci.ID, ci.FileName
	return img, nil
}
