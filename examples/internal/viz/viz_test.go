package viz

import (
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stheno-ml/stheno/examples/internal/data"
	"github.com/stheno-ml/stheno/examples/internal/eval"
)

// grey returns a w x h image of one grey level.
func grey(w, h int, v float32) *data.Image {
	img := &data.Image{ID: 1, W: w, H: h, Pix: make([]float32, 3*w*h)}
	for i := range img.Pix {
		img.Pix[i] = v
	}
	return img
}

func rgbaAt(img *image.RGBA, x, y int) color.RGBA { return img.RGBAAt(x, y) }

func TestImageRGBA(t *testing.T) {
	img := grey(2, 1, 0)
	// Pixel (1,0) is pure red: R plane only.
	img.Pix[1] = 1
	out := ImageRGBA(img, 3)
	if out.Bounds() != image.Rect(0, 0, 6, 3) {
		t.Fatalf("bounds %v, want 6x3", out.Bounds())
	}
	for _, tc := range []struct {
		x, y int
		want color.RGBA
	}{
		{0, 0, color.RGBA{0, 0, 0, 255}}, {2, 2, color.RGBA{0, 0, 0, 255}},
		{3, 0, color.RGBA{255, 0, 0, 255}}, {5, 2, color.RGBA{255, 0, 0, 255}},
	} {
		if got := rgbaAt(out, tc.x, tc.y); got != tc.want {
			t.Errorf("pixel (%d,%d) = %v, want %v", tc.x, tc.y, got, tc.want)
		}
	}
}

func TestDrawDetections(t *testing.T) {
	const scale = 4
	img := grey(24, 16, 0.5) // to8(0.5) = round(127.5) = 128
	bg := color.RGBA{128, 128, 128, 255}
	mask := data.NewMask(24, 16)
	for y := 6; y < 11; y++ {
		for x := 4; x < 9; x++ {
			mask.Bits[y*24+x] = true
		}
	}
	dets := []eval.Detection{
		{ImageID: 1, Class: 1, Score: 0.87, Box: [4]float64{3, 5, 10, 12}, Mask: mask},
		{ImageID: 1, Class: 2, Score: 0.2, Box: [4]float64{11, 11, 15, 15}}, // below scoreMin
	}
	out := DrawDetections(img, dets, []string{"circle", "square", "triangle"}, 0.5, scale)
	if out.Bounds() != image.Rect(0, 0, 96, 64) {
		t.Fatalf("bounds %v", out.Bounds())
	}
	c := Colour(1)
	// Box [3,5,10,12) covers output pixels [12,40) x [20,48); its edges are
	// drawn inside it, one pixel wide at scale 4.
	for _, p := range []image.Point{{12, 38}, {39, 38}, {30, 47}, {12, 47}} {
		if got := rgbaAt(out, p.X, p.Y); got != c {
			t.Errorf("box edge pixel %v = %v, want the class colour %v", p, got, c)
		}
	}
	// Inside the mask, away from its outline: the class colour blended
	// over the grey with opacity maskAlpha.
	blend := func(a, b uint8) uint8 {
		return uint8(math.Round(float64(a)*(1-maskAlpha) + float64(b)*maskAlpha))
	}
	want := color.RGBA{blend(128, c.R), blend(128, c.G), blend(128, c.B), 255}
	if got := rgbaAt(out, 6*scale+1, 8*scale+2); got != want {
		t.Errorf("mask pixel = %v, want %v", got, want)
	}
	// The mask's outline is opaque: the left side of mask pixel (4, 8).
	if got := rgbaAt(out, 4*scale, 8*scale+1); got != c {
		t.Errorf("mask outline = %v, want %v", got, c)
	}
	// Outside masks, boxes and the label the picture is untouched, and the
	// low-scoring detection is not drawn.
	for _, p := range []image.Point{{2, 60}, {50, 50}, {11 * scale, 11 * scale}, {58, 58}, {93, 10}} {
		if got := rgbaAt(out, p.X, p.Y); got != bg {
			t.Errorf("pixel %v = %v, want the background %v", p, got, bg)
		}
	}
	// The label: a tag in the class colour with text in black or white,
	// sitting on the box's top edge, and nothing else.
	text := textColourOn(c)
	tw, th := TextSize("square 0.87", 1)
	tagBox := image.Rect(12, 20-(th+2), 12+tw+4, 20)
	ink, tag := 0, 0
	for y := 0; y < 20; y++ {
		for x := range 96 {
			in := image.Pt(x, y).In(tagBox)
			switch got := rgbaAt(out, x, y); {
			case in && got == text:
				ink++
			case in && got == c:
				tag++
			case in || got != bg:
				t.Fatalf("label: pixel (%d,%d) = %v (in the tag %v: %v)", x, y, got, tagBox, in)
			}
		}
	}
	if ink < 60 || tag < 60 {
		t.Errorf("label: %d text pixels and %d tag pixels, want both plenty", ink, tag)
	}
}

