package backend

import (
	"fmt"
	"reflect"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"gorgonia.org/tensor"
)

// TestAdder checks Engine.Add and AddScalar on the device against the
// standard engine on the host, for every option gorgonia passes, through
// tensor's API as gorgonia calls it.
func TestAdder(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		for _, dt := range []tensor.Dtype{tensor.Float32, tensor.Float64} {
			shape := []int{3, 7}
			ha, hb, hr := hostTensor(dt, shape, 1), hostTensor(dt, shape, 2), hostTensor(dt, shape, 3)
			type operands struct{ a, b, r *tensor.Dense }
			for _, c := range []struct {
				name string
				opts func(o operands) []tensor.FuncOpt
				// returns reports which operand the result must be: "a",
				// "r" or "" for a new tensor.
				returns string
				scalar  any // for AddScalar: nil means Add
			}{
				{"safe", func(operands) []tensor.FuncOpt { return nil }, "", nil},
				{"unsafe", func(operands) []tensor.FuncOpt { return []tensor.FuncOpt{tensor.UseUnsafe()} }, "a", nil},
				{"reuse", func(o operands) []tensor.FuncOpt { return []tensor.FuncOpt{tensor.WithReuse(o.r)} }, "r", nil},
				{"incr", func(o operands) []tensor.FuncOpt { return []tensor.FuncOpt{tensor.WithIncr(o.r)} }, "r", nil},
				{"scalar", func(operands) []tensor.FuncOpt { return nil }, "", "go"},
				{"scalar/unsafe", func(operands) []tensor.FuncOpt { return []tensor.FuncOpt{tensor.UseUnsafe()} }, "a", "go"},
				{"scalar/incr", func(o operands) []tensor.FuncOpt { return []tensor.FuncOpt{tensor.WithIncr(o.r)} }, "r", "go"},
				{"scalar tensor/host", func(operands) []tensor.FuncOpt { return nil }, "", "host"},
				{"scalar tensor/device", func(operands) []tensor.FuncOpt { return nil }, "", "device"},
			} {
				t.Run(fmt.Sprintf("%v/%s", dt, c.name), func(t *testing.T) {
					// The reference: the same call on host copies, standard engine.
					ref := operands{ha.Clone().(*tensor.Dense), hb.Clone().(*tensor.Dense), hr.Clone().(*tensor.Dense)}
					dev := operands{toDevice(t, d, ha), toDevice(t, d, hb), toDevice(t, d, hr)}
					var want, got tensor.Tensor
					var err error
					if c.scalar == nil {
						want, err = tensor.Add(ref.a, ref.b, c.opts(ref)...)
						if err != nil {
							t.Fatal(err)
						}
						got, err = tensor.Add(dev.a, dev.b, c.opts(dev)...)
					} else {
						s := scalarFor(dt, 2.5)
						want, err = tensor.Add(ref.a, s, c.opts(ref)...)
						if err != nil {
							t.Fatal(err)
						}
						var ds any = s
						switch c.scalar {
						case "host":
							ds = tensor.New(tensor.FromScalar(s))
						case "device":
							ds = toDevice(t, d, tensor.New(tensor.FromScalar(s)))
						}
						if c.scalar == "go" {
							got, err = tensor.Add(dev.a, ds, c.opts(dev)...)
						} else {
							got, err = tensor.Add(dev.a, ds.(tensor.Tensor), c.opts(dev)...)
						}
					}
					if err != nil {
						t.Fatal(err)
					}
					gd, ok := got.(*tensor.Dense)
					if !ok || !d.Owns(gd) {
						t.Fatalf("result %T is not a tensor of the device", got)
					}
					switch c.returns {
					case "a":
						if gd != dev.a {
							t.Error("result is not a")
						}
					case "r":
						if gd != dev.r {
							t.Error("result is not the reuse tensor")
						}
					default:
						if gd == dev.a || gd == dev.b || gd == dev.r {
							t.Error("result aliases an operand")
						}
					}
					if msg := sameValues(toHost(t, d, gd), want.(*tensor.Dense)); msg != "" {
						t.Error(msg)
					}
					// The operands that must not change did not.
					if c.returns != "a" {
						if msg := sameValues(toHost(t, d, dev.a), ha); msg != "" {
							t.Errorf("a changed: %s", msg)
						}
					}
				})
			}
		}
	})
}

func scalarFor(dt tensor.Dtype, v float64) any {
	if dt == tensor.Float32 {
		return float32(v)
	}
	return v
}

