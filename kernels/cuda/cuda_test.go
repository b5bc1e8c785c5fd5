//go:build stheno_cuda

package cuda

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
)

// compiled is what a module's compiled image says about one kernel.
type compiled struct {
	paramBytes int // -1: not found
	maxThreads int // 0: no __launch_bounds__ recorded
	// shared is the bytes of static shared memory (__shared__ arrays) of
	// a block, and reserved the part of them the image sets aside for the
	// driver.
	shared, reserved int
}

// image is the kernels of one compiled image of a module, for arch
// ("sm_80", "sm_90", or "ptx").
type image struct {
	arch    string
	kernels map[string]compiled
}

// sm90Reserved is the shared memory per block that CUDA reserves for the
// system on sm_80 and later (CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK;
// the opt-in limit is what is left of an SM's for one block). In sm_90
// images, ptxas lays it out at the start of the .nv.shared section of
// every kernel of a module that uses shared memory (a module that uses
// none has no such sections); sm_80's leave it to the driver.
const sm90Reserved = 1024

// The .nv.info attributes the test reads (cuobjdump -elf names them).
const (
	eifmtNVAL = 1
	eifmtBVAL = 2
	eifmtHVAL = 3
	eifmtSVAL = 4

	eiattrMaxThreads     = 0x05 // __launch_bounds__' max threads: x, y, z
	eiattrCbankParamSize = 0x19 // bytes of parameters
)

// cubinKernels reads the kernels of one sm_XX ELF image of a fatbin: every
// .nv.info.<kernel> section and the parameter bytes it records, and the
// size of its .nv.shared.<kernel> section (NOBITS; absent: no static
// shared memory).
func cubinKernels(img []byte) (image, error) {
	if len(img) < 0x34 {
		return image{}, &elf.FormatError{}
	}
	// A cubin's e_version is the CUDA ABI's (0x76 for CUDA 11.8), which
	// debug/elf refuses: read it as EV_CURRENT.
	img = bytes.Clone(img)
	binary.LittleEndian.PutUint32(img[0x14:], uint32(elf.EV_CURRENT))
	f, err := elf.NewFile(bytes.NewReader(img))
	if err != nil {
		return image{}, err
	}
	if f.Machine != elf.EM_CUDA || f.Class != elf.ELFCLASS64 {
		return image{}, &elf.FormatError{}
	}
	// e_flags (which debug/elf does not keep) holds the SM version in its
	// low byte: 0x50 for sm_80, 0x5a for sm_90.
	sm := int(img[0x30])
	out := map[string]compiled{}
	shared := map[string]int{}
	for _, s := range f.Sections {
		if name, ok := strings.CutPrefix(s.Name, ".nv.shared."); ok {
			shared[name] = int(s.Size)
			continue
		}
		name, ok := strings.CutPrefix(s.Name, ".nv.info.")
		if !ok {
			continue
		}
		data, err := s.Data()
		if err != nil {
			return image{}, err
		}
		c := compiled{paramBytes: -1}
		for len(data) >= 2 {
			format, attr := data[0], data[1]
			var val []byte
			switch format {
			case eifmtNVAL:
				data = data[min(4, len(data)):]
			case eifmtBVAL, eifmtHVAL:
				if len(data) < 4 {
					return image{}, fmt.Errorf("%s: truncated attribute", s.Name)
				}
				val, data = data[2:4], data[4:]
			case eifmtSVAL:
				if len(data) < 4 {
					return image{}, fmt.Errorf("%s: truncated attribute", s.Name)
				}
				n := int(binary.LittleEndian.Uint16(data[2:4]))
				if len(data) < 4+n {
					return image{}, fmt.Errorf("%s: truncated attribute", s.Name)
				}
				val, data = data[4:4+n], data[4+n:]
			default:
				return image{}, fmt.Errorf("%s: attribute format %#x", s.Name, format)
			}
			switch {
			case attr == eiattrCbankParamSize && format == eifmtHVAL:
				c.paramBytes = int(binary.LittleEndian.Uint16(val))
			case attr == eiattrMaxThreads && format == eifmtSVAL && len(val) >= 4:
				c.maxThreads = int(binary.LittleEndian.Uint32(val))
			}
		}
		out[name] = c
	}
	for name, c := range out {
		size, ok := shared[name]
		c.shared = size
		if ok && sm >= 90 {
			c.reserved = sm90Reserved
		}
		out[name] = c
	}
	return image{arch: fmt.Sprintf("sm_%d", sm), kernels: out}, nil
}