func TestDrawGroundTruth(t *testing.T) {
	img := grey(8, 8, 0)
	m := data.NewMask(8, 8)
	m.Bits[3*8+3] = true
	img.Objects = []data.Object{{Class: 0, Box: [4]float64{3, 3, 4, 4}, Mask: m}}
	out := DrawGroundTruth(img, []string{"circle"}, 1)
	// At scale 1 the mask pixel is blended (no outline) and then the
	// one-pixel box covers it.
	if got := rgbaAt(out, 3, 3); got != Colour(0) {
		t.Errorf("pixel (3,3) = %v, want %v", got, Colour(0))
	}
}

func TestTextSize(t *testing.T) {
	// The 7x13 font: glyphs 6 pixels wide on a 7-pixel advance, lines 13
	// pixels high.
	for _, tc := range []struct {
		s          string
		scale      int
		wantW, hgt int
	}{
		{"", 1, 0, 13}, {"a", 1, 6, 13}, {"ab", 1, 13, 13}, {"ab", 2, 26, 26},
		{"ab\nxyz", 1, 20, 26}, {"\n", 1, 0, 26}, {"ab", 0, 13, 13},
		{"\u00e9t\u00e9", 1, 20, 13}, // runes, not bytes
	} {
		if w, h := TextSize(tc.s, tc.scale); w != tc.wantW || h != tc.hgt {
			t.Errorf("TextSize(%q, %d) = %d, %d, want %d, %d", tc.s, tc.scale, w, h, tc.wantW, tc.hgt)
		}
	}
}

func TestDrawText(t *testing.T) {
	bg := color.RGBA{10, 20, 30, 255}
	const x0, y0 = 5, 7
	for _, tc := range []struct {
		s     string
		scale int
		c     color.RGBA
		blank bool // draws nothing
	}{
		{"", 1, color.RGBA{255, 255, 255, 255}, true},
		{" ", 1, color.RGBA{255, 255, 255, 255}, true},
		{"square 0.87", 1, color.RGBA{255, 255, 255, 255}, false},
		{"Mg|_", 1, color.RGBA{0, 0, 0, 255}, false},
		{"Mg|_", 3, color.RGBA{230, 25, 75, 255}, false},
		{"two\nlines", 2, color.RGBA{0, 130, 200, 255}, false},
		{"\u00e9", 1, color.RGBA{255, 255, 255, 255}, false}, // U+FFFD stands for it
	} {
		img := image.NewRGBA(image.Rect(0, 0, 120, 90))
		fillRect(img, img.Bounds(), bg)
		w, h := DrawText(img, x0, y0, tc.s, tc.c, tc.scale)
		if ww, wh := TextSize(tc.s, tc.scale); w != ww || h != wh {
			t.Errorf("%q at scale %d: DrawText returns %dx%d, TextSize %dx%d", tc.s, tc.scale, w, h, ww, wh)
		}
		box := image.Rect(x0, y0, x0+w, y0+h)
		ink, ib := 0, image.Rectangle{}
		for y := range img.Bounds().Dy() {
			for x := range img.Bounds().Dx() {
				switch got := img.RGBAAt(x, y); got {
				case bg:
				case tc.c:
					ink++
					ib = ib.Union(image.Rect(x, y, x+1, y+1))
					if !image.Pt(x, y).In(box) {
						t.Errorf("%q at scale %d: ink at (%d,%d), outside TextSize's box %v", tc.s, tc.scale, x, y, box)
					}
				default:
					t.Fatalf("%q at scale %d: pixel (%d,%d) = %v, neither the background nor the text colour", tc.s, tc.scale, x, y, got)
				}
			}
		}
		if tc.blank != (ink == 0) {
			t.Errorf("%q at scale %d: %d pixels of ink", tc.s, tc.scale, ink)
		}
		// The box is tight: the ink reaches across most of it.
		if !tc.blank && (ib.Dx() < w-2*tc.scale || ib.Dy() < h/2) {
			t.Errorf("%q at scale %d: ink spans %v of the box %v", tc.s, tc.scale, ib, box)
		}
	}
	// Nearest-neighbour scaling: each font pixel becomes a 3x3 square.
	count := func(scale int) int {
		img := image.NewRGBA(image.Rect(0, 0, 100, 50))
		DrawText(img, 0, 0, "8", color.White, scale)
		n := 0
		for i := 0; i < len(img.Pix); i += 4 {
			if img.Pix[i] == 255 {
				n++
			}
		}
		return n
	}
	if a, b := count(1), count(3); a == 0 || b != 9*a {
		t.Errorf("scale 3 draws %d pixels, scale 1 %d: want 9 times", b, a)
	}
	// Text partly outside the picture is clipped, not a panic.
	img := image.NewRGBA(image.Rect(0, 0, 10, 10))
	DrawText(img, -4, -6, "clipped", color.White, 2)
}

