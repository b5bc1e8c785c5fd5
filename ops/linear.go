package ops

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/kernels"
)

// Linear applies a linear map to the last dimension of x, as PyTorch's
// torch.nn.functional.linear: x [..., in] (one dimension or more), w
// [out, in] and the bias b [out] give
//
//	y [..., out] = x·wᵀ + b
//
// b may be nil: no bias. Differentiable with respect to x, w and b: dx =
// dy·w, dw = dyᵀ·x and db = the sum of dy, the last two summed over x's
// leading dimensions. The forward pass and both matrix gradients are GEMMs
// (kernels.Gemm on the host).
func Linear(x, w, b *G.Node) (*G.Node, error) {
	s, err := linearShape(x, w, b)
	if err != nil {
		return nil, err
	}
	if b != nil {
		return G.ApplyOp(gemmOp(s), x, w, b)
	}
	return G.ApplyOp(gemmOp(s), x, w)
}

// linearShape checks Linear's operands and returns its product.
func linearShape(x, w, b *G.Node) (gemmShape, error) {
	const op = "Linear"
	var none gemmShape
	if x == nil {
		return none, fmt.Errorf("ops: %s: x is nil, want shape [... in]", op)
	}
	xs := x.Shape()
	if xs.Dims() < 1 {
		return none, fmt.Errorf("ops: %s: x must have shape [... in] (one dimension or more), got a scalar", op)
	}
	if err := checkRank(op, "w", w, 2, "[out in]"); err != nil {
		return none, err
	}
	dt, err := floatDtype(op, "x", x)
	if err != nil {
		return none, err
	}
	others := map[string]*G.Node{"w": w}
	if b != nil {
		others["b"] = b
	}
	if err := sameDtype(op, dt, others); err != nil {
		return none, err
	}
	ws := w.Shape()
	if err := positiveSizes(op, "x", xs); err != nil {
		return none, err
	}
	if err := positiveSizes(op, "w", ws); err != nil {
		return none, err
	}
	out, in := ws[0], ws[1]
	if last := xs[len(xs)-1]; last != in {
		return none, fmt.Errorf("ops: %s: x's last dimension (%d) must equal w's in (%d): x [... in], w [out in], got x %v and w %v", op, last, in, xs, ws)
	}
	if b != nil {
		if s := b.Shape(); s.Dims() != 1 || s[0] != out {
			return none, fmt.Errorf("ops: %s: b must have shape [out] = [%d] (or be nil), got %v", op, out, s)
		}
	}
	ys := append(xs[:len(xs)-1:len(xs)-1].Clone(), out)
	s := gemmShape{
		op: op, args: [3]string{"x", "w", "b"},
		transB: true, batch: 1, m: xs.TotalSize() / in, n: out, k: in,
		a: xs.Clone(), b: ws.Clone(), c: ys, bias: b != nil, dt: dt,
	}
	return s, nil
}

// MatMul multiplies two matrices, as torch.mm: a [m, k] and b [k, n] give
// a·b [m, n]. Differentiable with respect to both: da = dc·bᵀ and db =
// aᵀ·dc, GEMMs like the product.
func MatMul(a, b *G.Node) (*G.Node, error) {
	s, err := matmulShape(a, b)
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(gemmOp(s), a, b)
}

// matmulShape checks MatMul's operands and returns its product.
func matmulShape(a, b *G.Node) (gemmShape, error) {
	const op = "MatMul"
	var none gemmShape
	if err := checkRank(op, "a", a, 2, "[m k]"); err != nil {
		return none, err
	}
	if err := checkRank(op, "b", b, 2, "[k n]"); err != nil {
		return none, err
	}
	dt, err := matmulOperands(op, a, b)
	if err != nil {
		return none, err
	}
	as, bs := a.Shape(), b.Shape()
	if as[1] != bs[0] {
		return none, fmt.Errorf("ops: %s: a's columns (%d) must equal b's rows (%d): a [m k], b [k n], got a %v and b %v", op, as[1], bs[0], as, bs)
	}
	s := gemmShape{
		op: op, args: [3]string{"a", "b"},
		batch: 1, m: as[0], n: bs[1], k: as[1],
		a: as.Clone(), b: bs.Clone(), c: tensor.Shape{as[0], bs[1]}, dt: dt,
	}
	return s, nil
}

