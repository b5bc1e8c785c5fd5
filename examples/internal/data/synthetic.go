package data

import (
	"fmt"
	"math"
	"runtime"
	"sync"
)

// The synthetic dataset's classes, indexing its Dataset.Classes.
const (
	Circle = iota
	Square
	Triangle
)

// SyntheticClasses are the class names of the synthetic dataset.
var SyntheticClasses = []string{"circle", "square", "triangle"}

// SyntheticConfig configures Synthetic. Zero Size, MinObjects and MaxObjects
// take the defaults of DefaultSynthetic.
type SyntheticConfig struct {
	// Seed determines the dataset: the same config gives the same images.
	// Image i depends only on Seed and i, so a dataset of n images is a
	// prefix of one of more images made with the same Seed and Size.
	Seed uint64
	// Count is the number of images.
	Count int
	// Size is the side of the square images in pixels (default 64, at least
	// 16). Objects are 3/16 to 5/8 of it across (12 to 40 px at 64).
	Size int
	// MinObjects and MaxObjects bound the number of objects drawn in an
	// image (default 2 and 4). Heavily occluded objects are dropped, so an
	// image may end up with fewer than MinObjects annotated objects.
	MinObjects, MaxObjects int
}

// DefaultSynthetic returns the configuration meant for training on a CPU:
// 64x64 images with 2 to 4 objects of 12 to 40 pixels.
func DefaultSynthetic(seed uint64, count int) SyntheticConfig {
	return SyntheticConfig{Seed: seed, Count: count, Size: 64, MinObjects: 2, MaxObjects: 4}
}

// Synthetic generates the synthetic dataset described by cfg: square images
// of circles, axis-aligned squares and rotated triangles of random size and
// colour on textured backgrounds (a colour gradient, stripes or blotches, and
// pixel noise). Objects drawn later occlude earlier ones; each object's mask
// and box cover only its visible pixels, and objects left with less than a
// third of their area (or fewer than Size²/128 pixels, 32 at Size 64)
// visible are dropped from the annotations; their slivers stay in the
// picture, as in real data. Placement avoids such occlusion where it can:
// it tries a dozen positions for each object to keep every earlier object at
// least half visible.
//
// Shapes have hard edges decided at pixel centres, so the masks are exactly
// the pixels drawn in the object's colour. Pixel values are multiples of
// 1/255, so the images survive PNG (WriteCOCO, ReadCOCO) unchanged.
func Synthetic(cfg SyntheticConfig) (*Dataset, error) {
	if cfg.Size == 0 {
		cfg.Size = 64
	}
	if cfg.MinObjects == 0 && cfg.MaxObjects == 0 {
		cfg.MinObjects, cfg.MaxObjects = 2, 4
	}
	switch {
	case cfg.Count < 0:
		return nil, fmt.Errorf("data: Synthetic: Count must be >= 0, got %d", cfg.Count)
	case cfg.Size < 16:
		return nil, fmt.Errorf("data: Synthetic: Size must be >= 16, got %d", cfg.Size)
	case cfg.MinObjects < 0 || cfg.MaxObjects < cfg.MinObjects:
		return nil, fmt.Errorf("data: Synthetic: need 0 <= MinObjects <= MaxObjects, got %d and %d", cfg.MinObjects, cfg.MaxObjects)
	case cfg.MaxObjects > 64:
		return nil, fmt.Errorf("data: Synthetic: MaxObjects must be <= 64, got %d", cfg.MaxObjects)
	}
	ds := &Dataset{Classes: append([]string(nil), SyntheticClasses...), CategoryIDs: []int{1, 2, 3}, Images: make([]*Image, cfg.Count)}
	// One random stream per image, so that images depend neither on Count
	// nor on which worker makes them.
	var wg sync.WaitGroup
	workers := min(runtime.GOMAXPROCS(0), max(cfg.Count, 1))
	for w := range workers {
		wg.Go(func() {
			for i := w; i < cfg.Count; i += workers {
				r := newRNG(cfg.Seed ^ mix64(uint64(i)+0x5eed))
				ds.Images[i] = synthImage(r, cfg, i+1)
			}
		})
	}
	wg.Wait()
	return ds, nil
}

// shape is an object being placed: its class, colour and full
// (unoccluded) mask.
type shape struct {
	class int
	rgb   [3]float64
	full  *Mask
	area  int
	// shading adds a gentle linear gradient across the object, so that
	// objects are not flat patches a network could match by colour alone.
	shadeX, shadeY float64
}

