package model

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// The host steps of the graphs: what the host ops run.

// carver hands out consecutive slices of a packed output vector, in the
// order autograd.Unpack carves them back out.
type carver struct {
	buf []float32
	off int
}

func (c *carver) take(n int) []float32 {
	s := c.buf[c.off : c.off+n]
	c.off += n
	return s
}

// putRoI writes RoI row r, (image, box), into rois [K, 5].
func putRoI(rois []float32, r, img int, b Box) {
	copy(rois[5*r:5*r+5], []float32{float32(img), float32(b[0]), float32(b[1]), float32(b[2]), float32(b[3])})
}

// sampleHeads is the training graph's sampler. From this step's RPN
// outputs it computes each image's proposals, samples RoIsPerImage RoIs
// among them and the ground truth, and writes the inputs of the heads'
// losses, packed as buildTraining unpacks them:
//
//	rois [K,5], labels [K], cls weights [K], box targets and weights
//	[1,4C,K,1] (non-zero on the RoI's class only), mask RoIs [KM,5]
//
// and the mask targets and weights [KM,C,M,M] (non-zero on the RoI's class
// only) into Net.maskTargets and Net.maskWeights. The mask RoIs are the
// sampled foreground RoIs with a mask, at most MaskRoIsPerImage of each
// image, image after image: the first Net.step.maskRoIs rows, which the
// mask head runs on (maskLossOp); the rows after them are unused.
//
// Weights carry torchvision's normalisation: 1/(RoIs sampled) for the
// classification and box losses, 1/(mask RoIs * M * M) for the mask loss.
// Unused box RoI slots are padding of weight 0, a whole-image box.
func (n *Net) sampleHeads(in [][]float32, out []float32) error {
	cfg, st := n.cfg, n.step
	if len(st.targets) != n.batch || st.rng == nil {
		return fmt.Errorf("no targets for this step")
	}
	rpn := n.rpnOutputs(in)
	r, mr := cfg.RoIsPerImage, cfg.MaskRoIsPerImage
	k, km := n.batch*r, n.batch*mr
	nc, m := cfg.NumClasses, cfg.MaskSize()
	c := carver{buf: out}
	rois, labels, clsW := c.take(5*k), c.take(k), c.take(k)
	boxT, boxW := c.take(4*nc*k), c.take(4*nc*k)
	mrois := c.take(5 * km)
	clear(out)

	sampled := make([][]sampledRoI, n.batch)
	withMask := make([][]sampledRoI, n.batch)
	first := make([]int, n.batch) // each image's first mask RoI row
	total, totalMask := 0, 0
	props := n.allProposals(rpn, cfg.RPNPostNMSTrain)
	// Each image's candidates labelled in parallel; the draws after, in
	// image order, as they share rng.
	cands := make([]roiCandidates, n.batch)
	parallelImages(n.batch, func(img int) {
		cands[img] = labelRoIs(cfg, props[img], st.targets[img])
	})
	for img := range n.batch {
		sampled[img] = cands[img].sample(cfg, st.targets[img], st.rng)
		total += len(sampled[img])
		for _, s := range sampled[img] {
			if s.label > 0 && st.targets[img].Masks[s.matched] != nil && len(withMask[img]) < mr {
				withMask[img] = append(withMask[img], s)
			}
		}
		first[img] = totalMask
		totalMask += len(withMask[img])
	}
	st.maskRoIs = totalMask
	whole := Box{0, 0, float64(cfg.ImageSize), float64(cfg.ImageSize)}
	w := float32(1 / float64(max(total, 1)))
	for img := range n.batch {
		tg := st.targets[img]
		for j := range r {
			row := img*r + j
			if j >= len(sampled[img]) {
				putRoI(rois, row, img, whole)
				continue
			}
			s := sampled[img][j]
			putRoI(rois, row, img, s.box)
			labels[row], clsW[row] = float32(s.label), w
			if s.label == 0 {
				continue
			}
			d := boxCoder.Encode(tg.Boxes[s.matched], s.box)
			for q := range 4 {
				o := ((s.label-1)*4+q)*k + row
				boxT[o], boxW[o] = float32(d[q]), w
			}
		}
	}
	wm := float32(1 / float64(max(totalMask, 1)*m*m))
	if len(n.maskScratch) != n.batch {
		n.maskScratch = make([]maskScratch, n.batch)
	}
	maskT, maskW := n.maskTargets, n.maskWeights
	errs := make([]error, n.batch)
	block := m * m
	parallelImages(n.batch, func(img int) {
		tg, mp, sc := st.targets[img], withMask[img], &n.maskScratch[img]
		// The rows' targets and weights: those of the RoI's class are
		// written with its mask's targets below.
		rows := maskT[first[img]*nc*block : (first[img]+len(mp))*nc*block]
		clear(rows)
		clear(maskW[first[img]*nc*block : (first[img]+len(mp))*nc*block])
		// The RoIs of each ground-truth mask, resampled together.
		var js []int
		var boxes []Box
		for g, mask := range tg.Masks {
			js, boxes = js[:0], boxes[:0]
			for j, s := range mp {
				if s.matched == g {
					js, boxes = append(js, j), append(boxes, s.box)
				}
			}
			if len(js) == 0 {
				continue
			}
			sc.mask = grow(sc.mask, mask.W*mask.H)
			sc.targets = grow(sc.targets, len(js)*block)
			ts := sc.targets[:len(js)*block]
			if err := maskTargets(mask, boxes, m, sc.mask[:mask.W*mask.H], ts); err != nil {
				errs[img] = err
				return
			}
			for i, j := range js {
				o := ((first[img]+j)*nc + mp[j].label - 1) * block
				copy(maskT[o:o+block], ts[i*block:(i+1)*block])
				for q := range block {
					maskW[o+q] = wm
				}
			}
		}
		for j, s := range mp {
			putRoI(mrois, first[img]+j, img, s.box)
		}
	})
	return errors.Join(errs...)
}

