package ops

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/backend"
)

// layoutParity runs op on the GPU and on the CPU (parity: TolParity32/64,
// and a reused, poisoned output buffer) and asks for the same bits: the
// layout ops move elements, and GatherRows' backward adds in the CPU
// twin's order.
func layoutParity(t *testing.T, op G.Op, dt tensor.Dtype, inputs ...*tensor.Dense) {
	t.Helper()
	gpuOut, cpuOut := parity(t, gpu(t), op, dt, inputs...)
	if !slices.Equal(gpuOut, cpuOut) {
		t.Errorf("%v: GPU and CPU differ in their bits", op)
	}
}

// Permute, Concat, Slice (and its backward), Reshape, Detach and
// GatherRows (and its backward) on the GPU against their CPU twins,
// float32 and float64: permutations that keep the innermost axis (units of
// 4, 8 and 16 bytes) and ones that move it (tiles cut at the edges, DETR's
// [N, C, HW] -> [N, HW, C] at a small size), slices at unaligned offsets,
// repeated gather indices.
func TestGPULayoutParity(t *testing.T) {
	gpu(t)
	rng := rand.New(rand.NewPCG(26, 7))
	g := G.NewGraph()
	node := func(dt tensor.Dtype, shape ...int) *G.Node {
		return G.NewTensor(g, dt, len(shape), G.WithShape(shape...))
	}
	for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
		for _, c := range []struct {
			shape, perm []int
		}{
			{[]int{2, 200, 8, 32}, []int{0, 2, 1, 3}}, // heads: 16-byte units
			{[]int{2, 37, 3, 5}, []int{0, 2, 1, 3}},   // odd rows: 4- or 8-byte units
			{[]int{2, 6, 3, 2}, []int{0, 2, 1, 3}},    // rows of 8 bytes (float32)
			{[]int{2, 64, 30, 45}, []int{0, 2, 3, 1}}, // NCHW -> [N, HW, C]: tiles
			{[]int{2, 1350, 64}, []int{0, 2, 1}},      // and back
			{[]int{3, 33, 70}, []int{1, 0, 2}},
			{[]int{2, 3, 4, 5, 6}, []int{4, 2, 0, 3, 1}},
			{[]int{70000, 2}, []int{1, 0}}, // a batch of one, 2188 tiles along the rows
			{[]int{5}, []int{0}},
		} {
			t.Run(fmt.Sprintf("permute_%v_%v/%v", c.shape, c.perm, dt), func(t *testing.T) {
				s, err := permuteShapeOf("Permute", node(dt, c.shape...), c.perm)
				if err != nil {
					t.Fatal(err)
				}
				x := randTensor(rng, dt, -4, 4, c.shape...)
				layoutParity(t, permuteOp(s), dt, x)
			})
		}
		t.Run(fmt.Sprintf("concat/%v", dt), func(t *testing.T) {
			shapes := [][]int{{2, 300, 8}, {2, 75, 8}, {2, 19, 8}, {2, 5, 8}}
			var nodes G.Nodes
			var xs []*tensor.Dense
			for _, sh := range shapes {
				nodes = append(nodes, node(dt, sh...))
				xs = append(xs, randTensor(rng, dt, -4, 4, sh...))
			}
			s, err := concatShapeOf(1, nodes)
			if err != nil {
				t.Fatal(err)
			}
			layoutParity(t, concatOp(s), dt, xs...)
			s, err = concatShapeOf(-1, G.Nodes{node(dt, 3, 5), node(dt, 3, 2)})
			if err != nil {
				t.Fatal(err)
			}
			layoutParity(t, concatOp(s), dt, randTensor(rng, dt, -4, 4, 3, 5), randTensor(rng, dt, -4, 4, 3, 2))
		})
		for _, c := range []struct {
			shape            []int
			axis, start, end int
		}{
			{[]int{2, 400, 16}, 1, 100, 300},
			{[]int{3, 7}, -1, 1, 4}, // unaligned rows
			{[]int{9, 5}, 0, 8, 9},
		} {
			t.Run(fmt.Sprintf("slice_%v_%d_%d:%d/%v", c.shape, c.axis, c.start, c.end, dt), func(t *testing.T) {
				s, err := sliceShapeOf(node(dt, c.shape...), c.axis, c.start, c.end)
				if err != nil {
					t.Fatal(err)
				}
				layoutParity(t, sliceOp(s), dt, randTensor(rng, dt, -4, 4, c.shape...))
				layoutParity(t, sliceGradOp(s), dt, randTensor(rng, dt, -4, 4, s.out()...))
			})
		}
		t.Run(fmt.Sprintf("reshape/%v", dt), func(t *testing.T) {
			s, err := reshapeShapeOf(node(dt, 6, 35), []int{-1, 7})
			if err != nil {
				t.Fatal(err)
			}
			layoutParity(t, reshapeOp(s), dt, randTensor(rng, dt, -4, 4, 6, 35))
		})
		for _, c := range []struct {
			n, d int
			idx  []int
		}{
			{2000, 256, nil}, // 300 random rows, repeats likely
			{50, 3, []int{49, 0, 49, 7, 49, 0}},
			{10, 5, []int{3}},
		} {
			t.Run(fmt.Sprintf("gather_%dx%d/%v", c.n, c.d, dt), func(t *testing.T) {
				idx := c.idx
				if idx == nil {
					for range 300 {
						idx = append(idx, rng.IntN(c.n))
					}
				}
				s, err := gatherShapeOf(node(dt, c.n, c.d), G.NewVector(g, tensor.Int, G.WithShape(len(idx))))
				if err != nil {
					t.Fatal(err)
				}
				iv := intVector(idx...)
				layoutParity(t, gatherOp(s), dt, randTensor(rng, dt, -4, 4, c.n, c.d), iv)
				layoutParity(t, gatherGradOp(s), dt, randTensor(rng, dt, -4, 4, len(idx), c.d), iv)
			})
		}
	}
}