// BatchedMatMul multiplies the matrices of two batches pairwise, as
// torch.bmm: a [B, m, k] and b [B, k, n] give [B, m, n]. With transA, a is
// [B, k, m] and its matrices' transposes are used; with transB, b is
// [B, n, k] likewise. Attention's scores q·kᵀ are BatchedMatMul(q, k,
// false, true) and its output p·v is BatchedMatMul(p, v, false, false).
// Differentiable with respect to both; the gradients are batched GEMMs.
func BatchedMatMul(a, b *G.Node, transA, transB bool) (*G.Node, error) {
	s, err := batchedMatMulShape(a, b, transA, transB)
	if err != nil {
		return nil, err
	}
	return G.ApplyOp(gemmOp(s), a, b)
}

// batchedMatMulShape checks BatchedMatMul's operands and returns its
// products.
func batchedMatMulShape(a, b *G.Node, transA, transB bool) (gemmShape, error) {
	const op = "BatchedMatMul"
	var none gemmShape
	wantA, wantB := "[B m k]", "[B k n]"
	if transA {
		wantA = "[B k m] (transA)"
	}
	if transB {
		wantB = "[B n k] (transB)"
	}
	if err := checkRank(op, "a", a, 3, wantA); err != nil {
		return none, err
	}
	if err := checkRank(op, "b", b, 3, wantB); err != nil {
		return none, err
	}
	dt, err := matmulOperands(op, a, b)
	if err != nil {
		return none, err
	}
	as, bs := a.Shape(), b.Shape()
	if as[0] != bs[0] {
		return none, fmt.Errorf("ops: %s: a and b must hold as many matrices, got a %v and b %v", op, as, bs)
	}
	m, ka := as[1], as[2]
	if transA {
		m, ka = ka, m
	}
	kb, n := bs[1], bs[2]
	if transB {
		kb, n = n, kb
	}
	if ka != kb {
		return none, fmt.Errorf("ops: %s: inner dimensions differ: a %s is %v (k=%d) and b %s is %v (k=%d)", op, wantA, as, ka, wantB, bs, kb)
	}
	s := gemmShape{
		op: op, args: [3]string{"a", "b"},
		transA: transA, transB: transB, batch: as[0], m: m, n: n, k: ka,
		a: as.Clone(), b: bs.Clone(), c: tensor.Shape{as[0], m, n}, dt: dt,
	}
	return s, nil
}

// matmulOperands checks the dtypes and sizes of a matrix product's
// operands, whose ranks are checked, and returns their dtype.
func matmulOperands(op string, a, b *G.Node) (tensor.Dtype, error) {
	dt, err := floatDtype(op, "a", a)
	if err != nil {
		return dt, err
	}
	if err := sameDtype(op, dt, map[string]*G.Node{"b": b}); err != nil {
		return dt, err
	}
	if err := positiveSizes(op, "a", a.Shape()); err != nil {
		return dt, err
	}
	return dt, positiveSizes(op, "b", b.Shape())
}

// gemmShape is a batch of matrix products as one op computes it:
//
//	c[i] = op(a[i])·op(b[i]) (+ bias on every row),   i < batch,
//
// op(a[i]) m x k (a[i] stored k x m when transA), op(b[i]) k x n (b[i]
// stored n x k when transB), c[i] m x n, all packed. a, b and c are the
// shapes of the op's tensors, which hold batch*m*k, batch*k*n and
// batch*m*n elements: Linear's x [..., in] is one m x in matrix. The
// forward ops of Linear, MatMul and BatchedMatMul are gemmOps, and so are
// their gradients with respect to the matrices (gradA, gradB), and theirs.
type gemmShape struct {
	// op names the op in errors ("Linear", "Linear backward"), args its
	// inputs: a, b and the bias.
	op             string
	args           [3]string
	transA, transB bool
	batch, m, n, k int
	a, b, c        tensor.Shape
	bias           bool // a third input [n] is added to every row of c
	dt             tensor.Dtype
}