func synthImage(r *rng, cfg SyntheticConfig, id int) *Image {
	s := cfg.Size
	img := &Image{ID: id, File: fmt.Sprintf("%06d.png", id), W: s, H: s}
	bg := background(r, s)

	n := cfg.MinObjects + r.intn(cfg.MaxObjects-cfg.MinObjects+1)
	minSide, maxSide := float64(s)*12/64, float64(s)*40/64
	// owner[p] is the index of the topmost shape at pixel p, or -1.
	owner := make([]int, s*s)
	for p := range owner {
		owner[p] = -1
	}
	minVisible := max(4, s*s/128)
	var shapes []shape
	visible := []int{} // visible pixel count of each shape
	for range n {
		class := r.intn(3)
		side := r.uniform(minSide, maxSide)
		var full *Mask
		// Try a few placements and keep the first that leaves every earlier
		// object at least half visible; the last try is kept regardless, so
		// heavy occlusion (and dropping) still happens now and then.
		const tries = 12
		for t := range tries {
			full = rasterShape(r, class, side, s)
			if t == tries-1 || !occludesTooMuch(full, owner, shapes, visible) {
				break
			}
		}
		k := len(shapes)
		rgb := objectColour(r, full, owner, shapes, bg)
		sh := shape{class: class, rgb: rgb, full: full, area: full.Area(),
			shadeX: r.uniform(-0.15, 0.15), shadeY: r.uniform(-0.15, 0.15)}
		shapes = append(shapes, sh)
		visible = append(visible, 0)
		for p, b := range full.Bits {
			if !b {
				continue
			}
			if o := owner[p]; o >= 0 {
				visible[o]--
			}
			owner[p] = k
			visible[k]++
		}
	}

	// Paint: background, then each shape where it is on top.
	img.Pix = make([]float32, 3*s*s)
	for y := range s {
		for x := range s {
			p := y*s + x
			var rgb [3]float64
			if o := owner[p]; o >= 0 {
				sh := &shapes[o]
				u, v := float64(x)/float64(s)-0.5, float64(y)/float64(s)-0.5
				shade := 1 + sh.shadeX*u*2 + sh.shadeY*v*2
				for c := range 3 {
					rgb[c] = sh.rgb[c]*shade + r.norm()*0.02
				}
			} else {
				for c := range 3 {
					rgb[c] = bg[c][p]
				}
			}
			for c := range 3 {
				img.Pix[c*s*s+p] = level(quantize(rgb[c]))
			}
		}
	}

	for k, sh := range shapes {
		if visible[k] < minVisible || 3*visible[k] < sh.area {
			continue
		}
		m := NewMask(s, s)
		for p, o := range owner {
			m.Bits[p] = o == k
		}
		img.Objects = append(img.Objects, Object{Class: sh.class, Box: BoxOf(m), Mask: m})
	}
	return img
}

// occludesTooMuch reports whether drawing full on top would leave an earlier
// shape less than half visible.
func occludesTooMuch(full *Mask, owner []int, shapes []shape, visible []int) bool {
	lost := make([]int, len(shapes))
	for p, b := range full.Bits {
		if b && owner[p] >= 0 {
			lost[owner[p]]++
		}
	}
	for k := range shapes {
		if 2*(visible[k]-lost[k]) < shapes[k].area {
			return true
		}
	}
	return false
}

// rasterShape draws a shape of the class with the given side (diameter for
// circles, circumscribed diameter for triangles) at a random place where it
// fits inside the s x s image. Pixels belong to the shape when their centre
// does.
func rasterShape(r *rng, class int, side float64, s int) *Mask {
	half := side / 2
	cx := r.uniform(half, float64(s)-half)
	cy := r.uniform(half, float64(s)-half)
	m := NewMask(s, s)
	switch class {
	case Circle:
		r2 := half * half
		for y := range s {
			for x := range s {
				dx, dy := float64(x)+0.5-cx, float64(y)+0.5-cy
				m.Bits[y*s+x] = dx*dx+dy*dy <= r2
			}
		}
	case Square:
		// Axis-aligned, so that the box is the square itself and the class
		// is told from circles by corners, not by orientation.
		for y := range s {
			for x := range s {
				dx, dy := math.Abs(float64(x)+0.5-cx), math.Abs(float64(y)+0.5-cy)
				m.Bits[y*s+x] = dx <= half && dy <= half
			}
		}
	case Triangle:
		// A roughly equilateral triangle at a random rotation: vertices on
		// the circumscribed circle, 120 degrees apart give or take 12.
		rot := r.uniform(0, 2*math.Pi)
		var vx, vy [3]float64
		for i := range 3 {
			a := rot + float64(i)*2*math.Pi/3 + r.uniform(-0.2, 0.2)
			vx[i], vy[i] = cx+half*math.Cos(a), cy+half*math.Sin(a)
		}
		poly := []float64{vx[0], vy[0], vx[1], vy[1], vx[2], vy[2]}
		fillPolygon(m, poly)
	}
	return m
}