// A bad index on the GPU: its row is zero and the next synchronisation
// reports it.
func TestGPUGatherRowsBadIndex(t *testing.T) {
	dev := gpu(t)
	g := G.NewGraph()
	s, err := gatherShapeOf(G.NewMatrix(g, tensor.Float32, G.WithShape(4, 3)), G.NewVector(g, tensor.Int, G.WithShape(2)))
	if err != nil {
		t.Fatal(err)
	}
	x := toDev(t, dev, randTensor(rand.New(rand.NewPCG(1, 2)), tensor.Float32, 1, 2, 4, 3))
	out, err := gatherOp(s).Do(x, toDev(t, dev, intVector(1, 4)))
	if err != nil {
		t.Fatalf("launch: %v", err)
	}
	_, err = dev.ToHost(out.(*tensor.Dense))
	if err == nil || !strings.Contains(err.Error(), "ops: GatherRows: an index is outside [0, 4)") {
		t.Errorf("got %v, want the bad index reported", err)
	}
	// The word was cleared: the next good run is quiet.
	out, err = gatherOp(s).Do(x, toDev(t, dev, intVector(1, 3)))
	if err == nil {
		_, err = dev.ToHost(out.(*tensor.Dense))
	}
	if err != nil {
		t.Errorf("a good run after the bad one: %v", err)
	}
}

// Gradient checks through the device ops, float64: inputs and loss on the
// host, ToDevice and ToHost around the ops (layoutChain).
func TestGPULayoutGradCheck(t *testing.T) {
	dev := gpu(t)
	if _, err := autograd.CheckGrad(layoutChain(dev), layoutChainInputs(), 3, G.WithEngine(dev.Engine())); err != nil {
		t.Error(err)
	}
}