var (
	ptxEntry  = regexp.MustCompile(`(?m)^\.(?:visible )?\.entry (\w+)\(`)
	ptxParam  = regexp.MustCompile(`\.param \.align \d+ \.b8 (\w+)_param_(\d+)\[(\d+)\]`)
	ptxMaxnt  = regexp.MustCompile(`(?m)^\.maxntid (\d+), (\d+), (\d+)`)
	ptxShared = regexp.MustCompile(`(?m)^\s*\.shared \.align \d+ \.b8 ([\w$]+)\[(\d+)\];`)
)

// ptxKernels reads the kernels of a PTX module. A kernel's static shared
// memory is the .shared arrays (not .extern: the dynamic ones) its text
// declares or names, whether declared in it or at module scope.
func ptxKernels(src string) (map[string]compiled, error) {
	arrays := map[string]int{}
	for _, m := range ptxShared.FindAllStringSubmatch(src, -1) {
		arrays[m[1]], _ = strconv.Atoi(m[2])
	}
	out := map[string]compiled{}
	starts := ptxEntry.FindAllStringSubmatchIndex(src, -1)
	for i, m := range starts {
		name := src[m[2]:m[3]]
		end := len(src)
		if i+1 < len(starts) {
			end = starts[i+1][0]
		}
		body := src[m[0]:end]
		// The parameter list and directives come before the body's brace.
		head, _, _ := strings.Cut(body, "{")
		c := compiled{paramBytes: -1}
		params := ptxParam.FindAllStringSubmatch(head, -1)
		if len(params) != 1 || params[0][1] != name || params[0][2] != "0" {
			return nil, fmt.Errorf("kernel %s: %d parameters in its PTX, want one struct", name, len(params))
		}
		c.paramBytes, _ = strconv.Atoi(params[0][3])
		if mt := ptxMaxnt.FindStringSubmatch(head); mt != nil {
			x, _ := strconv.Atoi(mt[1])
			y, _ := strconv.Atoi(mt[2])
			z, _ := strconv.Atoi(mt[3])
			c.maxThreads = x * y * z
		}
		for a, size := range arrays {
			if strings.Contains(body, a) {
				c.shared += size
			}
		}
		out[name] = c
	}
	return out, nil
}

// moduleImages returns the kernels of each module, per image in it (the
// cubins of a fatbin, or the PTX).
func moduleImages(t *testing.T) map[string][]image {
	t.Helper()
	out := map[string][]image{}
	names, _ := fs.Glob(kernels.Modules, "build/*")
	for _, p := range names {
		data, err := kernels.Modules.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		base := path.Base(p)
		switch {
		case strings.HasSuffix(base, ".ptx"):
			ks, err := ptxKernels(string(data))
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			module := strings.TrimSuffix(base, ".ptx")
			out[module] = append(out[module], image{arch: "ptx", kernels: ks})
		case strings.HasSuffix(base, ".fatbin"):
			module := strings.TrimSuffix(base, ".fatbin")
			// The fatbin holds an ELF image per sm_XX target (and
			// compressed PTX, which the test skips).
			for off := 0; ; {
				i := bytes.Index(data[off:], []byte("\x7fELF"))
				if i < 0 {
					break
				}
				off += i
				ks, err := cubinKernels(data[off:])
				off += 4
				var fe *elf.FormatError
				if errors.As(err, &fe) {
					continue // four bytes that only look like an ELF header
				}
				if err != nil {
					t.Fatalf("%s: %v", p, err)
				}
				out[module] = append(out[module], ks)
			}
			if len(out[module]) == 0 {
				t.Fatalf("%s: no ELF image", p)
			}
		}
	}
	return out
}