func (s gemmShape) String() string {
	opA, opB := "a", "b"
	if s.transA {
		opA = "aᵀ"
	}
	if s.transB {
		opB = "bᵀ"
	}
	bias := ""
	if s.bias {
		bias = "+bias"
	}
	return fmt.Sprintf("c=%s·%s%s,batch=%d,m=%d,n=%d,k=%d,a=%v,b=%v,c=%v,%v",
		opA, opB, bias, s.batch, s.m, s.n, s.k, s.a, s.b, s.c, s.dt)
}

// params is the product as kernels.Gemm and the device's GEMM
// (linear_device.go) take it, every stride given.
func (s gemmShape) params() kernels.GemmParams {
	lda, ldb := s.k, s.n
	if s.transA {
		lda = s.m
	}
	if s.transB {
		ldb = s.k
	}
	return kernels.GemmParams{
		TransA: s.transA, TransB: s.transB, M: s.m, N: s.n, K: s.k,
		LDA: lda, LDB: ldb, LDC: s.n,
		Batch: s.batch, StrideA: s.m * s.k, StrideB: s.k * s.n, StrideC: s.m * s.n,
		Alpha: 1,
	}
}

// gemmOp is the op of s: (a, b[, bias]) -> c.
func gemmOp(s gemmShape) *specOp {
	inputs := []argSpec{{name: s.args[0], shape: s.a}, {name: s.args[1], shape: s.b}}
	diff := []bool{true, true}
	if s.bias {
		inputs = append(inputs, argSpec{name: s.args[2], shape: tensor.Shape{s.n}})
		diff = append(diff, true)
	}
	return newOp(&opSpec{
		name: s.op, config: s.String(),
		inputs: inputs, out: s.c, dtype: s.dt,
		cpu:     floatTwin(s, gemmForward[float32], gemmForward[float64]),
		device:  s.device,
		diffWRT: diff,
		grad:    s.grad,
	})
}

