package data

import (
	"bufio"
	"fmt"
	"image"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ReadImages reads the images a trained model predicts on: a COCO
// annotations file (annotated; read as Load reads one, with its images
// from an images/ directory beside it or from its own directory), or every
// PNG and JPEG file of a directory, in name order, numbered from 1, at
// their own sizes and without objects.
func ReadImages(path string) (ds *Dataset, annotated bool, err error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, false, fmt.Errorf("data: %w", err)
	}
	if !st.IsDir() {
		ds, err := readCOCO(path)
		return ds, true, err
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, false, fmt.Errorf("data: %w", err)
	}
	ds = &Dataset{}
	var names []string
	for _, e := range entries {
		switch strings.ToLower(filepath.Ext(e.Name())) {
		case ".png", ".jpg", ".jpeg":
			if !e.IsDir() {
				names = append(names, e.Name())
			}
		}
	}
	slices.Sort(names)
	for i, name := range names {
		src, err := decodeFile(filepath.Join(path, name))
		if err != nil {
			return nil, false, fmt.Errorf("data: %w", err)
		}
		img := planarRGB(src)
		img.ID, img.File = i+1, name
		ds.Images = append(ds.Images, img)
	}
	if len(ds.Images) == 0 {
		return nil, false, fmt.Errorf("data: no PNG or JPEG images in %s", path)
	}
	return ds, false, nil
}

// decodeFile decodes the image file at path (PNG or JPEG).
func decodeFile(path string) (image.Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	src, _, err := image.Decode(bufio.NewReader(f))
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return src, nil
}

// planarRGB converts src to an Image of its size, planar RGB in [0, 1].
func planarRGB(src image.Image) *Image {
	b := src.Bounds()
	w, h := b.Dx(), b.Dy()
	img := &Image{W: w, H: h, Pix: make([]float32, 3*w*h)}
	n := w * h
	for y := range h {
		for x := range w {
			p := y*w + x
			var r, g, bl uint8
			switch s := src.(type) {
			case *image.NRGBA:
				o := s.PixOffset(b.Min.X+x, b.Min.Y+y)
				r, g, bl = s.Pix[o], s.Pix[o+1], s.Pix[o+2]
			case *image.RGBA:
				o := s.PixOffset(b.Min.X+x, b.Min.Y+y)
				r, g, bl = s.Pix[o], s.Pix[o+1], s.Pix[o+2]
			default:
				// Non-premultiplied, so that translucent pixels keep their
				// colour.
				c := color.NRGBAModel.Convert(src.At(b.Min.X+x, b.Min.Y+y)).(color.NRGBA)
				r, g, bl = c.R, c.G, c.B
			}
			img.Pix[p], img.Pix[n+p], img.Pix[2*n+p] = level(r), level(g), level(bl)
		}
	}
	return img
}
