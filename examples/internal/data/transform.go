package data

// Resize returns img scaled to size x size: pixels bilinearly (pixel-centre
// aligned), masks by nearest neighbour, boxes by the same factors. An image
// of that size already is returned as is. Objects whose box collapses
// below a pixel are dropped.
func Resize(img *Image, size int) *Image {
	if img.W == size && img.H == size {
		return img
	}
	sx, sy := float64(img.W)/float64(size), float64(img.H)/float64(size)
	out := &Image{ID: img.ID, File: img.File, W: size, H: size, Pix: make([]float32, 3*size*size)}
	n, m := img.W*img.H, size*size
	for y := range size {
		fy := (float64(y)+0.5)*sy - 0.5
		for x := range size {
			fx := (float64(x)+0.5)*sx - 0.5
			for c := range 3 {
				out.Pix[c*m+y*size+x] = sampleBilinear(img.Pix[c*n:(c+1)*n], img.W, img.H, fx, fy)
			}
		}
	}
	for _, o := range img.Objects {
		b := [4]float64{o.Box[0] / sx, o.Box[1] / sy, o.Box[2] / sx, o.Box[3] / sy}
		if b[2]-b[0] < 1 || b[3]-b[1] < 1 {
			continue
		}
		no := Object{Class: o.Class, Box: b, Crowd: o.Crowd}
		if o.Mask != nil {
			no.Mask = NewMask(size, size)
			for y := range size {
				my := min(int((float64(y)+0.5)*sy), img.H-1)
				for x := range size {
					no.Mask.Bits[y*size+x] = o.Mask.At(min(int((float64(x)+0.5)*sx), img.W-1), my)
				}
			}
		}
		out.Objects = append(out.Objects, no)
	}
	return out
}

func sampleBilinear(p []float32, w, h int, x, y float64) float32 {
	x = min(max(x, 0), float64(w-1))
	y = min(max(y, 0), float64(h-1))
	x0, y0 := int(x), int(y)
	x1, y1 := min(x0+1, w-1), min(y0+1, h-1)
	fx, fy := float32(x-float64(x0)), float32(y-float64(y0))
	top := p[y0*w+x0]*(1-fx) + p[y0*w+x1]*fx
	bot := p[y1*w+x0]*(1-fx) + p[y1*w+x1]*fx
	return top*(1-fy) + bot*fy
}

// Flip returns img mirrored left to right.
func Flip(img *Image) *Image {
	w, h := img.W, img.H
	out := &Image{ID: img.ID, File: img.File, W: w, H: h, Pix: make([]float32, len(img.Pix))}
	for c := range 3 {
		for y := range h {
			src := img.Pix[(c*h+y)*w : (c*h+y+1)*w]
			dst := out.Pix[(c*h+y)*w : (c*h+y+1)*w]
			for x, v := range src {
				dst[w-1-x] = v
			}
		}
	}
	for _, o := range img.Objects {
		no := Object{Class: o.Class, Crowd: o.Crowd,
			Box: [4]float64{float64(w) - o.Box[2], o.Box[1], float64(w) - o.Box[0], o.Box[3]}}
		if o.Mask != nil {
			no.Mask = NewMask(o.Mask.W, o.Mask.H)
			for y := range o.Mask.H {
				for x := range o.Mask.W {
					no.Mask.Bits[y*o.Mask.W+x] = o.Mask.Bits[y*o.Mask.W+o.Mask.W-1-x]
				}
			}
		}
		out.Objects = append(out.Objects, no)
	}
	return out
}
