package ops

import (
	"fmt"
	"hash"

	"github.com/chewxy/hm"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
)

// opSpec is everything that makes one of this package's ops: its inputs
// with their shapes and dtypes, its output, its CPU twin, its device
// launcher and its gradient. specOp turns a spec into a Gorgonia op, so
// that Gorgonia's interfaces (Op, SDOp, UsePreallocDoer) are written once,
// and every op checks its arguments in one place (bind).
type opSpec struct {
	// name names the op in errors and in String: "RoIAlign backward".
	name string
	// kind, when set, names the op in String and its hash instead of
	// name: ops that report their errors under one name ("Conv backward"
	// for the data and the weight gradients) must still hash apart.
	kind string
	// config names every parameter of the op, shapes included. String and
	// the hash are built from name and config, and gorgonia merges nodes
	// whose ops hash alike: two ops that compute different things must
	// differ here.
	config string

	// inputs and out give the shapes the op reads and writes. Shape () is
	// a scalar, as gorgonia has them: a scalar input arrives on the host
	// whatever the other inputs' place (gorgonia hands a scalar op its
	// output gradient so), as a *G.F32, a *G.F64 or a tensor of one
	// element; a scalar output leaves the CPU twin as a *G.F32 or *G.F64.
	inputs []argSpec
	out    tensor.Shape
	dtype  tensor.Dtype // of the output and of every input without its own

	// cpu runs the CPU twin: in are the host inputs, contiguous, checked
	// against inputs; out has the output's shape and dtype and undefined
	// contents, which cpu must overwrite entirely.
	cpu func(in []*tensor.Dense, out *tensor.Dense) error
	// device runs the op on a device; nil for an op that has no device
	// kernels yet, whose device inputs are then refused with advice.
	device func(a *deviceArgs) (*tensor.Dense, error)
	// run, when set, replaces bind, cpu and device: it takes the inputs as
	// gorgonia hands them (their number checked) and decides itself where
	// its output lives. For ops whose job is placement: ToDevice, ToHost.
	run func(in []G.Value, prealloc G.Value) (G.Value, error)
	// moveTo and moveLike tell CheckPlacement where a run op puts its
	// output: on moveTo's device (ToDevice), where its second input lives
	// (MoveLike), or else on the host (ToHost).
	moveTo   *backend.Device
	moveLike bool

	// diffWRT says which inputs the op is differentiable with respect to
	// (none when nil), and grad returns their gradients (nil for the
	// others) given the op's output and the gradient flowing into it.
	diffWRT []bool
	grad    func(in G.Nodes, out, grad *G.Node) (G.Nodes, error)
}

// argSpec is one input of an op: its name (in errors), its shape, and its
// dtype when it is not the op's.
type argSpec struct {
	name  string
	shape tensor.Shape
	dtype tensor.Dtype
}

func (a argSpec) dtypeIn(s *opSpec) tensor.Dtype {
	if a.dtype == (tensor.Dtype{}) {
		return s.dtype
	}
	return a.dtype
}

// deviceArgs are an op's inputs on a device, checked: their tensors and
// addresses in the order of opSpec.inputs, with the output the tape machine
// offers for reuse. A scalar input is a host tensor of shape () with
// address 0.
type deviceArgs struct {
	spec     *opSpec
	dev      *backend.Device
	in       []*tensor.Dense
	ptr      []backend.DevicePtr
	prealloc G.Value

	// in and ptr's memory for ops of up to inlineArgs inputs (all but a
	// few), so that binding a node's inputs allocates once.
	inBuf  [inlineArgs]*tensor.Dense
	ptrBuf [inlineArgs]backend.DevicePtr
}

const inlineArgs = 8

// output returns a device tensor of the op's output shape and dtype with
// its address: the one the tape machine offered when it fits, else a new
// one. Its contents are undefined.
func (a *deviceArgs) output() (*tensor.Dense, backend.DevicePtr, error) {
	return deviceOutput(a.spec.name, a.dev, a.prealloc, a.spec.dtype, a.spec.out)
}

// specOp is the Gorgonia op an opSpec describes.
type specOp struct {
	*opSpec
	// releases are the nodes whose values are dead once this op has run,
	// as NewTapeMachine planned (planReleases).
	releases []*G.Node
}

func newOp(s *opSpec) *specOp { return &specOp{opSpec: s} }

func (op *specOp) Arity() int { return len(op.inputs) }

