package data

// Mask is a binary mask, row-major: pixel (x, y) is Bits[y*W+x].
type Mask struct {
	W, H int
	Bits []bool
}

// NewMask returns an empty w x h mask.
func NewMask(w, h int) *Mask {
	return &Mask{W: w, H: h, Bits: make([]bool, w*h)}
}

// At reports whether pixel (x, y) is set; pixels outside the mask are not.
func (m *Mask) At(x, y int) bool {
	if x < 0 || y < 0 || x >= m.W || y >= m.H {
		return false
	}
	return m.Bits[y*m.W+x]
}

// Area is the number of set pixels.
func (m *Mask) Area() int {
	if m == nil {
		return 0
	}
	n := 0
	for _, b := range m.Bits {
		if b {
			n++
		}
	}
	return n
}

// BoxOf returns the tight box [x1, y1, x2, y2) of the set pixels of m, and
// the zero box for an empty or nil mask.
func BoxOf(m *Mask) [4]float64 {
	if m == nil {
		return [4]float64{}
	}
	x1, y1, x2, y2 := m.W, m.H, -1, -1
	for y := 0; y < m.H; y++ {
		row := m.Bits[y*m.W : (y+1)*m.W]
		for x, b := range row {
			if !b {
				continue
			}
			x1, x2 = min(x1, x), max(x2, x)
			y1, y2 = min(y1, y), max(y2, y)
		}
	}
	if x2 < 0 {
		return [4]float64{}
	}
	// +1: the end is exclusive.
	return [4]float64{float64(x1), float64(y1), float64(x2 + 1), float64(y2 + 1)}
}

// Object is one annotated instance.
type Object struct {
	// Class indexes Dataset.Classes.
	Class int
	// Box is [x1, y1, x2, y2] in pixels, exclusive end.
	Box [4]float64
	// Mask is image-sized (W x H of the image).
	Mask *Mask
	// Crowd marks a COCO crowd region (iscrowd=1): a group of instances that
	// training should skip and evaluation ignores, as pycocotools does. The
	// synthetic dataset has none.
	Crowd bool
}

// Image is one picture and its objects.
type Image struct {
	// ID is the COCO image id (1-based in the synthetic dataset).
	ID int
	// File is the image's file name relative to the image directory.
	File string
	W, H int
	// Pix is planar RGB, [3][H][W], values in [0, 1]: channel c of pixel
	// (x, y) is Pix[(c*H+y)*W+x].
	Pix     []float32
	Objects []Object
}

// Dataset is a set of images with the names of their classes.
type Dataset struct {
	// Classes names the classes; an Object's Class indexes it.
	Classes []string
	// CategoryIDs are the classes' COCO category ids (CategoryIDs[k] is
	// class k's). ReadCOCO keeps the file's; the synthetic dataset numbers
	// its classes 1, 2, 3 (circle, square, triangle). Nil means class k is
	// category k+1.
	CategoryIDs []int
	Images      []*Image
	// ClippedBoxes counts the boxes ReadCOCO clipped to their image
	// because they crossed its border.
	ClippedBoxes int
}

// CategoryID is class k's COCO category id.
func (ds *Dataset) CategoryID(k int) int {
	if ds.CategoryIDs == nil {
		return k + 1
	}
	return ds.CategoryIDs[k]
}

// CountObjects is the number of objects of ds's images that are not crowd
// regions: what training and evaluation can use.
func (ds *Dataset) CountObjects() int {
	n := 0
	for _, img := range ds.Images {
		for _, o := range img.Objects {
			if !o.Crowd {
				n++
			}
		}
	}
	return n
}