// background returns a textured s x s background, planar RGB.
func background(r *rng, s int) [3][]float64 {
	var c0, c1 [3]float64
	for c := range 3 {
		c0[c], c1[c] = r.uniform(0.05, 0.95), r.uniform(0.05, 0.95)
	}
	ang := r.uniform(0, 2*math.Pi)
	gx, gy := math.Cos(ang), math.Sin(ang)
	// Texture: stripes or blotches (bilinear value noise on a coarse grid),
	// so that the network has to learn shapes, not "anything not flat".
	texture := r.intn(2)
	freq := r.uniform(2, 6) * 2 * math.Pi / float64(s)
	sang := r.uniform(0, math.Pi)
	sx, sy := math.Cos(sang)*freq, math.Sin(sang)*freq
	phase := r.uniform(0, 2*math.Pi)
	amp := r.uniform(0.03, 0.12)
	const grid = 5
	var noise [grid][grid][3]float64
	for i := range grid {
		for j := range grid {
			for c := range 3 {
				noise[i][j][c] = r.uniform(-1, 1)
			}
		}
	}
	sigma := r.uniform(0.01, 0.05)
	var bg [3][]float64
	for c := range 3 {
		bg[c] = make([]float64, s*s)
	}
	for y := range s {
		for x := range s {
			u, v := (float64(x)+0.5)/float64(s), (float64(y)+0.5)/float64(s)
			t := min(1, max(0, (u-0.5)*gx+(v-0.5)*gy+0.5))
			var tex [3]float64
			if texture == 0 {
				w := math.Sin(float64(x)*sx + float64(y)*sy + phase)
				tex = [3]float64{w, w, w}
			} else {
				fx, fy := u*(grid-1), v*(grid-1)
				i0, j0 := min(int(fy), grid-2), min(int(fx), grid-2)
				ay, ax := fy-float64(i0), fx-float64(j0)
				for c := range 3 {
					tex[c] = (1-ay)*((1-ax)*noise[i0][j0][c]+ax*noise[i0][j0+1][c]) +
						ay*((1-ax)*noise[i0+1][j0][c]+ax*noise[i0+1][j0+1][c])
				}
			}
			for c := range 3 {
				bg[c][y*s+x] = c0[c]*(1-t) + c1[c]*t + amp*tex[c] + sigma*r.norm()
			}
		}
	}
	return bg
}

// objectColour picks a colour that stands out from what the shape covers
// (background and earlier shapes), so that every object and its outline are
// visible.
func objectColour(r *rng, full *Mask, owner []int, shapes []shape, bg [3][]float64) [3]float64 {
	var mean [3]float64
	n := 0
	for p, b := range full.Bits {
		if !b {
			continue
		}
		n++
		for c := range 3 {
			if o := owner[p]; o >= 0 {
				mean[c] += shapes[o].rgb[c]
			} else {
				mean[c] += bg[c][p]
			}
		}
	}
	for c := range 3 {
		mean[c] /= float64(max(n, 1))
	}
	var rgb [3]float64
	for range 32 {
		d := 0.0
		for c := range 3 {
			rgb[c] = r.uniform(0.1, 0.9)
			d += (rgb[c] - mean[c]) * (rgb[c] - mean[c])
		}
		if d >= 0.35*0.35 {
			break
		}
	}
	return rgb
}

// quantize maps a value to the nearest 8-bit level, clamping to [0, 1].
func quantize(v float64) uint8 {
	if !(v > 0) { // NaN too
		return 0
	}
	if v >= 1 {
		return 255
	}
	return uint8(math.Round(v * 255))
}

// level is the float value of an 8-bit level; Synthetic and ReadCOCO share
// it so that pixels round-trip through PNG exactly.
func level(q uint8) float32 { return float32(q) / 255 }

// rng is SplitMix64: tiny, fast and fixed forever, so that datasets do not
// change with the Go release (math/rand/v2 reserves the right to change
// how its methods use the stream).
type rng struct{ s uint64 }

func newRNG(seed uint64) *rng { return &rng{s: seed} }

func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	return mix64(r.s)
}

// float is uniform in [0, 1).
func (r *rng) float() float64 { return float64(r.next()>>11) / (1 << 53) }

func (r *rng) uniform(a, b float64) float64 { return a + (b-a)*r.float() }

// intn is uniform in [0, n); the modulo bias is below 2^-50 for small n.
func (r *rng) intn(n int) int { return int(r.next() % uint64(n)) }

// norm is a standard normal deviate (Box-Muller).
func (r *rng) norm() float64 {
	u := 1 - r.float() // (0, 1], so the log is finite
	return math.Sqrt(-2*math.Log(u)) * math.Cos(2*math.Pi*r.float())
}