// The same chain on the host.
func TestLayoutChainGradCheck(t *testing.T) {
	if _, err := autograd.CheckGrad(layoutChain(nil), layoutChainInputs(), 3); err != nil {
		t.Error(err)
	}
}

func layoutChainInputs() []autograd.Input {
	rng := rand.New(rand.NewPCG(3, 3))
	return []autograd.Input{
		{Name: "a", Value: randTensor(rng, tensor.Float64, -3, 3, 2, 3, 2, 4)},
		{Name: "b", Value: randTensor(rng, tensor.Float64, -3, 3, 2, 2, 3, 4)},
	}
}

// layoutChain permutes a, joins b, reshapes, gathers rows (one twice),
// slices and transposes, on dev when not nil (the values moved there and
// back).
func layoutChain(dev *backend.Device) autograd.Builder {
	return func(g *G.ExprGraph, in G.Nodes) (*G.Node, error) {
		place := func(n *G.Node) (*G.Node, error) {
			if dev == nil {
				return n, nil
			}
			return ToDevice(n, dev)
		}
		a, err := place(in[0])
		if err != nil {
			return nil, err
		}
		b, err := place(in[1])
		if err != nil {
			return nil, err
		}
		pa, err := Permute(a, 0, 2, 1, 3) // [2, 2, 3, 4]
		if err != nil {
			return nil, err
		}
		c, err := Concat(1, pa, b) // [2, 4, 3, 4]
		if err != nil {
			return nil, err
		}
		r, err := Reshape(c, 8, 12)
		if err != nil {
			return nil, err
		}
		idx, err := place(G.NodeFromAny(g, intVector(7, 0, 7, 3), G.WithName("idx")))
		if err != nil {
			return nil, err
		}
		gth, err := GatherRows(r, idx)
		if err != nil {
			return nil, err
		}
		sl, err := Slice(gth, 1, 2, 9)
		if err != nil {
			return nil, err
		}
		tr, err := Permute(sl, 1, 0) // the innermost axis moves
		if err != nil || dev == nil {
			return tr, err
		}
		return ToHost(tr)
	}
}

// The permute kernel a shape gets, without a GPU: DETR's heads take
// permute_copy with 16-byte units and 32-bit indices; its tokens
// permute_tile.
func TestPermutePlan(t *testing.T) {
	for _, c := range []struct {
		shape, perm []int
		dt          tensor.Dtype
		want        string
	}{
		{[]int{2, 20000, 8, 32}, []int{0, 2, 1, 3}, tensor.Float32, "layout_permute_copy_b16_i32 grid=10000x1x1"},
		{[]int{2, 256, 100, 150}, []int{0, 2, 3, 1}, tensor.Float32, "layout_permute_tile_b4 grid=8x469x2"},
		{[]int{2, 37, 3, 5}, []int{0, 2, 1, 3}, tensor.Float64, "layout_permute_copy_b8_i32 grid=5x1x1"},
		{[]int{2, 6, 3, 2}, []int{0, 2, 1, 3}, tensor.Float32, "layout_permute_copy_b8_i32 grid=1x1x1"},
	} {
		g := G.NewGraph()
		s, err := permuteShapeOf("Permute", G.NewTensor(g, c.dt, len(c.shape), G.WithShape(c.shape...)), c.perm)
		if err != nil {
			t.Fatal(err)
		}
		pl, err := permutePlanFor(s.params(), int(c.dt.Size()), 256, 512)
		if err != nil {
			t.Fatal(err)
		}
		got := fmt.Sprintf("%s grid=%dx%dx%d", pl.k.Name(), pl.cfg.Grid.X, pl.cfg.Grid.Y, pl.cfg.Grid.Z)
		if got != c.want {
			t.Errorf("%v perm %v %v: %s, want %s", c.shape, c.perm, c.dt, got, c.want)
		}
	}
}