// inferProposals is the inference graph's proposal step: the best
// RPNPostNMSTest proposals of each image, packed as rois [K,5] and a
// validity flag [K]; unused slots hold a whole-image box, flagged 0.
func (n *Net) inferProposals(in [][]float32, out []float32) error {
	cfg := n.cfg
	rpn := n.rpnOutputs(in)
	rt := cfg.RPNPostNMSTest
	k := n.batch * rt
	c := carver{buf: out}
	rois, valid := c.take(5*k), c.take(k)
	whole := Box{0, 0, float64(cfg.ImageSize), float64(cfg.ImageSize)}
	all := n.allProposals(rpn, rt)
	for img, props := range all {
		for j := range rt {
			row := img*rt + j
			if j < len(props) {
				putRoI(rois, row, img, props[j])
				valid[row] = 1
			} else {
				putRoI(rois, row, img, whole)
				valid[row] = 0
			}
		}
	}
	return nil
}

// inferDetections is the inference graph's detection step: from the
// proposals and the box head's outputs (cls [1,C+1,K,1], reg [1,4C,K,1]) it
// computes each image's detections and packs MaxDetections slots per
// image: boxes as RoIs [KD,5] (the mask head's input), scores [KD], classes
// [KD] and validity flags [KD].
func (n *Net) inferDetections(in [][]float32, out []float32) error {
	cfg := n.cfg
	rt, d := cfg.RPNPostNMSTest, cfg.MaxDetections
	k, kd := n.batch*rt, n.batch*d
	nc := cfg.NumClasses
	props, cls, reg := in[0], in[1], in[2]
	rois, valid := props[:5*k], props[5*k:]
	c := carver{buf: out}
	drois, scores, classes, dvalid := c.take(5*kd), c.take(kd), c.take(kd), c.take(kd)
	clear(out)
	whole := Box{0, 0, float64(cfg.ImageSize), float64(cfg.ImageSize)}
	logits := make([]float32, nc+1)
	deltas := make([]float32, 4*nc)
	for img := range n.batch {
		var boxes []Box
		var rows []int
		for j := range rt {
			row := img*rt + j
			if valid[row] == 0 {
				continue
			}
			r := rois[5*row : 5*row+5]
			boxes = append(boxes, Box{float64(r[1]), float64(r[2]), float64(r[3]), float64(r[4])})
			rows = append(rows, row)
		}
		// The heads' outputs are columns: value ch of RoI row is at ch*K+row.
		dets := detect(cfg, boxes, func(i int) []float32 {
			for ch := range logits {
				logits[ch] = cls[ch*k+rows[i]]
			}
			return logits
		}, func(i int) []float32 {
			for ch := range deltas {
				deltas[ch] = reg[ch*k+rows[i]]
			}
			return deltas
		})
		for j := range d {
			row := img*d + j
			if j >= len(dets) {
				putRoI(drois, row, img, whole)
				continue
			}
			putRoI(drois, row, img, dets[j].Box)
			scores[row], classes[row], dvalid[row] = float32(dets[j].Score), float32(dets[j].Class), 1
		}
	}
	return nil
}

// allProposals returns every image's proposals (at most post each), each
// image's levels decoded and NMS'd in parallel: on a large model
// (R50FPNConfig: 2000 boxes per level before NMS) they are the longest
// host step.
func (n *Net) allProposals(rpn rpnOutputs, post int) [][]Box {
	cfg := n.cfg
	levels := len(n.anchors)
	cands := make([][]proposal, n.batch*levels)
	// The finer levels, with the most anchors and boxes, first: the
	// coarsest levels' small pieces then fill the workers' ends.
	parallelImages(len(cands), func(t int) {
		l, img := t/n.batch, t%n.batch
		cands[img*levels+l] = levelProposals(cfg, n.anchors, rpn, l, img, cfg.RPNPreNMS, post, cfg.RPNNMS)
	})
	out := make([][]Box, n.batch)
	parallelImages(n.batch, func(img int) {
		out[img] = mergeProposals(cands[img*levels:(img+1)*levels], post)
	})
	return out
}

// parallelImages runs f for each of n images (or other independent
// pieces of work), on up to GOMAXPROCS goroutines. f must only write what
// belongs to its piece.
func parallelImages(n int, f func(img int)) {
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for range min(n, runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for img := int(next.Add(1) - 1); img < n; img = int(next.Add(1) - 1) {
				f(img)
			}
		}()
	}
	wg.Wait()
}

// maskScratch is what sampleHeads' mask targets of one image work in, kept
// across steps: a ground-truth mask as floats (maskTargets writes only
// what it reads of it) and the targets of the mask's RoIs.
type maskScratch struct {
	mask, targets []float32
}

// grow returns s with a length of at least n, s itself if it has one.
func grow(s []float32, n int) []float32 {
	if len(s) < n {
		return make([]float32, n)
	}
	return s
}