// Type is a function of tensors of the inputs' and the output's ranks (of
// scalars for rank 0), all of one element type, which gorgonia's type
// system unifies, except inputs of a dtype of their own (an index vector),
// typed with it.
func (op *specOp) Type() hm.Type {
	ranks := make([]int, 0, len(op.inputs)+1)
	own := false
	for _, a := range op.inputs {
		ranks = append(ranks, a.shape.Dims())
		own = own || a.dtype != (tensor.Dtype{})
	}
	ranks = append(ranks, op.out.Dims())
	if !own {
		return fnType(ranks...)
	}
	ts := fnType(ranks...).(*hm.FunctionType).FlatTypes()
	for i, a := range op.inputs {
		if a.dtype == (tensor.Dtype{}) {
			continue
		}
		if a.shape.Dims() == 0 {
			ts[i] = a.dtype
		} else {
			ts[i] = G.TensorType{Dims: a.shape.Dims(), Of: a.dtype}
		}
	}
	return hm.NewFnType(ts...)
}

func (op *specOp) InferShape(...G.DimSizer) (tensor.Shape, error) { return op.out.Clone(), nil }
func (op *specOp) ReturnsPtr() bool                               { return false }
func (op *specOp) CallsExtern() bool                              { return false }
func (op *specOp) OverwritesInput() int                           { return -1 }
func (op *specOp) String() string                                 { return op.kindName() + "(" + op.config + ")" }
func (op *specOp) WriteHash(h hash.Hash)                          { writeHash(h, op) }
func (op *specOp) Hashcode() uint32                               { return hashOf(op) }

func (s *opSpec) kindName() string {
	if s.kind != "" {
		return s.kind
	}
	return s.name
}

func (op *specOp) Do(in ...G.Value) (G.Value, error) { return op.UsePreallocDo(nil, in...) }

// UsePreallocDo runs the op where its inputs live: on their device, or on
// the host with the CPU twin, reusing prealloc when it fits.
func (op *specOp) UsePreallocDo(prealloc G.Value, in ...G.Value) (G.Value, error) {
	out, err := op.do(prealloc, in)
	if err == nil && len(op.releases) > 0 {
		err = op.release()
	}
	return out, err
}

// do runs the op: its run override, else on the device of its inputs, else
// on the host with the CPU twin.
func (op *specOp) do(prealloc G.Value, in []G.Value) (G.Value, error) {
	if op.run != nil {
		if err := op.checkArity(in); err != nil {
			return nil, err
		}
		return op.run(in, prealloc)
	}
	onDevice, host, err := op.bind(in)
	if err != nil {
		return nil, err
	}
	if onDevice != nil {
		onDevice.prealloc = prealloc
		return op.device(onDevice)
	}
	out := output(prealloc, op.dtype, op.out)
	if err := op.cpu(host, out); err != nil {
		return nil, fmt.Errorf("ops: %s: %w", op.name, err)
	}
	if op.out.Dims() == 0 {
		return scalarValue(out), nil
	}
	return out, nil
}

func (op *specOp) DiffWRT(inputs int) []bool {
	if op.diffWRT == nil {
		return make([]bool, inputs)
	}
	return op.diffWRT
}

func (op *specOp) SymDiff(inputs G.Nodes, output, grad *G.Node) (G.Nodes, error) {
	if op.grad == nil {
		return nil, fmt.Errorf("ops: %s is not differentiable", op.name)
	}
	if len(inputs) != len(op.inputs) {
		return nil, fmt.Errorf("ops: %v: want %d inputs, got %d", op, len(op.inputs), len(inputs))
	}
	// The nodes made here are recorded, so that NewTapeMachine can remove
	// the gradients G.Grad leaves unread (deadgrads.go).
	if g := graphOf(append(G.Nodes{output, grad}, inputs...)); g != nil {
		defer recordSymDiff(g, len(g.AllNodes()))
	}
	return op.grad(inputs, output, grad)
}

// checkArity checks the number of an op's input values.
func (s *opSpec) checkArity(in []G.Value) error {
	if len(in) != len(s.inputs) {
		return fmt.Errorf("ops: %s: want %d inputs, got %d", s.name, len(s.inputs), len(in))
	}
	return nil
}