// TestKernelsCompiled checks the generated table against the compiled
// modules: every kernel is in every image of its module with a parameter
// block of its params struct's size (and within its launch bounds), and
// every kernel a module holds is in the table. The generator reads the
// sources; this reads what nvcc made of them.
func TestKernelsCompiled(t *testing.T) {
	images := moduleImages(t)
	want := map[string]map[string]KernelInfo{}
	for _, k := range Kernels() {
		if want[k.Module] == nil {
			want[k.Module] = map[string]KernelInfo{}
		}
		want[k.Module][k.Name] = k
	}
	var modules []string
	for m := range images {
		modules = append(modules, m)
	}
	sort.Strings(modules)
	for _, m := range modules {
		if want[m] == nil {
			t.Errorf("module %s (kernels/build) has no kernels in the table", m)
		}
		for _, img := range images[m] {
			for name, c := range img.kernels {
				k, ok := want[m][name]
				if !ok {
					t.Errorf("module %s %s: kernel %s is not in the table (run make kernels-go)", m, img.arch, name)
					continue
				}
				if c.paramBytes != k.ParamsSize {
					t.Errorf("%s.%s %s: %d bytes of parameters, %s has %d", m, name, img.arch, c.paramBytes, k.Params, k.ParamsSize)
				}
				if c.maxThreads != 0 && c.maxThreads != k.MaxThreads {
					t.Errorf("%s.%s %s: compiled for at most %d threads, the table says %d", m, name, img.arch, c.maxThreads, k.MaxThreads)
				}
			}
			for name, k := range want[m] {
				if _, ok := img.kernels[name]; !ok && !k.Variant {
					t.Errorf("module %s %s has no kernel %s", m, img.arch, name)
				}
			}
		}
	}
	n, bounded := 0, 0
	for _, imgs := range images {
		for _, img := range imgs {
			for _, c := range img.kernels {
				n++
				if c.maxThreads > 0 {
					bounded++
				}
			}
		}
	}
	t.Logf("%d kernels in %d modules' images, %d with launch bounds recorded", n, len(images), bounded)
	for m := range want {
		if images[m] == nil {
			t.Errorf("the table's module %s is not in kernels/build (make kernels)", m)
		}
	}
}

// TestVariantsBuilt checks kernels.VariantsBuilt, which reads the
// Makefile's stamp, against what the compiled modules hold: every variant
// in every image of its module when it says so, and in none otherwise.
// A variant the build leaves out is refused before any device is touched.
func TestVariantsBuilt(t *testing.T) {
	stamps, _ := fs.Glob(kernels.Modules, "build/variants-*.stamp")
	if len(stamps) != 1 {
		t.Errorf("kernels/build holds %d variants stamps %v, want one (make kernels)", len(stamps), stamps)
	}
	built := kernels.VariantsBuilt()
	images := moduleImages(t)
	variants := 0
	for _, k := range Kernels() {
		if !k.Variant {
			continue
		}
		variants++
		if k.Built() != built {
			t.Errorf("%s.%s: Built() = %t, kernels.VariantsBuilt() = %t", k.Module, k.Name, k.Built(), built)
		}
		for i, img := range images[k.Module] {
			if _, ok := img.kernels[k.Name]; ok != built {
				t.Errorf("variant %s.%s is in module image %d: %t; kernels.VariantsBuilt() (stamp %v): %t", k.Module, k.Name, i, ok, stamps, built)
			}
		}
	}
	if variants == 0 {
		t.Fatal("the table marks no kernel as a variant")
	}
	t.Logf("%v: %d variants, built in: %t", stamps, variants, built)
	if built {
		return
	}
	// No device: the refusal comes before the driver.
	_, err := ConvFpropMmaM256S4F32.Load(nil)
	if !errors.Is(err, ErrVariantNotBuilt) || !strings.Contains(err.Error(), string(ConvFpropMmaM256S4F32)) {
		t.Errorf("loading %s: %v, want ErrVariantNotBuilt naming it", string(ConvFpropMmaM256S4F32), err)
	}
	err = ConvFpropMmaM256S4F32.Launch(nil, backend.LaunchConfig{Block: backend.Dim3{X: 256, Y: 1, Z: 1}}, ConvGemmParams{})
	if !errors.Is(err, ErrVariantNotBuilt) {
		t.Errorf("launching %s: %v, want ErrVariantNotBuilt", string(ConvFpropMmaM256S4F32), err)
	}
}

