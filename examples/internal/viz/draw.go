package viz

import (
	"bufio"
	"cmp"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"slices"

	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
)

// palette holds well-separated colours (after Sasha Trubetskoy's list of 20
// distinct colours); classes and plot series take them in order.
var palette = []color.RGBA{
	{230, 25, 75, 255},   // red
	{60, 180, 75, 255},   // green
	{0, 130, 200, 255},   // blue
	{245, 130, 48, 255},  // orange
	{145, 30, 180, 255},  // purple
	{70, 200, 220, 255},  // cyan
	{240, 50, 230, 255},  // magenta
	{150, 190, 20, 255},  // lime
	{0, 128, 128, 255},   // teal
	{170, 110, 40, 255},  // brown
	{128, 0, 0, 255},     // maroon
	{0, 0, 128, 255},     // navy
	{128, 128, 0, 255},   // olive
	{255, 200, 25, 255},  // yellow
	{220, 150, 190, 255}, // pink
	{100, 100, 100, 255}, // grey
}

// Colour is the colour of class k (or plot series k): a fixed palette,
// repeating after 16.
func Colour(k int) color.RGBA {
	k %= len(palette)
	if k < 0 {
		k += len(palette)
	}
	return palette[k]
}

// maskAlpha is the opacity of mask overlays: enough to show the mask, little
// enough to show the object under it.
const maskAlpha = 0.45

// ImageRGBA converts img's planar float RGB to an RGBA picture, each pixel a
// scale x scale square (nearest-neighbour upscaling keeps pixels visible as
// pixels, which is what one wants to judge masks on 64x64 images).
func ImageRGBA(img *data.Image, scale int) *image.RGBA {
	scale = max(scale, 1)
	w, h := img.W, img.H
	out := image.NewRGBA(image.Rect(0, 0, w*scale, h*scale))
	n := w * h
	for y := range h {
		for x := range w {
			p := y*w + x
			var c color.RGBA
			c.A = 255
			if len(img.Pix) == 3*n {
				c.R, c.G, c.B = to8(img.Pix[p]), to8(img.Pix[n+p]), to8(img.Pix[2*n+p])
			}
			fillRect(out, image.Rect(x*scale, y*scale, (x+1)*scale, (y+1)*scale), c)
		}
	}
	return out
}

func to8(v float32) uint8 {
	if !(v > 0) {
		return 0
	}
	if v >= 1 {
		return 255
	}
	return uint8(math.Round(float64(v) * 255))
}

// DrawDetections draws img upscaled scale times, and over it, for each
// detection with Score >= scoreMin, a translucent mask in its class's colour
// with an opaque outline, the box, and a "class 0.93" label on the box's top
// edge. Higher scores are drawn over lower ones. Classes outside classes are
// labelled by number.
func DrawDetections(img *data.Image, dets []eval.Detection, classes []string, scoreMin float64, scale int) *image.RGBA {
	var keep []eval.Detection
	for _, d := range dets {
		if d.Score >= scoreMin {
			keep = append(keep, d)
		}
	}
	slices.SortStableFunc(keep, func(a, b eval.Detection) int { return cmp.Compare(a.Score, b.Score) })
	items := make([]item, len(keep))
	for i, d := range keep {
		items[i] = item{class: d.Class, box: d.Box, mask: d.Mask,
			label: fmt.Sprintf("%s %.2f", className(classes, d.Class), d.Score)}
	}
	return drawItems(img, items, scale)
}

// DrawGroundTruth draws img's annotated objects as DrawDetections draws
// detections, labelled with the class name alone.
func DrawGroundTruth(img *data.Image, classes []string, scale int) *image.RGBA {
	items := make([]item, len(img.Objects))
	for i, o := range img.Objects {
		items[i] = item{class: o.Class, box: o.Box, mask: o.Mask, label: className(classes, o.Class)}
	}
	return drawItems(img, items, scale)
}

func className(classes []string, k int) string {
	if k >= 0 && k < len(classes) {
		return classes[k]
	}
	return fmt.Sprintf("class %d", k)
}

type item struct {
	class int
	box   [4]float64
	mask  *data.Mask
	label string
}

func drawItems(img *data.Image, items []item, scale int) *image.RGBA {
	scale = max(scale, 1)
	out := ImageRGBA(img, scale)
	// Layers: all masks, then all boxes, then all labels, so that no mask
	// hides a box or a label.
	for _, it := range items {
		if it.mask != nil {
			drawMask(out, it.mask, Colour(it.class), scale)
		}
	}
	thick := max(1, scale/3)
	for _, it := range items {
		drawBox(out, scaleBox(it.box, scale), Colour(it.class), thick)
	}
	for _, it := range items {
		drawLabel(out, scaleBox(it.box, scale), it.label, Colour(it.class))
	}
	return out
}

// scaleBox maps a box with exclusive end to the output pixels it covers.
func scaleBox(b [4]float64, scale int) image.Rectangle {
	s := float64(scale)
	return image.Rect(int(math.Round(b[0]*s)), int(math.Round(b[1]*s)), int(math.Round(b[2]*s)), int(math.Round(b[3]*s)))
}

// drawMask blends c over the mask's pixels and outlines it: each side of a
// set pixel that faces an unset one is drawn opaque, so the outline follows
// pixel edges exactly.
func drawMask(dst *image.RGBA, m *data.Mask, c color.RGBA, scale int) {
	for y := range m.H {
		for x := range m.W {
			if !m.Bits[y*m.W+x] {
				continue
			}
			x0, y0 := x*scale, y*scale
			blendRect(dst, image.Rect(x0, y0, x0+scale, y0+scale), c, maskAlpha)
			if scale < 3 {
				continue // an outline would cover the whole pixel
			}
			if !m.At(x-1, y) {
				fillRect(dst, image.Rect(x0, y0, x0+1, y0+scale), c)
			}
			if !m.At(x+1, y) {
				fillRect(dst, image.Rect(x0+scale-1, y0, x0+scale, y0+scale), c)
			}
			if !m.At(x, y-1) {
				fillRect(dst, image.Rect(x0, y0, x0+scale, y0+1), c)
			}
			if !m.At(x, y+1) {
				fillRect(dst, image.Rect(x0, y0+scale-1, x0+scale, y0+scale), c)
			}
		}
	}
}