func TestGrid(t *testing.T) {
	cell := func(w, h int, c color.RGBA) *image.RGBA {
		img := image.NewRGBA(image.Rect(0, 0, w, h))
		fillRect(img, img.Bounds(), c)
		return img
	}
	red, green, blue := color.RGBA{255, 0, 0, 255}, color.RGBA{0, 255, 0, 255}, color.RGBA{0, 0, 255, 255}
	g := Grid([]image.Image{cell(10, 10, red), cell(6, 10, green), cell(10, 8, blue)}, 2)
	// Cells are 10x10 with 4-pixel gaps around: 2*14+4 = 32 square.
	if g.Bounds() != image.Rect(0, 0, 32, 32) {
		t.Fatalf("bounds %v, want 32x32", g.Bounds())
	}
	for _, tc := range []struct {
		x, y int
		want color.RGBA
	}{
		{4, 4, red}, {13, 13, red}, {18, 4, green}, {23, 13, green}, {24, 4, white},
		{4, 18, blue}, {13, 25, blue}, {13, 26, white}, {18, 18, white}, {0, 0, white},
	} {
		if got := g.RGBAAt(tc.x, tc.y); got != tc.want {
			t.Errorf("pixel (%d,%d) = %v, want %v", tc.x, tc.y, got, tc.want)
		}
	}
	if b := Grid(nil, 3).Bounds(); !b.Empty() {
		t.Errorf("empty grid: %v", b)
	}
	if b := Grid([]image.Image{cell(5, 5, red), nil, cell(5, 5, red)}, 0).Bounds(); b != image.Rect(0, 0, 3*9+4, 13) {
		t.Errorf("one row: %v", b)
	}
}

var white = color.RGBA{255, 255, 255, 255}

func TestCaption(t *testing.T) {
	img := image.NewRGBA(image.Rect(0, 0, 100, 50))
	out := Caption(img, "prediction")
	_, th := TextSize("prediction", 1)
	if out.Bounds() != image.Rect(0, 0, 100, 50+th+4) {
		t.Errorf("bounds %v", out.Bounds())
	}
	if black := seriesColoursOf(out, color.RGBA{0, 0, 0, 255}, th+4); black == 0 {
		t.Error("no caption text")
	}
}

func seriesColoursOf(img *image.RGBA, c color.RGBA, rows int) int {
	n := 0
	for y := 0; y < rows; y++ {
		for x := 0; x < img.Bounds().Dx(); x++ {
			if img.RGBAAt(x, y) == c {
				n++
			}
		}
	}
	return n
}

func TestSavePNGRoundTrip(t *testing.T) {
	img := DrawDetections(grey(8, 8, 0.3), []eval.Detection{{Class: 0, Score: 1, Box: [4]float64{1, 1, 5, 5}}}, nil, 0, 3)
	path := filepath.Join(t.TempDir(), "d.png")
	if err := SavePNG(path, img); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	back, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if back.Bounds() != img.Bounds() {
		t.Fatalf("bounds %v, want %v", back.Bounds(), img.Bounds())
	}
	for y := range img.Bounds().Dy() {
		for x := range img.Bounds().Dx() {
			if got, want := color.RGBAModel.Convert(back.At(x, y)), img.At(x, y); got != want {
				t.Fatalf("pixel (%d,%d) = %v, want %v", x, y, got, want)
			}
		}
	}
	if err := SavePNG(filepath.Join(t.TempDir(), "no", "such", "dir.png"), img); err == nil {
		t.Error("SavePNG into a missing directory: no error")
	}
}
