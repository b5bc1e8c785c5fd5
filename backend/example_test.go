package backend_test

import (
	"fmt"
	"log"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
)

// Values on the GPU in a Gorgonia graph: y = x + x, run by a TapeMachine
// built with the Device's engine, read back with ToHost. (Not run by go
// test: it needs a GPU and the stheno_cuda build.)
func Example() {
	dev, err := backend.Open(0)
	if err != nil {
		log.Fatal(err) // wraps backend.ErrNoDevice without a GPU
	}
	defer dev.Close()

	g := G.NewGraph()
	x := G.NewTensor(g, tensor.Float32, 2, G.WithShape(2, 2), G.WithName("x"))
	y := G.Must(G.Add(x, x))
	m := G.NewTapeMachine(g, G.WithEngine(dev.Engine()))
	defer m.Close()

	xd, err := dev.ToDevice(tensor.New(tensor.WithShape(2, 2), tensor.WithBacking([]float32{1, 2, 3, 4})))
	if err != nil {
		log.Fatal(err)
	}
	if err := G.Let(x, xd); err != nil {
		log.Fatal(err)
	}
	if err := m.RunAll(); err != nil {
		log.Fatal(err)
	}
	yh, err := dev.ToHost(y.Value().(*tensor.Dense))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(yh.Float32s()) // [2 4 6 8]
}

// A kernel launch from an op: one params struct, mirrored from the .cu
// file, passed by value.
func ExampleLaunch() {
	dev, err := backend.Open(0)
	if err != nil {
		log.Fatal(err)
	}
	defer dev.Close()
	x, err := dev.NewDense(tensor.Float64, 1000)
	if err != nil {
		log.Fatal(err)
	}
	ptr, err := dev.Ptr(x)
	if err != nil {
		log.Fatal(err)
	}
	// struct FillParams { uint64_t* out; int64_t n; uint64_t value; };
	type fillParams struct {
		Out   backend.DevicePtr
		N     int64
		Value uint64
	}
	k, err := dev.Kernel("elementwise", "fill_u64")
	if err != nil {
		log.Fatal(err) // names the GPU, module and kernel, and the driver's message
	}
	if err := backend.Launch(k, dev.GridStride(1000, 256), fillParams{Out: ptr, N: 1000, Value: 0x3ff0000000000000}); err != nil {
		log.Fatal(err)
	}
	xh, err := dev.ToHost(x) // waits for the kernel
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(xh.Float64s()[999]) // 1
}