// sharedPerBlock is the shared memory every GPU the kernels run on (sm_80
// and later) gives a block without opting in. ptxas refuses more static
// shared memory than that.
const sharedPerBlock = 48 << 10

// dynamicShared is the most dynamic shared memory package ops asks for at
// a launch of k without opting in to more: BatchNorm's and relu_mask_sum's
// scratch, and softmax's one value per thread of its block, at most its
// __launch_bounds__ (ops' TestSoftmaxPlanSharedMemory checks the plans).
// The conv GEMMs (ConvGemmParams) are launched with their own constants
// (ConvFpropMmaM128S3SmemBytes, ...), opting in where the GPU allows them
// (ops' TestConvKernelSharedMemory); ops gives no other kernel any.
func dynamicShared(k KernelInfo) int {
	elem := 4
	if strings.HasSuffix(k.Name, "_f64") {
		elem = 8
	}
	switch k.Params {
	case "BNParams":
		return BNScratchBytes
	case "MaskSumParams":
		return MaskSumScratchBytes
	case "SoftmaxParams":
		return k.MaxThreads * elem
	}
	return 0
}

// TestKernelsSharedMemory reads every kernel's static shared memory from
// the compiled modules: with the most dynamic shared memory ops asks for
// at its launches (dynamicShared), it fits the 48 KiB every GPU gives a
// block without opting in, counting what sm_90's images reserve for the
// driver; and the conv GEMMs, whose dynamic shared memory ops holds to the
// GPU's opt-in limit, declare none beyond that reservation, so the
// constants ops launches them with are all they take. No GPU needed.
func TestKernelsSharedMemory(t *testing.T) {
	images := moduleImages(t)
	type user struct {
		kernel, arch string
		bytes        int
	}
	var static, total user
	// The larger, or of two alike the first by name: the same every run.
	bigger := func(u *user, v user) {
		if v.bytes > u.bytes || v.bytes == u.bytes && v.kernel+v.arch < u.kernel+u.arch {
			*u = v
		}
	}
	for m, imgs := range images {
		for _, img := range imgs {
			for name, c := range img.kernels {
				k, ok := Lookup(m + "." + name)
				if !ok {
					continue // TestKernelsCompiled reports it
				}
				what := fmt.Sprintf("%s.%s (%s)", m, name, img.arch)
				if c.shared < c.reserved {
					t.Errorf("%s: %d bytes of static shared memory, less than the %d the image reserves", what, c.shared, c.reserved)
				}
				if k.Params == "ConvGemmParams" {
					if own := c.shared - c.reserved; own != 0 {
						t.Errorf("%s: %d bytes of static shared memory, which ops does not count", what, own)
					}
					continue
				}
				dyn := dynamicShared(k)
				if c.shared+dyn > sharedPerBlock {
					t.Errorf("%s: %d bytes of static shared memory and up to %d of dynamic exceed the %d a block has without opting in",
						what, c.shared, dyn, sharedPerBlock)
				}
				bigger(&static, user{m + "." + name, img.arch, c.shared - c.reserved})
				bigger(&total, user{m + "." + name, img.arch, c.shared + dyn})
			}
		}
	}
	t.Logf("largest static shared memory: %s (%s), %d bytes", static.kernel, static.arch, static.bytes)
	t.Logf("largest static and dynamic shared memory without opting in: %s (%s), %d bytes", total.kernel, total.arch, total.bytes)
}

