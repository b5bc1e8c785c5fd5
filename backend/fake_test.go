package backend

import (
	"fmt"
	"sort"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"gorgonia.org/tensor"
)

// fakeDriver runs the package on a machine without a GPU. Its "device
// memory" is address space reserved with PROT_NONE: tensors built on it
// point there, so host code that reads or writes a device tensor faults
// exactly as it would on a GPU, while the fake keeps the bytes in ordinary
// Go slices on the side. Its kernels are Go versions of elementwise.cu's,
// run at launch; a kernel that touches memory outside any block makes the
// fake fail like CUDA after a fault: the launch succeeds, the next call
// that waits for the stream reports CUDA_ERROR_ILLEGAL_ADDRESS, and every
// later call too.
type fakeDriver struct {
	inf deviceInfo

	mu      sync.Mutex
	region  []byte // the PROT_NONE reservation
	next    uint64 // next free address in region
	end     uint64
	blocks  map[uint64][]byte // base -> bytes
	bases   []uint64          // sorted
	sticky  error
	closed  bool
	modules int

	// cuBLAS: blasErr makes openBLAS fail (a machine without cuBLAS);
	// handles counts handles made and not yet closed; lastGemm is the
	// last call, as cuBLAS would have received it.
	blasErr  error
	handles  int
	lastGemm gemmCall

	// CUDA graphs: while capturing, stream calls are added to capturing
	// instead of running; captureErr makes beginCapture fail (a driver or
	// library that cannot capture); graphs counts graphs alive.
	capturing  *fakeGraph
	captureErr error
	graphs     int
}

// fakeGraph is a captured graph, or an instantiated one (an exec): its
// calls in order. A kernel call's node can have its arguments changed.
type fakeGraph struct {
	nodes []*fakeNode
	from  map[*fakeNode]*fakeNode // exec: the graph's node -> the exec's
}

type fakeNode struct {
	fn     any
	cfg    LaunchConfig
	params []byte
	run    func() error // the calls other than kernels
}

// captured adds a call to the graph being captured, if any: the kernel
// (fn, cfg, params) or run; f.mu is held.
func (f *fakeDriver) captured(n *fakeNode) bool {
	if f.capturing == nil {
		return false
	}
	f.capturing.nodes = append(f.capturing.nodes, n)
	return true
}

func (f *fakeDriver) beginCapture() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.usable("cuStreamBeginCapture"); err != nil {
		return err
	}
	if f.captureErr != nil {
		return f.captureErr
	}
	f.capturing = &fakeGraph{}
	return nil
}

func (f *fakeDriver) capturedNode() (any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.capturing == nil || len(f.capturing.nodes) == 0 {
		return nil, fakeError("cuStreamGetCaptureInfo", codeInvalidValue)
	}
	return f.capturing.nodes[len(f.capturing.nodes)-1], nil
}

func (f *fakeDriver) endCapture() (any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := f.capturing
	f.capturing = nil
	if g == nil {
		return nil, fakeError("cuStreamEndCapture", codeInvalidValue)
	}
	f.graphs++
	return g, nil
}

func (f *fakeDriver) instantiate(graph any) (any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := graph.(*fakeGraph)
	e := &fakeGraph{from: map[*fakeNode]*fakeNode{}}
	for _, n := range g.nodes {
		c := *n
		c.params = append([]byte(nil), n.params...)
		e.nodes = append(e.nodes, &c)
		e.from[n] = &c
	}
	return e, nil
}

