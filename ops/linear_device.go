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
// when there is a bias. There is no kernel for a broadcast row add yet, so
// the bias is spread over the rows by a GEMM too (ones·b, broadcast),
// and the product is added onto it with Beta 1: c = op(a)·op(b) + bias, the
// CPU twin's order of operations.
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
	if err := runGemm(s.op, a.dev, p, a.ptr[0], a.ptr[1], c, s.dt, false); err != nil {
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

// fitsGemm checks the sizes cuBLAS takes as 32-bit ints (its batch strides
// are 64 bits).
func fitsGemm(op string, p kernels.GemmParams) error {
	return fitsInt32(op, map[string]int{
		"M": p.M, "N": p.N, "K": p.K, "LDA": p.LDA, "LDB": p.LDB, "LDC": p.LDC, "batch": p.Batch,
	})
}

// runGemm queues p on dev; exact asks for full float32 math whatever the
// Device's GemmMath (the broadcasts and sums of rowsShape).
func runGemm(op string, dev *backend.Device, p kernels.GemmParams, a, b, c backend.DevicePtr, dt tensor.Dtype, exact bool) error {
	if err := fitsGemm(op, p); err != nil {
		return err
	}
	g := deviceGemm(p, a, b, c, dt)
	g.Exact = exact
	if err := dev.Gemm(g); err != nil {
		return fmt.Errorf("ops: %s: %w", op, err)
	}
	return nil
}

// sumDevice runs sumRowsOp on a device: the bias gradient, a GEMM of dy
// with a ones vector (sumParams).
func (s rowsShape) sumDevice(a *deviceArgs) (*tensor.Dense, error) {
	out, db, err := a.output()
	if err != nil {
		return nil, err
	}
	ones, free, err := onesDevice(s.op, a.dev, s.dt, s.rows)
	if err != nil {
		return nil, err
	}
	defer free()
	if err := runGemm(s.op, a.dev, s.sumParams(), ones, a.ptr[0], db, s.dt, true); err != nil {
		return nil, err
	}
	return out, nil
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

// broadcast queues c = v in every row, a GEMM of depth 1 with a ones
// vector (broadcastParams). In exact float32 math each element is 1·v[j],
// exactly v[j]; TF32 math would round v to TF32's 10 bits of mantissa
// first (and dy likewise in sumDevice), so these GEMMs ask for exact
// float32 (backend.Gemm.Exact).
func (s rowsShape) broadcast(dev *backend.Device, v, c backend.DevicePtr) error {
	ones, free, err := onesDevice(s.op, dev, s.dt, s.rows)
	if err != nil {
		return err
	}
	defer free()
	return runGemm(s.op, dev, s.broadcastParams(), ones, v, c, s.dt, true)
}

// onesDevice returns n ones of dtype dt in scratch memory on dev, and a func
// that frees them; freeing right after the launches that read them are
// queued is safe (backend.Device.Free).
func onesDevice(op string, dev *backend.Device, dt tensor.Dtype, n int) (backend.DevicePtr, func(), error) {
	size := int64(n) * int64(dt.Size())
	p, err := dev.Alloc(size)
	if err != nil {
		return 0, nil, fmt.Errorf("ops: %s: ones: %w", op, err)
	}
	var one any = float32(1)
	if dt == tensor.Float64 {
		one = float64(1)
	}
	if err := dev.Engine().Memset(backend.Memory{Ptr: p, Size: size}, one); err != nil {
		dev.Free(p)
		return 0, nil, fmt.Errorf("ops: %s: ones: %w", op, err)
	}
	return p, func() { dev.Free(p) }, nil
}