// grad returns the gradients of c with respect to a, b and the bias, given
// dc = grad: GEMMs of grad with the other operand, and the sum of grad's
// rows.
func (s gemmShape) grad(in G.Nodes, _, grad *G.Node) (G.Nodes, error) {
	operands := [3]*G.Node{in[0], in[1], grad}
	var out G.Nodes
	for _, g := range []gemmGrad{s.gradA(), s.gradB()} {
		d, err := G.ApplyOp(gemmOp(g.s), operands[g.from[0]], operands[g.from[1]])
		if err != nil {
			return nil, fmt.Errorf("ops: %s backward: %w", s.op, err)
		}
		out = append(out, d)
	}
	if s.bias {
		d, err := G.ApplyOp(sumRowsOp(s.biasRows()), grad)
		if err != nil {
			return nil, fmt.Errorf("ops: %s backward: %w", s.op, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// gemmGrad is the product that gives one gradient of a gemmOp, and where
// its operands come from: 0 and 1 are the gemmOp's a and b, 2 the
// gradient of its output.
type gemmGrad struct {
	s    gemmShape
	from [2]int
}

// backward returns the gradient of s that multiplies its operands i and j
// (0: a, 1: b, 2: the output gradient), m x k by k x n, into shape c.
func (s gemmShape) backward(i, j int, transA, transB bool, m, n, k int, c tensor.Shape) gemmGrad {
	names := [3]string{s.args[0], s.args[1], "grad"}
	shapes := [3]tensor.Shape{s.a, s.b, s.c}
	return gemmGrad{gemmShape{
		op: s.op + " backward", args: [3]string{names[i], names[j]},
		transA: transA, transB: transB, batch: s.batch, m: m, n: n, k: k,
		a: shapes[i], b: shapes[j], c: c, dt: s.dt,
	}, [2]int{i, j}}
}

// gradA is the product that gives the gradient with respect to a: da =
// dc·op(b)ᵀ, or its transpose op(b)·dcᵀ when a is stored transposed.
func (s gemmShape) gradA() gemmGrad {
	if s.transA {
		return s.backward(1, 2, s.transB, true, s.k, s.m, s.n, s.a)
	}
	return s.backward(2, 1, false, !s.transB, s.m, s.k, s.n, s.a)
}

// gradB is the product that gives the gradient with respect to b: db =
// op(a)ᵀ·dc, or its transpose dcᵀ·op(a) when b is stored transposed.
func (s gemmShape) gradB() gemmGrad {
	if s.transB {
		return s.backward(2, 0, true, s.transA, s.n, s.k, s.m, s.b)
	}
	return s.backward(0, 2, !s.transA, false, s.k, s.n, s.m, s.b)
}

// biasRows is the bias as a row spread over every row of c.
func (s gemmShape) biasRows() rowsShape {
	return rowsShape{op: s.op + " backward", rows: s.batch * s.m, cols: s.n, full: s.c, dt: s.dt}
}

// gemmForward is the CPU twin of gemmOp: c = op(a)·op(b), on top of the
// bias rows when there is a bias.
func gemmForward[T kernels.Float](s gemmShape, in [][]T, c []T) error {
	p := s.params()
	if s.bias {
		kernels.BroadcastRows(s.batch*s.m, s.n, in[2], c)
		p.Beta = 1
	}
	return kernels.Gemm(p, in[0], in[1], c)
}

// rowsShape is a tensor of shape full seen as rows x cols, and a vector of
// cols: a bias and the output it is added to every row of.
type rowsShape struct {
	op         string
	rows, cols int
	full       tensor.Shape
	dt         tensor.Dtype
}

func (s rowsShape) String() string {
	return fmt.Sprintf("rows=%d,cols=%d,full=%v,%v", s.rows, s.cols, s.full, s.dt)
}

// sumRowsOp is the gradient of a bias: [rows x cols] -> [cols], the sum of
// the rows. Its gradient is broadcastRowsOp, its adjoint.
func sumRowsOp(s rowsShape) *specOp {
	return newOp(&opSpec{
		name: s.op, config: "sum of rows," + s.String(),
		inputs: []argSpec{{name: "grad", shape: s.full}}, out: tensor.Shape{s.cols}, dtype: s.dt,
		cpu:     floatTwin(s, sumRows[float32], sumRows[float64]),
		device:  s.sumShape().device,
		diffWRT: []bool{true},
		grad: func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			d, err := G.ApplyOp(broadcastRowsOp(s), grad)
			if err != nil {
				return nil, fmt.Errorf("ops: %s: %w", s.op, err)
			}
			return G.Nodes{d}, nil
		},
	})
}

// broadcastRowsOp spreads a vector over every row: [cols] -> [rows x
// cols]. Its gradient is sumRowsOp.
func broadcastRowsOp(s rowsShape) *specOp {
	return newOp(&opSpec{
		name: s.op, config: "rows of," + s.String(),
		inputs: []argSpec{{name: "grad", shape: tensor.Shape{s.cols}}}, out: s.full, dtype: s.dt,
		cpu:     floatTwin(s, broadcastRows[float32], broadcastRows[float64]),
		device:  s.broadcastDevice,
		diffWRT: []bool{true},
		grad: func(_ G.Nodes, _, grad *G.Node) (G.Nodes, error) {
			d, err := G.ApplyOp(sumRowsOp(s), grad)
			if err != nil {
				return nil, fmt.Errorf("ops: %s: %w", s.op, err)
			}
			return G.Nodes{d}, nil
		},
	})
}

func sumRows[T kernels.Float](s rowsShape, in [][]T, out []T) error {
	kernels.SumRows(s.rows, s.cols, in[0], out)
	return nil
}

func broadcastRows[T kernels.Float](s rowsShape, in [][]T, out []T) error {
	kernels.BroadcastRows(s.rows, s.cols, in[0], out)
	return nil
}