func (f *fakeDriver) launchGraph(exec any) error {
	for _, n := range exec.(*fakeGraph).nodes {
		var err error
		if n.run != nil {
			err = n.run()
		} else {
			err = f.launch(n.fn, n.cfg, paramsPtr(n.params), uintptr(len(n.params)))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeDriver) setKernelParams(exec, node, fn any, cfg LaunchConfig, params unsafe.Pointer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := exec.(*fakeGraph).from[node.(*fakeNode)]
	if n == nil || n.fn != fn || n.run != nil {
		return fakeError("cuGraphExecKernelNodeSetParams", codeInvalidValue)
	}
	n.cfg = cfg
	copy(n.params, unsafe.Slice((*byte)(params), len(n.params)))
	return nil
}

func (f *fakeDriver) destroyGraph(graph, exec any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.graphs--
	return nil
}

// fakeGPU is the memory of the one fake GPU that all fake drivers (like
// all contexts of a process on one real GPU) share, so that MemInfo shows
// one Device's allocations to another.
var fakeGPU struct {
	sync.Mutex
	used, total uint64
}

func init() { fakeGPU.total = 1 << 30 }

const fakeRegion = 1 << 36 // address space only: PROT_NONE costs no memory

func newFakeDriver(tb testing.TB) *fakeDriver {
	region, err := syscall.Mmap(-1, 0, fakeRegion, syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		tb.Fatalf("reserving fake device memory: %v", err)
	}
	start := uint64(uintptr(unsafe.Pointer(&region[0])))
	return &fakeDriver{
		inf: deviceInfo{
			ordinal: 0, name: "fake GPU", major: 8, minor: 0, sms: 4, clockKHz: 1410000,
			totalMem: int64(fakeGPU.total), maxThreadsPerBlock: 1024,
			maxSharedPerBlock: 48 << 10, maxSharedOptIn: 227 << 10,
		},
		region: region,
		next:   start + 4096, // leave address 0 and the first page unused
		end:    start + fakeRegion,
		blocks: map[uint64][]byte{},
	}
}

func fakeError(call string, code int) *DriverError {
	names := map[int][2]string{
		codeInvalidValue:   {"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
		codeOutOfMemory:    {"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
		codeNotFound:       {"CUDA_ERROR_NOT_FOUND", "named symbol not found"},
		codeInvalidHandle:  {"CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
		codeIllegalAddress: {"CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
	}
	n := names[code]
	return &DriverError{Call: call, Code: code, Name: n[0], Desc: n[1]}
}

func (f *fakeDriver) info() deviceInfo { return f.inf }

// usable returns the sticky error, or an error once closed.
func (f *fakeDriver) usable(call string) error {
	if f.closed {
		return fakeError(call, codeInvalidHandle)
	}
	if f.sticky != nil {
		return f.sticky
	}
	return nil
}

func (f *fakeDriver) memAlloc(bytes uint64) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.usable("cuMemAlloc"); err != nil {
		return 0, err
	}
	fakeGPU.Lock()
	defer fakeGPU.Unlock()
	if bytes == 0 || fakeGPU.used+bytes > fakeGPU.total || f.next+bytes > f.end {
		return 0, fakeError("cuMemAlloc", codeOutOfMemory)
	}
	fakeGPU.used += bytes
	base := f.next
	f.next += (bytes + 4095) &^ 4095 // never reuse an address: stale pointers stay unmapped
	f.blocks[base] = make([]byte, bytes)
	f.bases = append(f.bases, base)
	return base, nil
}

func (f *fakeDriver) memFree(ptr uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.usable("cuMemFree"); err != nil {
		return err
	}
	b, ok := f.blocks[ptr]
	if !ok {
		return fakeError("cuMemFree", codeInvalidValue)
	}
	fakeGPU.Lock()
	fakeGPU.used -= uint64(len(b))
	fakeGPU.Unlock()
	delete(f.blocks, ptr)
	i := sort.Search(len(f.bases), func(i int) bool { return f.bases[i] >= ptr })
	f.bases = append(f.bases[:i], f.bases[i+1:]...)
	return nil
}

func (f *fakeDriver) memInfo() (free, total uint64, err error) {
	fakeGPU.Lock()
	defer fakeGPU.Unlock()
	return fakeGPU.total - fakeGPU.used, fakeGPU.total, nil
}

// resolve returns the n bytes at addr; f.mu is held.
func (f *fakeDriver) resolve(addr, n uint64) ([]byte, bool) {
	i := sort.Search(len(f.bases), func(i int) bool { return f.bases[i] > addr })
	if i == 0 {
		return nil, false
	}
	base := f.bases[i-1]
	b := f.blocks[base]
	off := addr - base
	if off+n > uint64(len(b)) {
		return nil, false
	}
	return b[off : off+n], true
}

func (f *fakeDriver) copyHtoD(dst uint64, src []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.usable("cuMemcpyHtoDAsync"); err != nil {
		return err
	}
	d, ok := f.resolve(dst, uint64(len(src)))
	if !ok {
		return fakeError("cuMemcpyHtoDAsync", codeInvalidValue)
	}
	copy(d, src)
	return nil
}

func (f *fakeDriver) copyDtoH(dst []byte, src uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.usable("cuStreamSynchronize"); err != nil {
		return err
	}
	s, ok := f.resolve(src, uint64(len(dst)))
	if !ok {
		return fakeError("cuMemcpyDtoHAsync", codeInvalidValue)
	}
	copy(dst, s)
	return nil
}

func (f *fakeDriver) copyDtoD(dst, src, bytes uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.captured(&fakeNode{run: func() error { return f.copyDtoD(dst, src, bytes) }}) {
		return nil
	}
	if err := f.usable("cuMemcpyDtoDAsync"); err != nil {
		return err
	}
	d, ok1 := f.resolve(dst, bytes)
	s, ok2 := f.resolve(src, bytes)
	if !ok1 || !ok2 {
		return fakeError("cuMemcpyDtoDAsync", codeInvalidValue)
	}
	copy(d, s)
	return nil
}

func (f *fakeDriver) memset(dst uint64, width int, value uint32, n uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.captured(&fakeNode{run: func() error { return f.memset(dst, width, value, n) }}) {
		return nil
	}
	call := fmt.Sprintf("cuMemsetD%dAsync", 8*width)
	if err := f.usable(call); err != nil {
		return err
	}
	d, ok := f.resolve(dst, n*uint64(width))
	if !ok || (width != 1 && width != 2 && width != 4) {
		return fakeError(call, codeInvalidValue)
	}
	for i := range d {
		d[i] = byte(value >> (8 * (i % width)))
	}
	return nil
}

func (f *fakeDriver) loadModule(name string, image []byte) (any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.usable("cuModuleLoadDataEx"); err != nil {
		return nil, err
	}
	f.modules++
	return name, nil
}

func (f *fakeDriver) unloadModule(mod any) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.modules--
	return nil
}

// fakeKernel runs a kernel on the fake's memory; false means it touched
// memory outside every block.
type fakeKernel func(f *fakeDriver, params unsafe.Pointer, size uintptr) bool

var fakeKernels = map[string]fakeKernel{
	"fill_u64":    fakeFill,
	"add_f32":     fakeAdd[float32](false),
	"add_f64":     fakeAdd[float64](false),
	"add_acc_f32": fakeAdd[float32](true),
	"add_acc_f64": fakeAdd[float64](true),
	"axpy_f32":    fakeAxpy[float32],
	"axpy_f64":    fakeAxpy[float64],
}

// fakeFunc is a loaded function: its kernel and its shared memory limit.
type fakeFunc struct {
	run       fakeKernel
	maxShared int
}

func (f *fakeDriver) function(mod any, name string) (any, error) {
	if k, ok := fakeKernels[name]; ok && mod == elementwiseModule {
		return &fakeFunc{run: k, maxShared: f.inf.maxSharedPerBlock}, nil
	}
	return nil, fakeError("cuModuleGetFunction", codeNotFound)
}

func (f *fakeDriver) setMaxDynamicShared(fn any, bytes int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if bytes > f.inf.maxSharedOptIn {
		return fakeError("cuFuncSetAttribute", codeInvalidValue)
	}
	fn.(*fakeFunc).maxShared = bytes
	return nil
}

func (f *fakeDriver) launch(fn any, cfg LaunchConfig, params unsafe.Pointer, size uintptr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.usable("cuLaunchKernel"); err != nil {
		return err
	}
	if f.captured(&fakeNode{fn: fn, cfg: cfg, params: append([]byte(nil), unsafe.Slice((*byte)(params), size)...)}) {
		return nil
	}
	ff := fn.(*fakeFunc)
	if int(cfg.SharedMem) > ff.maxShared {
		return fakeError("cuLaunchKernel", codeInvalidValue)
	}
	if !ff.run(f, params, size) {
		// Like a real fault: the launch was fine, the kernel was not.
		f.sticky = fakeError("cuStreamSynchronize", codeIllegalAddress)
	}
	return nil
}

// The fake GPU runs kernels when they are launched, so every event is
// reached at once and no time passes between two of them.
type fakeEvent struct{}

func (f *fakeDriver) eventRecord() (any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.usable("cuEventRecord"); err != nil {
		return nil, err
	}
	return &fakeEvent{}, nil
}

func (f *fakeDriver) eventElapsed(start, end any) (float32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return 0, f.usable("cuEventElapsedTime")
}

func (f *fakeDriver) eventDestroy(any) error { return nil }

func (f *fakeDriver) synchronize() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.usable("cuStreamSynchronize")
}

func (f *fakeDriver) close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return fakeError("cuStreamDestroy", codeInvalidHandle)
	}
	f.closed = true
	fakeGPU.Lock()
	for _, b := range f.blocks {
		fakeGPU.used -= uint64(len(b)) // the context takes its memory with it
	}
	fakeGPU.Unlock()
	// The reservation stays: device tensors that outlive the context still
	// hold slices into it, and once unmapped, the range may be handed to
	// Go's heap, whose collector then finds those slices pointing at
	// spans it never allocated and stops the process ("found bad pointer
	// in Go heap"). Address space is all it costs.
	return nil
}

// fakeBLAS is the fake's cuBLAS: it takes the column-major calls Gemm
// makes, checks their arguments as cuBLAS does (so that a call that
// passes Gemm's checks but not cuBLAS's fails the tests here), and
// computes them on the fake's memory, with float64 accumulation, at once.
// A call that reaches outside every block fails like a kernel that does.
type fakeBLAS struct {
	f         *fakeDriver
	workspace [2]uint64 // base, bytes
	closed    bool
}

func (f *fakeDriver) openBLAS() (blasDriver, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.usable("cublasCreate_v2"); err != nil {
		return nil, err
	}
	if f.blasErr != nil {
		return nil, f.blasErr
	}
	f.handles++
	return &fakeBLAS{f: f}, nil
}

func (b *fakeBLAS) library() string { return "fake cuBLAS" }

func (b *fakeBLAS) canSetWorkspace() bool { return true }

func (b *fakeBLAS) setWorkspace(ptr, bytes uint64) error {
	b.f.mu.Lock()
	defer b.f.mu.Unlock()
	if _, ok := b.f.resolve(ptr, bytes); !ok || b.closed {
		return &BLASError{Call: "cublasSetWorkspace_v2", Status: 7, Name: cublasStatusName(7)}
	}
	b.workspace = [2]uint64{ptr, bytes}
	return nil
}

func (b *fakeBLAS) close() error {
	b.f.mu.Lock()
	defer b.f.mu.Unlock()
	if b.closed {
		return &BLASError{Call: "cublasDestroy_v2", Status: 1, Name: cublasStatusName(1)}
	}
	b.closed = true
	b.f.handles--
	return nil
}

func (b *fakeBLAS) gemm(c gemmCall) error {
	f := b.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.captured(&fakeNode{run: func() error { return b.gemm(c) }}) {
		return nil
	}
	call := "cublasGemmEx"
	if c.batch > 1 {
		call = "cublasGemmStridedBatchedEx"
	}
	if err := f.usable(call); err != nil {
		return err
	}
	// cuBLAS's checks (column-major: op(A) is m x k, op(B) k x n).
	rowsA, colsA := c.m, c.k
	if c.transA {
		rowsA, colsA = c.k, c.m
	}
	rowsB, colsB := c.k, c.n
	if c.transB {
		rowsB, colsB = c.n, c.k
	}
	if b.closed || c.m < 0 || c.n < 0 || c.k < 0 || c.batch < 0 ||
		c.lda < max(1, rowsA) || c.ldb < max(1, rowsB) || c.ldc < max(1, c.m) ||
		(c.dtype == tensor.Float64 && c.tf32) {
		f.lastGemm = c
		return &BLASError{Call: call, Status: 7, Name: cublasStatusName(7)}
	}
	f.lastGemm = c
	if c.m == 0 || c.n == 0 {
		return nil
	}
	batch := max(int64(c.batch), 1)
	var ok bool
	switch c.dtype {
	case tensor.Float32:
		ok = fakeGemm[float32](f, c, batch, rowsA, colsA, rowsB, colsB)
	case tensor.Float64:
		ok = fakeGemm[float64](f, c, batch, rowsA, colsA, rowsB, colsB)
	default:
		return &BLASError{Call: call, Status: 15, Name: cublasStatusName(15)}
	}
	if !ok {
		f.sticky = fakeError("cuStreamSynchronize", codeIllegalAddress)
	}
	return nil
}

// fakeGemm computes a column-major gemmCall on the fake's memory; f.mu is
// held. It returns false if an operand reaches outside its block.
func fakeGemm[T float32 | float64](f *fakeDriver, c gemmCall, batch int64, rowsA, colsA, rowsB, colsB int32) bool {
	es := int64(unsafe.Sizeof(T(0)))
	view := func(ptr DevicePtr, rows, cols, ld int32, stride int64) ([]T, bool) {
		if rows == 0 || cols == 0 {
			return nil, true
		}
		n := (batch-1)*stride + int64(cols-1)*int64(ld) + int64(rows)
		b, ok := f.resolve(uint64(ptr), uint64(n*es))
		if !ok {
			return nil, false
		}
		return typed[T](b, n), true
	}
	a, ok1 := view(c.a, rowsA, colsA, c.lda, c.strideA)
	bm, ok2 := view(c.b, rowsB, colsB, c.ldb, c.strideB)
	cm, ok3 := view(c.c, c.m, c.n, c.ldc, c.strideC)
	if !ok1 || !ok2 || !ok3 {
		return false
	}
	// op(X)(i, l) of a column-major X with leading dimension ld.
	at := func(x []T, off int64, trans bool, ld int32, i, l int32) float64 {
		if trans {
			return float64(x[off+int64(i)*int64(ld)+int64(l)])
		}
		return float64(x[off+int64(l)*int64(ld)+int64(i)])
	}
	for p := range batch {
		for j := range c.n {
			for i := range c.m {
				sum := 0.0
				for l := range c.k {
					sum += at(a, p*c.strideA, c.transA, c.lda, i, l) * at(bm, p*c.strideB, c.transB, c.ldb, l, j)
				}
				o := p*c.strideC + int64(j)*int64(c.ldc) + int64(i)
				v := c.alpha * sum
				if c.beta != 0 { // beta 0: C is not read (BLAS's rule)
					v += c.beta * float64(cm[o])
				}
				cm[o] = T(v)
			}
		}
	}
	return true
}

// typed views the fake's bytes as n elements of T.
func typed[T any](b []byte, n int64) []T {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(unsafe.Pointer(&b[0])), n)
}