// drawBox outlines r inside its edges with lines thick pixels wide.
func drawBox(dst *image.RGBA, r image.Rectangle, c color.RGBA, thick int) {
	if r.Empty() {
		return
	}
	fillRect(dst, image.Rect(r.Min.X, r.Min.Y, r.Max.X, r.Min.Y+thick), c)
	fillRect(dst, image.Rect(r.Min.X, r.Max.Y-thick, r.Max.X, r.Max.Y), c)
	fillRect(dst, image.Rect(r.Min.X, r.Min.Y, r.Min.X+thick, r.Max.Y), c)
	fillRect(dst, image.Rect(r.Max.X-thick, r.Min.Y, r.Max.X, r.Max.Y), c)
}

// drawLabel puts text on a tag of colour c sitting on the box's top edge, or
// just inside the box when there is no room above; the tag is kept inside
// the picture.
func drawLabel(dst *image.RGBA, box image.Rectangle, text string, c color.RGBA) {
	tw, th := TextSize(text, 1)
	// The font's top row is blank, so one pixel of margin above the text
	// looks like two.
	tag := image.Rect(0, 0, tw+4, th+2)
	x, y := box.Min.X, box.Min.Y-tag.Dy()
	if y < 0 {
		y = box.Min.Y
	}
	b := dst.Bounds()
	x = max(b.Min.X, min(x, b.Max.X-tag.Dx()))
	y = max(b.Min.Y, min(y, b.Max.Y-tag.Dy()))
	tag = tag.Add(image.Pt(x, y))
	fillRect(dst, tag, c)
	DrawText(dst, x+2, y+1, text, textColourOn(c), 1)
}

// textColourOn picks black or white text, whichever reads better on bg
// (by luma).
func textColourOn(bg color.RGBA) color.RGBA {
	if 299*int(bg.R)+587*int(bg.G)+114*int(bg.B) > 150_000 {
		return color.RGBA{0, 0, 0, 255}
	}
	return color.RGBA{255, 255, 255, 255}
}

// fillRect paints r, clipped to dst, with the opaque colour c.
func fillRect(dst *image.RGBA, r image.Rectangle, c color.RGBA) {
	r = r.Intersect(dst.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			dst.SetRGBA(x, y, c)
		}
	}
}

// blendRect mixes c into r, clipped to dst, with opacity alpha.
func blendRect(dst *image.RGBA, r image.Rectangle, c color.RGBA, alpha float64) {
	r = r.Intersect(dst.Bounds())
	mix := func(a, b uint8) uint8 { return uint8(math.Round(float64(a)*(1-alpha) + float64(b)*alpha)) }
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			o := dst.PixOffset(x, y)
			p := dst.Pix[o : o+4 : o+4]
			p[0], p[1], p[2] = mix(p[0], c.R), mix(p[1], c.G), mix(p[2], c.B)
		}
	}
}

// SavePNG writes img to path as PNG, creating or truncating the file.
func SavePNG(path string, img image.Image) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("viz: %w", err)
	}
	w := bufio.NewWriter(f)
	err = png.Encode(w, img)
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("viz: SavePNG %s: %w", path, err)
	}
	return nil
}

// gridGap is the white space between and around the cells of Grid.
const gridGap = 4

// Grid tiles imgs row by row, cols per row (all in one row if cols <= 0),
// on a white background. Every cell is as large as the largest image, and
// images sit at their cell's top-left; nil images leave their cell empty.
// No images give a 0x0 picture.
func Grid(imgs []image.Image, cols int) *image.RGBA {
	if len(imgs) == 0 {
		return image.NewRGBA(image.Rectangle{})
	}
	if cols <= 0 || cols > len(imgs) {
		cols = len(imgs)
	}
	rows := (len(imgs) + cols - 1) / cols
	cw, ch := 0, 0
	for _, im := range imgs {
		if im != nil {
			cw, ch = max(cw, im.Bounds().Dx()), max(ch, im.Bounds().Dy())
		}
	}
	out := image.NewRGBA(image.Rect(0, 0, cols*(cw+gridGap)+gridGap, rows*(ch+gridGap)+gridGap))
	draw.Draw(out, out.Bounds(), image.White, image.Point{}, draw.Src)
	for i, im := range imgs {
		if im == nil {
			continue
		}
		x, y := gridGap+(i%cols)*(cw+gridGap), gridGap+(i/cols)*(ch+gridGap)
		b := im.Bounds()
		draw.Draw(out, image.Rect(x, y, x+b.Dx(), y+b.Dy()), im, b.Min, draw.Src)
	}
	return out
}

// Caption returns img with text written in black on a white strip above it,
// e.g. to title the cells of a Grid.
func Caption(img image.Image, text string) *image.RGBA {
	tw, th := TextSize(text, 1)
	b := img.Bounds()
	strip := th + 4
	out := image.NewRGBA(image.Rect(0, 0, max(b.Dx(), tw+4), b.Dy()+strip))
	draw.Draw(out, out.Bounds(), image.White, image.Point{}, draw.Src)
	DrawText(out, 2, 2, text, color.Black, 1)
	draw.Draw(out, image.Rect(0, strip, b.Dx(), strip+b.Dy()), img, b.Min, draw.Src)
	return out
}