// TestAdderDelegatesAndRefuses: host operands go to the standard engine
// (also when the host tensors carry the device's engine, as a TapeMachine
// built with it gives them); mixed or unsupported operands are errors.
func TestAdderDelegatesAndRefuses(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		e := d.Engine()
		ha, hb := hostTensor(tensor.Float64, []int{4}, 1), hostTensor(tensor.Float64, []int{4}, 2)
		want, err := tensor.Add(ha, hb)
		if err != nil {
			t.Fatal(err)
		}
		tensor.WithEngine(e)(ha)
		tensor.WithEngine(e)(hb)
		got, err := tensor.Add(ha, hb)
		if err != nil {
			t.Fatal(err)
		}
		if IsDevice(got) || sameValues(got.(*tensor.Dense), want.(*tensor.Dense)) != "" {
			t.Errorf("host add with the device engine: %v, want %v on the host", got, want)
		}
		// Other arithmetic on host values still works through StandardEngine.
		if _, err := tensor.Mul(ha, hb); err != nil {
			t.Errorf("host Mul with the device engine: %v", err)
		}
		if _, err := tensor.Sum(ha); err != nil {
			t.Errorf("host Sum with the device engine: %v", err)
		}

		xa := toDevice(t, d, ha)
		xi := toDevice(t, d, hostTensor(tensor.Int32, []int{4}, 1))
		x3 := toDevice(t, d, hostTensor(tensor.Float64, []int{2, 2}, 1))
		for _, c := range []struct {
			name string
			f    func() error
			want string
		}{
			{"device + host", func() error { _, err := e.Add(xa, hb); return err }, "a on the device but b on the host"},
			{"host + device", func() error { _, err := e.Add(hb, xa); return err }, "b on the device but a on the host"},
			{"host reuse", func() error { _, err := e.Add(xa, xa, tensor.WithReuse(hb)); return err }, "reuse on the host"},
			{"int32", func() error { _, err := e.Add(xi, xi); return err }, "float32 or float64"},
			{"shapes", func() error { _, err := e.Add(xa, x3); return err }, "a is float64 (4)"},
			{"scalar dtype", func() error { _, err := e.AddScalar(xa, float32(1), true); return err }, "float32"},
			// Through tensor's API, other arithmetic on device values is refused, not run on the host.
			{"Mul", func() error { _, err := tensor.Mul(xa, xa); return err }, "Mul: a float64 (4) operand is a device tensor"},
			{"Sum", func() error { _, err := tensor.Sum(xa); return err }, "Sum: a float64 (4) operand is a device tensor"},
			{"Div by a device scalar", func() error {
				_, err := tensor.Div(hb, toDevice(t, d, tensor.New(tensor.FromScalar(2.0))))
				return err
			}, "DivScalar: a float64 () operand is a device tensor"},
			{"SoftMax", func() error { _, err := tensor.SoftMax(xa, 0); return err }, "device tensor"},
			{"Concat", func() error { _, err := tensor.Concat(0, hb, xa); return err }, "device tensor"},
			{"host Mul into a device reuse", func() error { _, err := tensor.Mul(hb, hb, tensor.WithReuse(xa)); return err }, "device tensor"},
			{"Dense.Memset", func() error { return xa.Memset(1.0) }, "inaccessible"},
		} {
			if err := c.f(); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
			}
		}
	})
}

// TestDeviceOf: the dispatch query of the ops package.
func TestDeviceOf(t *testing.T) {
	forEachDevice(t, func(t *testing.T, d *Device) {
		h := hostTensor(tensor.Float32, []int{2, 2}, 0)
		x := toDevice(t, d, h)
		for _, c := range []struct {
			name     string
			v        any
			isDevice bool
			dev      *Device
			err      bool
		}{
			{"host", h, false, nil, false},
			{"device", x, true, d, false},
			{"not a tensor", 3.0, false, nil, false},
			{"nil", (*tensor.Dense)(nil), false, nil, false},
		} {
			dev, err := DeviceOf(c.v)
			if IsDevice(c.v) != c.isDevice || dev != c.dev || (err != nil) != c.err {
				t.Errorf("%s: IsDevice %v, DeviceOf %v, %v", c.name, IsDevice(c.v), dev, err)
			}
		}
		// A device tensor whose engine a plain TapeMachine replaced: still
		// device (so ops do not read it on the host), but unattributable.
		y := toDevice(t, d, h)
		tensor.WithEngine(tensor.StdEng{})(y)
		if dev, err := DeviceOf(y); !IsDevice(y) || dev != nil || err == nil || !strings.Contains(err.Error(), "G.WithEngine") {
			t.Errorf("device tensor with StdEng: IsDevice %v, DeviceOf %v, %v", IsDevice(y), dev, err)
		}
		if p, err := d.Ptr(x); err != nil || uint64(p) != rawAddr(x.Raw) {
			t.Errorf("Ptr = %#x, %v", p, err)
		}
		if _, err := d.Ptr(h); err == nil {
			t.Error("Ptr of a host tensor succeeded")
		}
	})
}

