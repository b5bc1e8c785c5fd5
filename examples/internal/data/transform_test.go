package data

import (
	"slices"
	"testing"
)

func TestFlip(t *testing.T) {
	img := &Image{W: 3, H: 1, Pix: []float32{1, 2, 3, 4, 5, 6, 7, 8, 9},
		Objects: []Object{{Class: 1, Box: [4]float64{0, 0, 1, 1}, Mask: &Mask{W: 3, H: 1, Bits: []bool{true, false, false}}}}}
	f := Flip(img)
	if !slices.Equal(f.Pix, []float32{3, 2, 1, 6, 5, 4, 9, 8, 7}) {
		t.Errorf("pixels %v", f.Pix)
	}
	o := f.Objects[0]
	if o.Box != [4]float64{2, 0, 3, 1} || !slices.Equal(o.Mask.Bits, []bool{false, false, true}) || o.Class != 1 {
		t.Errorf("object %+v %v", o, o.Mask.Bits)
	}
}

// Resize scales pixels, boxes and masks by the same factors and drops
// objects that shrink below a pixel.
func TestResize(t *testing.T) {
	img := &Image{ID: 4, W: 8, H: 4, Pix: make([]float32, 3*8*4)}
	for i := range img.Pix {
		img.Pix[i] = float32(i%8) / 8 // a ramp along x, in every channel
	}
	m := NewMask(8, 4)
	for y := 0; y < 2; y++ {
		for x := 4; x < 8; x++ {
			m.Bits[y*8+x] = true
		}
	}
	img.Objects = []Object{
		{Class: 2, Box: [4]float64{4, 0, 8, 2}, Mask: m},
		{Class: 1, Box: [4]float64{0, 0, 1, 1}, Crowd: true}, // half a pixel wide at size 4
	}
	sq := &Image{W: 4, H: 4, Pix: make([]float32, 3*16)}
	if Resize(sq, 4) != sq {
		t.Error("Resize of a 4x4 image to 4 did not return it")
	}
	r := Resize(img, 4)
	if r.W != 4 || r.H != 4 || r.ID != 4 || len(r.Pix) != 3*16 {
		t.Fatalf("resized to %dx%d, id %d, %d values", r.W, r.H, r.ID, len(r.Pix))
	}
	// 8x4 to 4x4: x halves, y stays. Output pixel x samples input
	// x' = 2x + 0.5, between two steps of the ramp.
	for x := range 4 {
		if got, want := r.Pix[x], float32(2*x)/8+0.5/8; got != want {
			t.Errorf("pixel (%d, 0) = %v, want %v", x, got, want)
		}
	}
	if len(r.Objects) != 1 {
		t.Fatalf("%d objects, want the one that stays a pixel or more", len(r.Objects))
	}
	o := r.Objects[0]
	want := []bool{
		false, false, true, true,
		false, false, true, true,
		false, false, false, false,
		false, false, false, false,
	}
	if o.Class != 2 || o.Box != [4]float64{2, 0, 4, 2} || !slices.Equal(o.Mask.Bits, want) {
		t.Errorf("object %+v, mask %v", o, o.Mask.Bits)
	}
}
