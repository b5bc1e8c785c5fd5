package model

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/ops"
)

// maskHeadCase is a mask head on random pyramid levels and RoIs, built
// twice: as the training graph builds it (maskLossOp, on the step's first
// rows of the RoIs) and in place, on those rows only, as a graph of fixed
// shapes would.
type maskHeadCase struct {
	net    *Net
	levels []*tensor.Dense
	rois   *tensor.Dense // [KM, 5]
}

func newMaskHeadCase(t *testing.T, cfg Config, batch int) *maskHeadCase {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 8))
	p := NewParams(1, nil)
	n := &Net{cfg: cfg, mode: Train, batch: batch, params: p, step: &stepState{}, hostTimes: map[string]time.Duration{}}
	c := &maskHeadCase{net: n}
	for l := range cfg.PoolLevels() {
		s := cfg.LevelSize(l)
		v := make([]float32, batch*cfg.FPNChannels*s*s)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		c.levels = append(c.levels, tensor.New(tensor.WithShape(batch, cfg.FPNChannels, s, s), tensor.WithBacking(v)))
	}
	km := batch * cfg.MaskRoIsPerImage
	rois := make([]float32, 5*km)
	size := float64(cfg.ImageSize)
	for r := range km {
		x, y := rng.Float64()*size*0.7, rng.Float64()*size*0.7
		w, h := 4+rng.Float64()*size*0.3, 4+rng.Float64()*size*0.3
		putRoI(rois, r, r%batch, Box{x, y, min(x+w, size), min(y+h, size)})
	}
	c.rois = tensor.New(tensor.WithShape(km, 5), tensor.WithBacking(rois))
	m := cfg.MaskSize()
	n.maskTargets = make([]float32, km*cfg.NumClasses*m*m)
	n.maskWeights = make([]float32, km*cfg.NumClasses*m*m)
	return c
}

// setRows makes the first rows rows the step's mask RoIs, with random
// targets on a random class of each, weighted as the sampler weights them.
func (c *maskHeadCase) setRows(rows int, rng *rand.Rand) {
	n := c.net
	n.step.maskRoIs = rows
	nc, block := n.cfg.NumClasses, n.cfg.MaskSize()*n.cfg.MaskSize()
	clear(n.maskTargets)
	clear(n.maskWeights)
	for r := range rows {
		o := (r*nc + rng.IntN(nc)) * block
		for q := range block {
			n.maskTargets[o+q] = float32(rng.IntN(2))
			n.maskWeights[o+q] = float32(1 / float64(rows*block))
		}
	}
}

// graph builds the loss and its gradients with respect to the levels and
// the head's tensors: with maskLossOp when dynamic (used twice when
// twice, so that its gradient arrives scaled by 2), else in place on the
// step's rows.
func (c *maskHeadCase) graph(t *testing.T, dynamic, twice bool) (G.VM, *G.Node, G.Nodes) {
	vm, loss, grads, _ := c.graphOp(t, dynamic, twice)
	return vm, loss, grads
}

// graphOp is graph, also returning the maskLossOp of a dynamic graph.
func (c *maskHeadCase) graphOp(t *testing.T, dynamic, twice bool) (G.VM, *G.Node, G.Nodes, *maskLossOp) {
	t.Helper()
	n := c.net
	sub := n.sub()
	b := &builder{net: sub, nodes: map[string]*G.Node{}}
	var levels G.Nodes
	for l, v := range c.levels {
		levels = append(levels, G.NewTensor(sub.g, tensor.Float32, 4, G.WithShape(v.Shape()...), G.WithName(fmt.Sprintf("level%d", l)), G.WithValue(v)))
	}
	var loss *G.Node
	var op *maskLossOp
	if dynamic {
		rois := G.NewTensor(sub.g, tensor.Float32, 2, G.WithShape(c.rois.Shape()...), G.WithName("rois"), G.WithValue(c.rois))
		sub.step = n.step
		sub.maskTargets, sub.maskWeights = n.maskTargets, n.maskWeights
		var params G.Nodes
		var err error
		op, params, err = newMaskLoss(b, levels, rois)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { op.Close() })
		loss = b.check(G.ApplyOp(op, append(append(slices.Clone(levels), rois), params...)...))
		if twice {
			loss = b.check(ops.SumLosses(loss, loss))
		}
	} else {
		rows := n.step.maskRoIs
		used := tensor.New(tensor.WithShape(rows, 5), tensor.WithBacking(slices.Clone(c.rois.Float32s()[:5*rows])))
		rois := G.NewTensor(sub.g, tensor.Float32, 2, G.WithShape(rows, 5), G.WithName("rois"), G.WithValue(used))
		shape := []int{rows, n.cfg.NumClasses, n.cfg.MaskSize(), n.cfg.MaskSize()}
		size := tensor.Shape(shape).TotalSize()
		target := func(name string, buf []float32) *G.Node {
			return G.NewTensor(sub.g, tensor.Float32, 4, G.WithShape(shape...), G.WithName(name), G.WithValue(tensor.New(tensor.WithShape(shape...), tensor.WithBacking(slices.Clone(buf[:size])))))
		}
		loss = b.check(ops.SigmoidBCE(b.maskHead(levels, rois), target("targets", n.maskTargets), target("weights", n.maskWeights)))
	}
	if b.err != nil {
		t.Fatal(b.err)
	}
	grads, err := G.Grad(loss, append(levels, b.params...)...)
	if err != nil {
		t.Fatal(err)
	}
	vm, err := ops.NewTapeMachine(sub.g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vm.Close() })
	return vm, loss, grads, op
}