// TestDenseMethodsOnDevice pins down what tensor.Dense does with device
// memory (the list in dense.go). The fake's device memory faults on any
// host access, and SetPanicOnFault turns that fault into a panic this test
// reports instead of a crash.
func TestDenseMethodsOnDevice(t *testing.T) {
	d := openFake(t)
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	h := hostTensor(tensor.Float32, []int{2, 3}, 1)
	x := toDevice(t, d, h)
	run := func(name string, f func() error) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("panicked: %v", r)
			}
		}()
		return f()
	}
	for _, c := range []struct {
		name string
		f    func() error
		ok   bool // true: must succeed; false: must return an error (not crash)
	}{
		{"String", func() error { _ = x.String(); return nil }, true},
		{"Format %v", func() error { _ = fmt.Sprintf("%v %+v %s", x, x, x); return nil }, true},
		{"Shape etc", func() error { _ = x.Shape(); _ = x.Strides(); _ = x.Size(); _ = x.Uintptr(); return nil }, true},
		{"Reshape", func() error { return x.Reshape(3, 2) }, true},
		{"T", func() error { return x.T() }, true},
		{"Transpose", func() error { return x.Transpose() }, false},
		{"Apply", func() error {
			_, err := x.Apply(func(v float32) float32 { return v })
			return err
		}, false},
		{"Dense.Add", func() error { _, err := x.Add(x); return err }, true}, // Engine.Add on the device
		{"Dense.Mul", func() error { _, err := x.Mul(x); return err }, false},
		{"Dense.Sum", func() error { _, err := x.Sum(); return err }, false},
		{"Dense.Memset", func() error { return x.Memset(float32(1)) }, false},
	} {
		err := run(c.name, c.f)
		if c.ok && err != nil || !c.ok && (err == nil || strings.Contains(err.Error(), "panicked")) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	// Clone gives host memory that tensor still marks inaccessible:
	// DeviceOf reports it rather than letting CPU code read it.
	y := toDevice(t, d, h)
	var c *tensor.Dense
	if err := run("Clone", func() error { c = y.Clone().(*tensor.Dense); return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := DeviceOf(c); !IsDevice(c) || err == nil {
		t.Errorf("Clone of a device tensor: IsDevice %v, DeviceOf error %v", IsDevice(c), err)
	}
	// Materialize of a view: whole rows are copied to the host; a column
	// comes back as host zeros, tensor dropping the copy's error.
	rows, _ := y.Slice(tensor.S(1, 2))
	var mr *tensor.Dense
	if err := run("Materialize rows", func() error { mr = rows.Materialize().(*tensor.Dense); return nil }); err != nil {
		t.Fatal(err)
	}
	if IsDevice(mr) || fmt.Sprint(mr.Float32s()) != fmt.Sprint(h.Float32s()[3:]) {
		t.Errorf("Materialize of device rows: IsDevice %v, %v", IsDevice(mr), mr.Float32s())
	}
	col, _ := y.Slice(nil, tensor.S(1))
	var mc *tensor.Dense
	if err := run("Materialize column", func() error { mc = col.Materialize().(*tensor.Dense); return nil }); err != nil {
		t.Fatal(err)
	}
	if IsDevice(mc) || fmt.Sprint(mc.Float32s()) != "[0 0]" {
		t.Errorf("Materialize of a device column: IsDevice %v, %v", IsDevice(mc), mc.Float32s())
	}
	// CopyTo runs on the source's engine: into a device tensor it works
	// from a host tensor that has the Device's engine, and writes device
	// memory from the host (here: faults) from one that has tensor's own.
	hd := h.Clone().(*tensor.Dense)
	tensor.WithEngine(d.Engine())(hd)
	if err := run("CopyTo from the Device's engine", func() error { return hd.CopyTo(y) }); err != nil {
		t.Errorf("CopyTo into a device tensor from a host tensor with the Device's engine: %v", err)
	}
	if err := run("CopyTo from StdEng", func() error { return h.CopyTo(y) }); err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Errorf("CopyTo into a device tensor from a host tensor with StdEng: %v, want a fault", err)
	}
	// And the data reads crash (here: panic) - the reason ops must dispatch.
	if err := run("Data", func() error { _ = fmt.Sprint(y.Float32s()[0]); return nil }); err == nil {
		t.Error("reading device memory on the host did not fault")
	}
}

// TestEveryInheritedMethodGuarded: every method of Engine that takes a
// tensor is written in this package (by hand or by gen_guards.go), none is
// StandardEngine's promoted as is. A new tensor or gorgonia version that
// adds one fails here until `go generate ./backend` runs.
func TestEveryInheritedMethodGuarded(t *testing.T) {
	tensorT, denseT := reflect.TypeFor[tensor.Tensor](), reflect.TypeFor[tensor.DenseTensor]()
	et := reflect.TypeFor[*Engine]()
	checked := 0
	for i := range et.NumMethod() {
		m := et.Method(i)
		takesTensor := false
		for j := 1; j < m.Type.NumIn(); j++ {
			p := m.Type.In(j)
			if p.Kind() == reflect.Slice {
				p = p.Elem()
			}
			takesTensor = takesTensor || p == tensorT || p == denseT
		}
		if !takesTensor {
			continue
		}
		checked++
		f := runtime.FuncForPC(m.Func.Pointer())
		if file, _ := f.FileLine(f.Entry()); !strings.Contains(file, "/backend/") {
			t.Errorf("Engine.%s is StandardEngine's, unguarded (%s): run go generate ./backend", m.Name, file)
		}
	}
	if checked < 70 {
		t.Errorf("only %d methods take tensors; the check is not looking", checked)
	}
}