func TestKernelNames(t *testing.T) {
	k := RoIAlignFwdNCHWColsS2F32
	if k.Module() != "roialign" || k.Name() != "roialign_fwd_nchw_cols_s2_f32" {
		t.Errorf("%q: module %q name %q", string(k), k.Module(), k.Name())
	}
	info, ok := Lookup(string(MSDeformSortScan))
	if !ok || info.MaxThreads != MSDeformOrderThreads || info.Params != "MSDeformOrderParams" {
		t.Errorf("Lookup(%q) = %+v, %v", string(MSDeformSortScan), info, ok)
	}
	if _, ok := Lookup("roialign.nonesuch"); ok {
		t.Error("Lookup found a kernel that does not exist")
	}
	for _, c := range []struct {
		dt   tensor.Dtype
		want Kernel[TransposeParams]
	}{{tensor.Float32, TransposePlanesF32}, {tensor.Float64, TransposePlanesF64}} {
		if got, err := TransposePlanes(c.dt); err != nil || got != c.want {
			t.Errorf("TransposePlanes(%v) = %q, %v; want %q", c.dt, string(got), err, string(c.want))
		}
	}
	if _, err := TransposePlanes(tensor.Int32); err == nil || !strings.Contains(err.Error(), "cuda: transpose_planes has kernels for float32 and float64, not int32") {
		t.Errorf("TransposePlanes(int32): %v", err)
	}
}

// TestLaunch launches one kernel of each module that runs everywhere on a
// GPU, and a block its launch bounds refuse. It needs a GPU.
func TestLaunch(t *testing.T) {
	dev, err := backend.Open(0)
	if errors.Is(err, backend.ErrNoDevice) {
		t.Skip("no CUDA device:", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	major, minor := dev.ComputeCapability()
	loaded, unbuilt := 0, 0
	for _, k := range Kernels() {
		if strings.HasSuffix(k.Module, "_sm90a") && (major != 9 || minor != 0) {
			continue // sm_90a code loads on compute capability 9.0 only
		}
		if !k.Built() {
			unbuilt++ // a variant this build leaves out: not asked of the driver
			continue
		}
		if _, err := dev.Kernel(k.Module, k.Name); err != nil {
			t.Errorf("loading %s.%s: %v", k.Module, k.Name, err)
			continue
		}
		loaded++
	}
	t.Logf("%s: loaded %d of %d kernels (%d variants not in this build)", dev, loaded, len(Kernels()), unbuilt)
	// transpose_planes of a 2 x 3 plane.
	in, err := dev.Alloc(6 * 4)
	if err != nil {
		t.Fatal(err)
	}
	out, err := dev.Alloc(6 * 4)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Free(in)
	defer dev.Free(out)
	cfg := backend.LaunchConfig{Grid: backend.Dim3{X: 1, Y: 1, Z: 1}, Block: backend.Dim3{X: TransposeTileRows, Y: TransposeBlockY, Z: 1}}
	if err := TransposePlanesF32.Launch(dev, cfg, TransposeParams{In: in, Out: out, A: 2, B: 3}); err != nil {
		t.Errorf("TransposePlanesF32: %v", err)
	}
	cfg.Block = backend.Dim3{X: TransposeTileRows, Y: 2 * TransposeBlockY, Z: 1}
	err = TransposePlanesF32.Launch(dev, cfg, TransposeParams{In: in, Out: out, A: 2, B: 3})
	if err == nil || !strings.Contains(err.Error(), "512 threads per block; its __launch_bounds__ allow 256") {
		t.Errorf("TransposePlanesF32 with 512 threads: %v", err)
	}
	if err := dev.Synchronize(); err != nil {
		t.Error(err)
	}
}
