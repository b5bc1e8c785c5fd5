// The device side of Linear, MatMul and BatchedMatMul: cuBLAS through
// backend.Gemm.

package ops

import (
	"fmt"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
)

// device runs gemmOp on a device: one batched GEMM, after the bias rows
// when there is a bias: the bias is copied into every row of c
// (rowsShape.broadcast), and the product is added onto it with Beta 1: c =
// op(a)·op(b) + bias, the CPU twin's order of operations.
func (s gemmShape) device(a *deviceArgs) (*tensor.Dense, error) {
	out, c, err := a.output()
	if err != nil {
		return nil, err
	}
	p := s.params()
	if s.bias {
		if err := s.biasRows().broadcast(a.dev, a.ptr[2], c); err != nil {
			return nil, err
		}
		p.Beta = 1
	}
	if err := runGemm(s.op, a.dev, p, a.ptr[0], a.ptr[1], c, s.dt); err != nil {
		return nil, err
	}
	return out, nil
}

// deviceGemm is p as backend.Gemm takes it, on the operands a, b and c of
// dtype dt. p gives every stride (gemmShape.params, rowsShape.sumParams,
// rowsShape.broadcastParams), so nothing depends on how the backend reads
// zeros there.
func deviceGemm(p kernels.GemmParams, a, b, c backend.DevicePtr, dt tensor.Dtype) backend.Gemm {
	return backend.Gemm{
		TransA: p.TransA, TransB: p.TransB, M: p.M, N: p.N, K: p.K,
		A: a, B: b, C: c, LDA: p.LDA, LDB: p.LDB, LDC: p.LDC,
		Batch:   p.Batch,
		StrideA: int64(p.StrideA), StrideB: int64(p.StrideB), StrideC: int64(p.StrideC),
		Alpha: p.Alpha, Beta: p.Beta, Dtype: dt,
	}
}

// runGemm queues p on dev. backend.Gemm checks the sizes cuBLAS takes as
// 32-bit ints, naming the one that does not fit.
func runGemm(op string, dev *backend.Device, p kernels.GemmParams, a, b, c backend.DevicePtr, dt tensor.Dtype) error {
	if err := dev.Gemm(deviceGemm(p, a, b, c, dt)); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// sumShape is the sum of the rows of [rows, cols] as Sum computes it:
// sumRowsOp's device launcher, the bias gradient, by Sum's kernels
// (pointwise.cu) in Sum's fixed order.
func (s rowsShape) sumShape() reduceShape {
	return newReduceShape(s.op, tensor.Shape{s.rows, s.cols}, []bool{true, false}, tensor.Shape{s.cols}, 1, s.dt)
}

// broadcastDevice runs broadcastRowsOp on a device.
func (s rowsShape) broadcastDevice(a *deviceArgs) (*tensor.Dense, error) {
	out, c, err := a.output()
	if err != nil {
		return nil, err
	}
	if err := s.broadcast(a.dev, a.ptr[0], c); err != nil {
		return nil, err
	}
	return out, nil
}

// broadcast queues c = v in every row: pointwise.cu's kernels scaling v
// by 1, which is exact, read with a stride of 0 over the rows.
func (s rowsShape) broadcast(dev *backend.Device, v, c backend.DevicePtr) error {
	ps, err := s.broadcastShape()
	if err != nil {
		return err
	}
	if ps.same {
		return launchMap(ps.name, dev, s.dt, ps.op, ps.alpha, v, 0, c, s.rows*s.cols)
	}
	return ps.launchBroadcast(dev, v, 0, c)
}

// broadcastShape is v [cols] spread over [rows, cols] as a pointwise op.
func (s rowsShape) broadcastShape() (pointwiseShape, error) {
	return newPointwiseShape(pointwiseShape{
		name: s.op, op: kernels.PointwiseScale, argA: "bias", alpha: 1, dt: s.dt,
		a: tensor.Shape{s.cols}, aView: tensor.Shape{1, s.cols}, out: tensor.Shape{s.rows, s.cols},
	})
}
