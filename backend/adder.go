package backend

import (
	"fmt"
	"reflect"
	"strings"

	"gorgonia.org/tensor"
)

// Add is tensor.Adder's a + b; gorgonia's Add op and its gradient
// accumulation come here. With a and b on the host it is StandardEngine's
// Add. On the device, a and b must be contiguous float32 or float64 tensors
// of one shape, and the options gorgonia passes are honoured:
// tensor.UseUnsafe() adds into a and returns it, tensor.WithReuse(r) writes
// into r, tensor.WithIncr(r) adds a + b to r; otherwise the result is a new
// device tensor. The kernel is queued on the stream.
func (e *Engine) Add(a, b tensor.Tensor, opts ...tensor.FuncOpt) (tensor.Tensor, error) {
	d := e.dev
	fo := tensor.ParseFuncOpts(opts...)
	reuse, incr := fo.IncrReuse()
	safe := fo.Safe()
	onDevice, err := d.onDevice("Add", map[string]tensor.Tensor{"a": a, "b": b, "reuse": reuse})
	if err != nil {
		return nil, err
	}
	if !onDevice {
		return e.StandardEngine.Add(a, b, opts...)
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.exit()
	ao, err := d.operand("Add", "a", a)
	if err != nil {
		return nil, err
	}
	bo, err := d.operand("Add", "b", b)
	if err != nil {
		return nil, err
	}
	if a.Dtype() != b.Dtype() || !a.Shape().Eq(b.Shape()) {
		return nil, d.errorf("Add: a is %v %v, b is %v %v", a.Dtype(), a.Shape(), b.Dtype(), b.Shape())
	}
	out, fresh, err := d.result("Add", a, ao.n, reuse, safe)
	if err != nil {
		return nil, err
	}
	p := addParams{Out: out.ptr, A: ao.ptr, B: bo.ptr, N: ao.n, BStride: 1}
	if err := d.add(a.Dtype(), incr, p); err != nil {
		if fresh != nil {
			d.freeDense(fresh)
		}
		return nil, err
	}
	return out.t, nil
}

// AddScalar is tensor.Adder's a + b for a scalar b: a Go float32/float64 of
// a's dtype, a one-element host tensor (read on the host, passed to the
// kernel by value), or a one-element tensor of the Device (read by the
// kernel). Options and placement rules are Add's; a host scalar does not
// count as a host operand.
func (e *Engine) AddScalar(a tensor.Tensor, b interface{}, leftTensor bool, opts ...tensor.FuncOpt) (tensor.Tensor, error) {
	d := e.dev
	fo := tensor.ParseFuncOpts(opts...)
	reuse, incr := fo.IncrReuse()
	safe := fo.Safe()
	operands := map[string]tensor.Tensor{"a": a, "reuse": reuse}
	bt, bIsTensor := b.(tensor.Tensor)
	if bIsTensor && IsDevice(bt) {
		operands["b"] = bt
	}
	onDevice, err := d.onDevice("AddScalar", operands)
	if err != nil {
		return nil, err
	}
	if !onDevice {
		return e.StandardEngine.AddScalar(a, b, leftTensor, opts...)
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.exit()
	ao, err := d.operand("AddScalar", "a", a)
	if err != nil {
		return nil, err
	}
	dt := a.Dtype()
	p := addParams{A: ao.ptr, N: ao.n}
	switch {
	case bIsTensor && IsDevice(bt):
		bo, err := d.operand("AddScalar", "b", bt)
		if err != nil {
			return nil, err
		}
		if bt.Dtype() != dt || bo.n != 1 {
			return nil, d.errorf("AddScalar: b is %v %v, want one %v", bt.Dtype(), bt.Shape(), dt)
		}
		p.B, p.BStride = bo.ptr, 0
	case bIsTensor:
		v, err := hostScalar(bt, dt)
		if err != nil {
			return nil, d.errorf("AddScalar: b: %w", err)
		}
		p.Scalar = v
	default:
		v, err := goScalar(b, dt)
		if err != nil {
			return nil, d.errorf("AddScalar: b: %w", err)
		}
		p.Scalar = v
	}
	out, fresh, err := d.result("AddScalar", a, ao.n, reuse, safe)
	if err != nil {
		return nil, err
	}
	p.Out = out.ptr
	if err := d.add(dt, incr, p); err != nil {
		if fresh != nil {
			d.freeDense(fresh)
		}
		return nil, err
	}
	return out.t, nil
}

// resultOperand is where an Add writes.
type resultOperand struct {
	t   tensor.Tensor
	ptr DevicePtr
}

// result picks the tensor an Add writes to: reuse when given (reshaped to
// a's shape if it has a's n elements, as StandardEngine does), a itself for
// an unsafe add, otherwise a new device tensor, which is also returned as
// fresh so that a failed launch can free it.
func (d *Device) result(op string, a tensor.Tensor, n int64, reuse tensor.Tensor, safe bool) (out resultOperand, fresh *tensor.Dense, err error) {
	switch {
	case !isNil(reuse):
		ro, err := d.operand(op, "reuse", reuse)
		if err != nil {
			return out, nil, err
		}
		if reuse.Dtype() != a.Dtype() || ro.n != n {
			return out, nil, d.errorf("%s: reuse is %v %v, want %v %v", op, reuse.Dtype(), reuse.Shape(), a.Dtype(), a.Shape())
		}
		if !reuse.Shape().Eq(a.Shape()) {
			if err := reuse.Reshape(a.Shape().Clone()...); err != nil {
				return out, nil, d.errorf("%s: reshaping reuse: %w", op, err)
			}
		}
		return resultOperand{reuse, ro.ptr}, nil, nil
	case !safe:
		ao, err := d.operand(op, "a", a)
		return resultOperand{a, ao.ptr}, nil, err
	}
	t, err := d.newDense(a.Dtype(), a.Shape().Clone())
	if err != nil {
		return out, nil, err
	}
	return resultOperand{t, DevicePtr(rawAddr(t.Raw))}, t, nil
}

// onDevice tells whether the named operands (nil ones skipped) are all on
// d or all on the host; a mix is an error, never a silent copy.
func (d *Device) onDevice(op string, operands map[string]tensor.Tensor) (bool, error) {
	var dev, host []string
	for _, name := range []string{"a", "b", "reuse"} {
		t, ok := operands[name]
		if !ok || isNil(t) {
			continue
		}
		on, err := d.where(t)
		if err != nil {
			return false, fmt.Errorf("%s: %s: %w", op, name, err)
		}
		if on {
			dev = append(dev, name)
		} else {
			host = append(host, name)
		}
	}
	if len(dev) > 0 && len(host) > 0 {
		return false, d.errorf("%s: %s on the device but %s on the host; move them with ToDevice or ToHost first",
			op, strings.Join(dev, ", "), strings.Join(host, ", "))
	}
	return len(dev) > 0, nil
}

// hostScalar reads the one element of host tensor t as a float64; its
// dtype must be dt.
func hostScalar(t tensor.Tensor, dt tensor.Dtype) (float64, error) {
	if t.Dtype() != dt || t.Shape().TotalSize() > 1 {
		return 0, fmt.Errorf("%v %v is not one %v", t.Dtype(), t.Shape(), dt)
	}
	v := reflect.ValueOf(HostData(t))
	if v.Kind() == reflect.Slice {
		if v.Len() != 1 {
			return 0, fmt.Errorf("%v %v holds %d values, want 1", t.Dtype(), t.Shape(), v.Len())
		}
		v = v.Index(0)
	}
	return goScalar(v.Interface(), dt)
}

// goScalar widens a float32 or float64 of dtype dt to float64; widening a
// float32 is exact, so the kernel gets the very value back.
func goScalar(v any, dt tensor.Dtype) (float64, error) {
	switch x := v.(type) {
	case float32:
		if dt == tensor.Float32 {
			return float64(x), nil
		}
	case float64:
		if dt == tensor.Float64 {
			return x, nil
		}
	}
	return 0, fmt.Errorf("%v of type %T for a tensor of %v", v, v, dt)
}