// bind checks an op's input values against its spec: their number, their
// place (all on the host, or all on one device; scalars on the host), their
// dtypes and shapes. On the host it returns them contiguous; on a device,
// ready for the device launcher.
func (s *opSpec) bind(in []G.Value) (*deviceArgs, []*tensor.Dense, error) {
	if err := s.checkArity(in); err != nil {
		return nil, nil, err
	}
	var namesBuf [inlineArgs]string
	var placedBuf [inlineArgs]G.Value
	names, placed := namesBuf[:0], placedBuf[:0]
	for i, a := range s.inputs {
		if a.shape.Dims() > 0 {
			names, placed = append(names, a.name), append(placed, in[i])
		}
	}
	dev, err := inputsDevice(s.name, names, placed)
	if err != nil {
		return nil, nil, err
	}
	var da *deviceArgs
	var args []*tensor.Dense
	var ptr []backend.DevicePtr
	if dev != nil {
		if s.device == nil {
			return nil, nil, errNoDeviceKernel(s.name)
		}
		da = &deviceArgs{spec: s, dev: dev}
		if len(in) <= inlineArgs {
			args, ptr = da.inBuf[:len(in)], da.ptrBuf[:len(in)]
		} else {
			args, ptr = make([]*tensor.Dense, len(in)), make([]backend.DevicePtr, len(in))
		}
		da.in, da.ptr = args, ptr
	} else {
		args = make([]*tensor.Dense, len(in))
	}
	for i, a := range s.inputs {
		dt := a.dtypeIn(s)
		switch {
		case a.shape.Dims() == 0:
			args[i], err = hostScalar(s.name, a.name, in[i], dt)
		case dev != nil:
			args[i], ptr[i], err = deviceTensor(s.name, a.name, dev, in[i], dt, a.shape)
		default:
			args[i], err = dense(s.name, a.name, in[i], dt, a.shape)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if da != nil {
		return da, nil, nil
	}
	return nil, args, nil
}

// errNoDeviceKernel is the error of an op without device kernels whose
// inputs are on a device.
func errNoDeviceKernel(op string) error {
	return fmt.Errorf("ops: %s: no GPU kernel yet; move its inputs to the host with ops.ToHost", op)
}

// floatTwin makes an op's CPU twin from a kernel generic over the element
// type: f32 and f64 are its two instantiations, and the one of the output's
// dtype runs on the inputs' and the output's backing slices. Inputs of
// another dtype than the output's are not for floatTwin.
func floatTwin[P any](p P, f32 func(P, [][]float32, []float32) error, f64 func(P, [][]float64, []float64) error) func([]*tensor.Dense, *tensor.Dense) error {
	return func(in []*tensor.Dense, out *tensor.Dense) error {
		switch out.Dtype() {
		case tensor.Float32:
			return f32(p, floatsOf[float32](in), out.Float32s())
		case tensor.Float64:
			return f64(p, floatsOf[float64](in), out.Float64s())
		}
		return fmt.Errorf("dtype %v: want float32 or float64", out.Dtype())
	}
}

// floatsOf returns the backing slices of in, of element type T. (Through
// Float32s and Float64s: Data panics on a tensor of no elements.)
func floatsOf[T kernels.Float](in []*tensor.Dense) [][]T {
	out := make([][]T, len(in))
	for i, t := range in {
		var s any
		if t.Dtype() == tensor.Float32 {
			s = t.Float32s()
		} else {
			s = t.Float64s()
		}
		out[i] = s.([]T)
	}
	return out
}

// optional returns in[i], an input a twin may lack (a bias, a residual),
// or nil when the op has fewer inputs.
// affine returns a norm's gamma and beta (nil where absent) from a twin's
// inputs, which hold those present from in[first] on, gamma first.
func affine[T any](hasGamma, hasBeta bool, in [][]T, first int) (gamma, beta []T) {
	i := first
	if hasGamma {
		gamma, i = in[i], i+1
	}
	if hasBeta {
		beta = in[i]
	}
	return gamma, beta
}

// appendAffineGrads appends to grads a norm's gradients of gamma and beta
// (n of them, each of c elements) from the op that gives them packed: as
// they are for one, unpacked for two.
func appendAffineGrads(op string, grads G.Nodes, packed *G.Node, n, c int) (G.Nodes, error) {
	if n == 1 {
		return append(grads, packed), nil
	}
	parts, err := autograd.Unpack(packed, tensor.Shape{c}, tensor.Shape{c})
	if err != nil {
		return nil, fmt.Errorf("ops: %s: %w", op, err)
	}
	return append(grads, parts...), nil
}

func optional[T any](in [][]T, i int) []T {
	if i < len(in) {
		return in[i]
	}
	return nil
}