func fakeFill(f *fakeDriver, params unsafe.Pointer, size uintptr) bool {
	p := *(*fillParams)(params)
	out, ok := f.resolve(uint64(p.Out), uint64(p.N)*8)
	if !ok {
		return false
	}
	vals := typed[uint64](out, p.N)
	for i := range vals {
		vals[i] = p.Value
	}
	return true
}

func fakeAdd[T float32 | float64](acc bool) fakeKernel {
	return func(f *fakeDriver, params unsafe.Pointer, size uintptr) bool {
		p := *(*addParams)(params)
		es := uint64(unsafe.Sizeof(T(0)))
		n := uint64(p.N)
		ob, ok1 := f.resolve(uint64(p.Out), n*es)
		ab, ok2 := f.resolve(uint64(p.A), n*es)
		if !ok1 || !ok2 {
			return false
		}
		out, a := typed[T](ob, p.N), typed[T](ab, p.N)
		var b []T
		if p.B != 0 {
			bn := int64(1)
			if p.BStride != 0 {
				bn = p.N
			}
			bb, ok := f.resolve(uint64(p.B), uint64(bn)*es)
			if !ok {
				return false
			}
			b = typed[T](bb, bn)
		}
		for i := range out {
			v := a[i]
			if b != nil {
				v += b[int64(i)*p.BStride]
			} else {
				v += T(p.Scalar)
			}
			if acc {
				v = out[i] + v
			}
			out[i] = v
		}
		return true
	}
}