// BenchmarkGPULayout times the layout ops on the GPU at DETR's shapes,
// float32 (layoutBenchPermutes; the four levels' tokens [2, L, 256]
// concatenated, and the first level sliced back out and its gradient; 300
// of 20,000 rows of 256 gathered, and the gather's backward): the median of b.N runs after 5 untimed ones (runCase), with
// the compulsory bytes (each element read once and written once; the
// backward also writes the zeros of dx) over it as GB/s.
func BenchmarkGPULayout(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	g := G.NewGraph()
	for _, c := range layoutBenchPermutes {
		s, err := permuteShapeOf("Permute", G.NewTensor(g, tensor.Float32, len(c.shape), G.WithShape(c.shape...)), c.perm)
		if err != nil {
			b.Fatal(err)
		}
		x := randTensor(rng, tensor.Float32, -4, 4, c.shape...)
		b.Run(fmt.Sprintf("impl=cuda/case=%s/op=permute", c.name), func(b *testing.B) {
			runCase(b, "cuda", permuteOp(s), []*tensor.Dense{x}, float64(8*tensor.Shape(c.shape).TotalSize()))
		})
	}
	var nodes G.Nodes
	var xs []*tensor.Dense
	total := 0
	for _, l := range layoutBenchLevels {
		nodes = append(nodes, G.NewTensor(g, tensor.Float32, 3, G.WithShape(2, l, 256)))
		xs = append(xs, randTensor(rng, tensor.Float32, -4, 4, 2, l, 256))
		total += 2 * l * 256
	}
	cs, err := concatShapeOf(1, nodes)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("impl=cuda/case=levels_2x17821x256/op=concat", func(b *testing.B) {
		runCase(b, "cuda", concatOp(cs), xs, float64(8*total))
	})
	// The first level back out of the tokens, and its gradient: the level
	// written into zeros of all the tokens.
	tokens := total / (2 * 256)
	ss, err := sliceShapeOf(G.NewTensor(g, tensor.Float32, 3, G.WithShape(2, tokens, 256)), 1, 0, layoutBenchLevels[0])
	if err != nil {
		b.Fatal(err)
	}
	level := 2 * layoutBenchLevels[0] * 256
	all := randTensor(rng, tensor.Float32, -4, 4, 2, tokens, 256)
	dLevel := randTensor(rng, tensor.Float32, -1, 1, 2, layoutBenchLevels[0], 256)
	b.Run("impl=cuda/case=level0_of_2x17821x256/op=slice/pass=fwd", func(b *testing.B) {
		runCase(b, "cuda", sliceOp(ss), []*tensor.Dense{all}, float64(8*level))
	})
	b.Run("impl=cuda/case=level0_of_2x17821x256/op=slice/pass=bwd", func(b *testing.B) {
		runCase(b, "cuda", sliceGradOp(ss), []*tensor.Dense{dLevel}, float64(4*level+4*total))
	})
	const n, k, d = 20000, 300, 256
	var idx []int
	for range k {
		idx = append(idx, rng.IntN(n))
	}
	gs, err := gatherShapeOf(G.NewMatrix(g, tensor.Float32, G.WithShape(n, d)), G.NewVector(g, tensor.Int, G.WithShape(k)))
	if err != nil {
		b.Fatal(err)
	}
	x := randTensor(rng, tensor.Float32, -4, 4, n, d)
	dy := randTensor(rng, tensor.Float32, -1, 1, k, d)
	b.Run("impl=cuda/case=select_300_of_20000x256/op=gather/pass=fwd", func(b *testing.B) {
		runCase(b, "cuda", gatherOp(gs), []*tensor.Dense{x, intVector(idx...)}, float64(8*k*d+8*k))
	})
	b.Run("impl=cuda/case=select_300_of_20000x256/op=gather/pass=bwd", func(b *testing.B) {
		runCase(b, "cuda", gatherGradOp(gs), []*tensor.Dense{dy, intVector(idx...)}, float64(4*k*d+4*n*d+8*k))
	})
}
