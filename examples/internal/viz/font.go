package viz

import (
	"image"
	"image/color"
	"image/draw"
	"strings"

	xdraw "golang.org/x/image/draw"
	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// face is the font of all text in the pictures: basicfont's 7x13 fixed
// bitmap font (X11's misc-fixed). A bitmap font, not a vector one, because
// the text labels pictures of 64x64 images blown up nearest-neighbour: its
// glyphs are opaque or empty pixels, so a label is exactly its colour on
// its tag (no anti-aliased fringe to blend into a mask), it stays legible at
// 13 pixels, and it needs no font file parsed at start-up. Runes outside
// ASCII are drawn as U+FFFD, so a missing character shows instead of
// vanishing.
var face = basicfont.Face7x13

// lineHeight is the height of a line of text at scale 1, in pixels.
var lineHeight = face.Metrics().Height.Ceil()

// TextSize is the size in pixels of s drawn by DrawText at the given scale:
// the widest line by the number of lines ('\n' breaks lines). The width
// leaves out the blank column after the last glyph.
func TextSize(s string, scale int) (w, h int) {
	scale = max(scale, 1)
	lines := strings.Split(s, "\n")
	for _, l := range lines {
		if l == "" {
			continue
		}
		adv := font.MeasureString(face, l).Ceil()
		w = max(w, adv-(face.Advance-face.Width))
	}
	return w * scale, len(lines) * lineHeight * scale
}

// DrawText draws s onto dst with font.Drawer, its top-left corner at (x, y),
// in colour c; at scale > 1 each pixel of the font becomes a scale x scale
// square (the text is drawn once at scale 1 as a mask and blown up
// nearest-neighbour, so it stays as crisp as the images it labels). Pixels
// outside dst are clipped. It returns the size of the text as TextSize does.
func DrawText(dst *image.RGBA, x, y int, s string, c color.Color, scale int) (w, h int) {
	scale = max(scale, 1)
	w1, h1 := TextSize(s, 1)
	if w1 == 0 {
		return TextSize(s, scale)
	}
	mask := image.NewAlpha(image.Rect(0, 0, w1, h1))
	d := font.Drawer{Dst: mask, Src: image.Opaque, Face: face}
	for i, line := range strings.Split(s, "\n") {
		d.Dot = fixed.P(0, i*lineHeight+face.Ascent)
		d.DrawString(line)
	}
	var m image.Image = mask
	if scale > 1 {
		big := image.NewAlpha(image.Rect(0, 0, w1*scale, h1*scale))
		xdraw.NearestNeighbor.Scale(big, big.Bounds(), mask, mask.Bounds(), xdraw.Src, nil)
		m = big
	}
	r := m.Bounds().Add(image.Pt(x, y))
	draw.DrawMask(dst, r, image.NewUniform(c), image.Point{}, m, image.Point{}, draw.Over)
	return r.Dx(), r.Dy()
}