func fakeAxpy[T float32 | float64](f *fakeDriver, params unsafe.Pointer, size uintptr) bool {
	p := *(*axpyParams)(params)
	es := uint64(unsafe.Sizeof(T(0)))
	yb, ok1 := f.resolve(uint64(p.Y), uint64(p.N)*es)
	xb, ok2 := f.resolve(uint64(p.X), uint64(p.N)*es)
	if !ok1 || !ok2 {
		return false
	}
	y, x := typed[T](yb, p.N), typed[T](xb, p.N)
	for i := range y {
		y[i] += T(p.Alpha) * x[i]
	}
	return true
}

func fakeImages(module string) ([]byte, error) {
	if module != elementwiseModule {
		return nil, fmt.Errorf("no module %q among the embedded ones (%s)", module, elementwiseModule)
	}
	return []byte("fake fatbin"), nil
}

// openFake opens a Device on a new fake driver, reading SyncEnv as Open
// does, and closes it when the test ends.
func openFake(tb testing.TB) *Device {
	syncLaunches, err := syncFromEnv()
	if err != nil {
		tb.Fatal(err)
	}
	graphs, err := graphsFromEnv()
	if err != nil {
		tb.Fatal(err)
	}
	d := newDevice(withGraphs(newFakeDriver(tb), graphs, syncLaunches), fakeImages, syncLaunches)
	tb.Cleanup(func() { _ = d.Close() })
	return d
}

// fakeOf returns the fake driver under d, which may be wrapped in a
// replayDriver.
func fakeOf(d *Device) (*fakeDriver, bool) {
	drv := d.drv
	if r, ok := drv.(*replayDriver); ok {
		drv = r.driver
	}
	f, ok := drv.(*fakeDriver)
	return f, ok
}