func scalarOf(t *testing.T, v G.Value) float64 {
	t.Helper()
	switch s := v.(type) {
	case *G.F32:
		return float64(*s)
	case *tensor.Dense:
		return float64(s.Float32s()[0])
	}
	t.Fatalf("loss is %T", v)
	return 0
}

// The mask head the training graph runs on the step's RoIs (maskLossOp)
// gives the loss and gradients of the head built in place on those RoIs,
// bit for bit, for changing numbers of RoIs (none included) and a loss
// gradient other than 1. The default configuration's head has BatchNorm,
// whose statistics are those of the RoIs in use only; torchvision's (the
// r50fpn preset's) runs on more rows than RoIs from 16 on (headRows),
// rows that weigh nothing.
func TestMaskLossFollowsHeadInPlace(t *testing.T) {
	for _, cfg := range []Config{DefaultConfig(3, 64), func() Config {
		c := DefaultConfig(3, 64)
		c.MaskConvBias = true
		c.MaskRoIsPerImage = 16
		return c
	}()} {
		c := newMaskHeadCase(t, cfg, 2)
		rng := rand.New(rand.NewPCG(9, 10))
		dynamic, dLoss, dGrads := c.graph(t, true, false)
		twice, tLoss, tGrads := c.graph(t, true, true)
		for _, rows := range []int{3, 8, 1, 3, 0, 17, 31, 23, 17} {
			if rows > c.rois.Shape()[0] {
				continue
			}
			c.setRows(rows, rng)
			for _, vm := range []G.VM{dynamic, twice} {
				vm.Reset()
				if err := vm.RunAll(); err != nil {
					t.Fatalf("%d RoIs: %v", rows, err)
				}
			}
			got, gotTwice := scalarOf(t, dLoss.Value()), scalarOf(t, tLoss.Value())
			if rows == 0 {
				if got != 0 || gotTwice != 0 {
					t.Fatalf("no RoIs: loss %v, %v, want 0", got, gotTwice)
				}
				for i, g := range dGrads {
					if slices.ContainsFunc(g.Value().Data().([]float32), func(v float32) bool { return v != 0 }) {
						t.Fatalf("no RoIs: gradient %d is not zero", i)
					}
				}
				continue
			}
			static, sLoss, sGrads := c.graph(t, false, false)
			if err := static.RunAll(); err != nil {
				t.Fatal(err)
			}
			want := scalarOf(t, sLoss.Value())
			if got != want || gotTwice != 2*want {
				t.Fatalf("MaskConvBias %v, %d RoIs: loss %v (twice %v), in place %v", cfg.MaskConvBias, rows, got, gotTwice, want)
			}
			for i := range sGrads {
				w := sGrads[i].Value().Data().([]float32)
				g, g2 := dGrads[i].Value().Data().([]float32), tGrads[i].Value().Data().([]float32)
				for j := range w {
					if g[j] != w[j] || g2[j] != 2*w[j] {
						t.Fatalf("MaskConvBias %v, %d RoIs: gradient %d [%d] is %v (twice %v), in place %v", cfg.MaskConvBias, rows, i, j, g[j], g2[j], w[j])
					}
				}
			}
		}
	}
}

// headRows pads torchvision's head to 8 to 15 times a power of two, at
// most the sampler's rows, and leaves a head with BatchNorm alone.
func TestMaskHeadRows(t *testing.T) {
	bias := R50FPNConfig(3, 512)
	op := &maskLossOp{net: &Net{cfg: bias}, rois: tensor.Shape{1024, 5}}
	for rows, want := range map[int]int{1: 1, 15: 15, 16: 16, 17: 18, 31: 32, 33: 36, 150: 160, 285: 288, 1000: 1024, 1024: 1024} {
		if got := op.headRows(rows); got != want {
			t.Errorf("%d RoIs: %d rows, want %d", rows, got, want)
		}
	}
	op.rois = tensor.Shape{1000, 5}
	if got := op.headRows(999); got != 1000 {
		t.Errorf("999 RoIs of at most 1000: %d rows, want 1000", got)
	}
	op.net.cfg = DefaultConfig(3, 64) // BatchNorm in the head
	if got := op.headRows(17); got != 17 {
		t.Errorf("a head with BatchNorm: 17 RoIs run as %d rows", got)
	}
}

// A training graph keeps at most maskHeadCache head graphs: the least
// recently used goes, and comes back built anew when its size returns.
func TestMaskHeadCacheBounded(t *testing.T) {
	cfg := DefaultConfig(3, 64)
	cfg.MaskRoIsPerImage = 20 // 40 rows, one graph per number of RoIs (BatchNorm)
	c := newMaskHeadCase(t, cfg, 2)
	vm, loss, _, op := c.graphOp(t, true, false)
	var sizes []int
	for r := 1; r <= maskHeadCache+3; r++ {
		sizes = append(sizes, r)
	}
	first := 0.0
	for _, rows := range append(sizes, 1) {
		c.setRows(rows, rand.New(rand.NewPCG(uint64(rows), 0)))
		vm.Reset()
		if err := vm.RunAll(); err != nil {
			t.Fatalf("%d RoIs: %v", rows, err)
		}
		if len(op.heads) > maskHeadCache || len(op.recent) != len(op.heads) {
			t.Fatalf("%d RoIs: %d graphs kept (%d in the order), at most %d", rows, len(op.heads), len(op.recent), maskHeadCache)
		}
		if rows == 1 {
			if first == 0 {
				first = scalarOf(t, loss.Value())
			} else if got := scalarOf(t, loss.Value()); got != first {
				t.Fatalf("1 RoI again, on a graph built anew: loss %v, first %v", got, first)
			}
		}
	}
	if _, ok := op.heads[1]; !ok {
		t.Fatal("the graph of 1 RoI was not built anew")
	}
}
