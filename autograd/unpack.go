package autograd

import (
	"fmt"
	"hash"
	"hash/fnv"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

// Unpack splits packed, a rank-1 node holding several tensors one after the
// other, into one node per shape. A gorgonia op has a single output, so a
// backward op that computes several gradients in one pass (reading its inputs
// once) writes them into one vector, and Unpack carves them out; a host step
// of a model (a matcher, a sampler) packs its outputs the same way.
//
// The parts are data: no gradient flows from them back into packed (the op
// tells G.Grad it is differentiable with respect to nothing), so a part may
// feed differentiable ops, as a detached tensor does in PyTorch. Pack only
// values that need no gradient: gradients, or a host step's outputs.
func Unpack(packed *G.Node, shapes ...tensor.Shape) (G.Nodes, error) {
	if packed == nil {
		return nil, fmt.Errorf("autograd: Unpack: packed is nil")
	}
	if packed.Shape().Dims() != 1 {
		return nil, fmt.Errorf("autograd: Unpack: packed must be a vector, got shape %v", packed.Shape())
	}
	total := 0
	for _, s := range shapes {
		total += s.TotalSize()
	}
	if got := packed.Shape()[0]; got != total {
		return nil, fmt.Errorf("autograd: Unpack: packed has %d elements, the shapes %v need %d", got, shapes, total)
	}
	parts := make(G.Nodes, len(shapes))
	offset := 0
	for i, s := range shapes {
		op := unpackOp{offset: offset, shape: s.Clone(), total: total}
		n, err := G.ApplyOp(op, packed)
		if err != nil {
			return nil, fmt.Errorf("autograd: Unpack: part %d: %w", i, err)
		}
		parts[i] = n
		offset += s.TotalSize()
	}
	return parts, nil
}

// UnpackAt is Unpack for the parts that start at element offset of packed
// and leave the rest of it alone: a packed vector whose other parts are
// read where they lie, by the ops that consume packed itself, is not copied
// whole.
func UnpackAt(packed *G.Node, offset int, shapes ...tensor.Shape) (G.Nodes, error) {
	if packed == nil {
		return nil, fmt.Errorf("autograd: UnpackAt: packed is nil")
	}
	if packed.Shape().Dims() != 1 {
		return nil, fmt.Errorf("autograd: UnpackAt: packed must be a vector, got shape %v", packed.Shape())
	}
	total := packed.Shape()[0]
	if need := offset + PackedSize(shapes...); offset < 0 || need > total {
		return nil, fmt.Errorf("autograd: UnpackAt: packed has %d elements, the shapes %v at offset %d need %d", total, shapes, offset, need)
	}
	parts := make(G.Nodes, len(shapes))
	for i, s := range shapes {
		n, err := G.ApplyOp(unpackOp{offset: offset, shape: s.Clone(), total: total}, packed)
		if err != nil {
			return nil, fmt.Errorf("autograd: UnpackAt: part %d: %w", i, err)
		}
		parts[i] = n
		offset += s.TotalSize()
	}
	return parts, nil
}

// PackedSize is the length of the vector that packs tensors of these shapes.
func PackedSize(shapes ...tensor.Shape) int {
	n := 0
	for _, s := range shapes {
		n += s.TotalSize()
	}
	return n
}

// unpackOp copies elements [offset, offset+size) of a packed vector into a
// tensor of the given shape. It copies rather than aliasing the packed
// vector's memory: the tape machine reuses registers, and an alias would see
// the packed register overwritten once the packed node is dead.
type unpackOp struct {
	offset int
	shape  tensor.Shape
	total  int
}

func (op unpackOp) Arity() int { return 1 }

func (op unpackOp) Type() hm.Type {
	a := hm.TypeVariable('a')
	return hm.NewFnType(G.TensorType{Dims: 1, Of: a}, G.TensorType{Dims: op.shape.Dims(), Of: a})
}

func (op unpackOp) InferShape(in ...G.DimSizer) (tensor.Shape, error) {
	return op.shape.Clone(), nil
}

func (op unpackOp) Do(vals ...G.Value) (G.Value, error) {
	return op.UsePreallocDo(nil, vals...)
}

func (op unpackOp) UsePreallocDo(prealloc G.Value, vals ...G.Value) (G.Value, error) {
	if len(vals) != 1 {
		return nil, fmt.Errorf("autograd: %v: want 1 input, got %d", op, len(vals))
	}
	src, ok := vals[0].(*tensor.Dense)
	if !ok || src.Shape().TotalSize() != op.total || src.IsView() {
		return nil, fmt.Errorf("autograd: %v: input must be a contiguous vector of %d elements, got %T %v", op, op.total, vals[0], vals[0].Shape())
	}
	dst, err := part(prealloc, src, op.offset, op.shape)
	if err != nil {
		return nil, fmt.Errorf("autograd: %v: %w", op, err)
	}
	return dst, nil
}

// RunsOnDevice tells ops.CheckPlacement that Unpack takes device values:
// part copies on the device, into a tensor of its own.
func (op unpackOp) RunsOnDevice() bool { return true }

// DiffWRT and SymDiff make the parts constants for G.Grad: without them
// gorgonia's analysis fails on an unpacked part that feeds a
// differentiable op.
func (op unpackOp) DiffWRT(inputs int) []bool { return make([]bool, inputs) }

func (op unpackOp) SymDiff(G.Nodes, *G.Node, *G.Node) (G.Nodes, error) {
	return nil, fmt.Errorf("autograd: %v: the parts of a packed vector are data, not differentiable", op)
}

func (op unpackOp) ReturnsPtr() bool     { return false }
func (op unpackOp) CallsExtern() bool    { return false }
func (op unpackOp) OverwritesInput() int { return -1 }
func (op unpackOp) String() string {
	return fmt.Sprintf("unpack[%d:%d of %d]%v", op.offset, op.offset+op.shape.TotalSize(), op.total, op.shape)
}
func (op unpackOp) WriteHash(h hash.Hash) { fmt.Fprint(h, "stheno.", op.String()) }
func (op unpackOp) Hashcode() uint32 {
	h := fnv.New32a()
	op.WriteHash(h)
	return h.Sum32()
}
