package model

import "math"

// Anchors returns the anchors of every level in the layout of the RPN's
// outputs for that level, [A, H, W] (A = len(AnchorRatios)): anchor
// (a*H+y)*W+x of level l is centred on cell (x, y)'s centre,
// ((x+0.5)*stride, (y+0.5)*stride), with area AnchorSizes[l]^2 and
// height/width AnchorRatios[a]. Objectness logits [N, A, H, W] and box
// deltas [N, A*4, H, W] index the same anchors, so RPN targets need no
// reshaping or transposing in the graph.
func Anchors(cfg Config) [][]Box {
	strides := cfg.Strides()
	levels := make([][]Box, len(strides))
	for l, stride := range strides {
		n := cfg.LevelSize(l)
		s := float64(stride)
		size := cfg.AnchorSizes[l]
		boxes := make([]Box, 0, len(cfg.AnchorRatios)*n*n)
		for _, r := range cfg.AnchorRatios {
			// Keep the area at size^2: w = size/sqrt(r), h = size*sqrt(r).
			w, h := size/math.Sqrt(r), size*math.Sqrt(r)
			for y := range n {
				for x := range n {
					cx, cy := (float64(x)+0.5)*s, (float64(y)+0.5)*s
					boxes = append(boxes, Box{cx - w/2, cy - h/2, cx + w/2, cy + h/2})
				}
			}
		}
		levels[l] = boxes
	}
	return levels
}
