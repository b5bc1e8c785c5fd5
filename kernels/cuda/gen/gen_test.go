package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
)

var update = flag.Bool("update", false, "rewrite testdata/fixture's golden files")

// firstDiff describes the first line where have and want differ, or "".
func firstDiff(have, want []byte) string {
	if bytes.Equal(have, want) {
		return ""
	}
	h, w := strings.Split(string(have), "\n"), strings.Split(string(want), "\n")
	for i := 0; i < max(len(h), len(w)); i++ {
		var hl, wl string
		if i < len(h) {
			hl = h[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if hl != wl {
			return fmt.Sprintf("line %d is %q, regenerated %q", i+1, hl, wl)
		}
	}
	return "the files differ"
}

func loadFixture(t *testing.T) *model {
	t.Helper()
	m, err := load(os.DirFS("testdata/fixture"), ".", "fixture", headerName)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestFixtureLayout(t *testing.T) {
	m := loadFixture(t)
	type want struct {
		goName, goType string
		offset         int64
	}
	cases := map[string]struct {
		size, align int64
		fields      []want
	}{
		"Inner": {16, 8, []want{{"A", "int32", 0}, {"_", "int32", 4}, {"B", "float64", 8}}},
		"AllTypes": {168, 8, []want{
			{"Flag", "bool", 0}, {"I8", "int8", 1}, {"U8", "uint8", 2}, {"Pad", "uint8", 3}, {"I16", "int16", 4}, {"U16", "uint16", 6},
			{"I", "int32", 8}, {"U", "uint32", 12}, {"I32", "int32", 16}, {"U32", "uint32", 20},
			{"Ll", "int64", 24}, {"I64", "int64", 32}, {"Addr", devicePtr, 40}, {"Bits", "uint64", 48},
			{"F", "float32", 56}, {"_", "int32", 60}, {"D", "float64", 64}, {"In", devicePtr, 72}, {"Out", devicePtr, 80},
			{"Table", "[6]int32", 88}, {"Grid", "[2][3]float32", 112}, {"LastFlag", "bool", 136}, {"Pad1", "[7]uint8", 137},
			{"Inner", "Inner", 144}, {"Count", "int32", 160}, {"_", "int32", 164},
		}},
		"ScaleParams": {24, 8, []want{{"X", devicePtr, 0}, {"N", "int64", 8}, {"Alpha", "float64", 16}}},
	}
	if len(m.structs) != len(cases) {
		t.Errorf("%d params structs, want %d", len(m.structs), len(cases))
	}
	for _, s := range m.structs {
		c, ok := cases[s.name]
		if !ok {
			t.Errorf("unexpected params struct %s", s.name)
			continue
		}
		if s.size != c.size || s.align != c.align {
			t.Errorf("%s: size %d align %d, want %d and %d", s.name, s.size, s.align, c.size, c.align)
		}
		if len(s.fields) != len(c.fields) {
			t.Errorf("%s: %d fields, want %d", s.name, len(s.fields), len(c.fields))
			continue
		}
		for i, f := range s.fields {
			if w := c.fields[i]; f.goName != w.goName || f.typ.goType != w.goType || f.offset != w.offset {
				t.Errorf("%s.%s: %s %s at %d, want %s %s at %d", s.name, f.cxxName, f.goName, f.typ.goType, f.offset, w.goName, w.goType, w.offset)
			}
		}
	}
}

// TestFixtureGoLayout builds the Go structs the generator describes with
// reflect and checks that Go lays them out where the generator (and C++)
// put the fields: the generated file's compile-time asserts then hold.
func TestFixtureGoLayout(t *testing.T) {
	m := loadFixture(t)
	built := map[string]reflect.Type{}
	var goType func(ct *ctype) reflect.Type
	goType = func(ct *ctype) reflect.Type {
		switch ct.kind {
		case kindPointer:
			return reflect.TypeFor[uint64]()
		case kindArray:
			n := ct.size / ct.elem.size
			return reflect.ArrayOf(int(n), goType(ct.elem))
		case kindStruct:
			return built[ct.st.name]
		}
		if ct.goType == devicePtr {
			return reflect.TypeFor[uint64]()
		}
		return map[string]reflect.Type{
			"bool": reflect.TypeFor[bool](), "int8": reflect.TypeFor[int8](), "uint8": reflect.TypeFor[uint8](),
			"int16": reflect.TypeFor[int16](), "uint16": reflect.TypeFor[uint16](), "int32": reflect.TypeFor[int32](),
			"uint32": reflect.TypeFor[uint32](), "int64": reflect.TypeFor[int64](), "uint64": reflect.TypeFor[uint64](),
			"float32": reflect.TypeFor[float32](), "float64": reflect.TypeFor[float64](),
		}[ct.goType]
	}
	// Inner first: AllTypes holds it.
	for _, name := range []string{"Inner", "AllTypes", "ScaleParams"} {
		var s *pstruct
		for _, c := range m.structs {
			if c.name == name {
				s = c
			}
		}
		var fields []reflect.StructField
		for i, f := range s.fields {
			fields = append(fields, reflect.StructField{Name: fmt.Sprintf("F%d", i), Type: goType(f.typ)})
		}
		rt := reflect.StructOf(fields)
		built[name] = rt
		if int64(rt.Size()) != s.size || int64(rt.Align()) != s.align {
			t.Errorf("%s: Go size %d align %d, generator %d and %d", name, rt.Size(), rt.Align(), s.size, s.align)
		}
		for i, f := range s.fields {
			if off := int64(rt.Field(i).Offset); off != f.offset {
				t.Errorf("%s.%s: Go offset %d, generator %d", name, f.cxxName, off, f.offset)
			}
		}
	}
}

func TestFixtureKernels(t *testing.T) {
	m := loadFixture(t)
	type want struct {
		name, goName, params  string
		maxThreads, minBlocks int64
		variant               bool
	}
	wants := []want{
		{"scale_f32", "ScaleF32", "ScaleParams", 0, 0, false},
		{"scale_f64", "ScaleF64", "ScaleParams", 0, 0, false},
		{"check_all_types", "CheckAllTypes", "AllTypes", 256, 0, false},
		{"scale_b2_f32", "ScaleB2F32", "ScaleParams", 128, 2, false},
		{"scale_b2_f64", "ScaleB2F64", "ScaleParams", 128, 2, true},
		{"scale_u64", "ScaleU64", "ScaleParams", 0, 0, false},
	}
	if len(m.kernels) != len(wants) {
		t.Fatalf("%d kernels, want %d", len(m.kernels), len(wants))
	}
	for i, k := range m.kernels {
		w := wants[i]
		if k.def.name != w.name || k.goName != w.goName || k.params.name != w.params || k.maxThreads != w.maxThreads || k.minBlocks != w.minBlocks || k.module != "fixture" || k.variant != w.variant {
			t.Errorf("kernel %d: %s (%s) in %s takes %s, bounds %d %d, variant %v; want %+v", i, k.def.name, k.goName, k.module, k.params.name, k.maxThreads, k.minBlocks, k.variant, w)
		}
	}
	var fams []string
	for _, f := range m.families {
		fams = append(fams, f.goName+"="+f.f32.def.name+"|"+f.f64.def.name)
	}
	if got, want := strings.Join(fams, " "), "Scale=scale_f32|scale_f64 ScaleB2=scale_b2_f32|scale_b2_f64"; got != want {
		t.Errorf("dtype pairs %s, want %s", got, want)
	}
	var consts []string
	for _, c := range m.consts {
		consts = append(consts, fmt.Sprintf("%s=%d", c.exp.goName, c.value))
	}
	if got, want := strings.Join(consts, " "), "FixtureTile=16 FixtureShapeBytes=128"; got != want {
		t.Errorf("constants %s, want %s", got, want)
	}
}

// TestFixtureGolden compares the fixture's generated files with
// testdata/fixture/*.golden (go test -update rewrites them).
func TestFixtureGolden(t *testing.T) {
	m := loadFixture(t)
	goSrc, err := m.goSource()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		got  []byte
	}{{"testdata/fixture/kernels_gen.go.golden", goSrc}, {"testdata/fixture/" + headerName + ".golden", m.cxxHeader()}} {
		if *update {
			if err := os.WriteFile(c.path, c.got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if d := firstDiff(want, c.got); d != "" {
			t.Errorf("%s: %s (go test -update rewrites it)", c.path, d)
		}
	}
}

// TestFixtureCompiles compiles the fixture as C++ with the generated
// header, as the emulator does with the kernels: every STHENO_PARAMS holds.
// Then it changes a field's type and checks that the assert catches it.
func TestFixtureCompiles(t *testing.T) {
	cxx, err := exec.LookPath("g++")
	if err != nil {
		t.Skip("no g++")
	}
	m := loadFixture(t)
	dir := t.TempDir()
	src, err := os.ReadFile("testdata/fixture/fixture.cu")
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := os.ReadFile("testdata/fixture/fixture.cuh")
	if err != nil {
		t.Fatal(err)
	}
	prelude := "#define __global__\n#define __device__\n#define __launch_bounds__(...)\n#include \"fixture.cu\"\n"
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(headerName, m.cxxHeader())
	write("fixture.cuh", hdr)
	write("main.cpp", []byte(prelude))
	compile := func() (string, error) {
		out, err := exec.Command(cxx, "-std=c++17", "-fsyntax-only", "-Wall", filepath.Join(dir, "main.cpp")).CombinedOutput()
		return string(out), err
	}
	write("fixture.cu", src)
	if out, err := compile(); err != nil {
		t.Fatalf("the fixture does not compile with its header: %v\n%s", err, out)
	}
	write("fixture.cu", bytes.Replace(src, []byte("  uint16_t u16;"), []byte("  int16_t u16;"), 1))
	out, err := compile()
	if err == nil || !strings.Contains(out, "AllTypes::u16: offset or type differs") {
		t.Errorf("a changed field type compiled (%v):\n%s", err, out)
	}
	// A field added where unused was: unused moves.
	write("fixture.cu", bytes.Replace(src, []byte("  float f;"), []byte("  float f, g;"), 1))
	out, err = compile()
	if err == nil || !strings.Contains(out, "AllTypes::unused: offset or type differs") {
		t.Errorf("a new field compiled (%v):\n%s", err, out)
	}
}

// TestErrors: declarations the generator refuses, and what it says.
func TestErrors(t *testing.T) {
	const params = "#include <stdint.h>\nstruct P { int32_t n; };\nSTHENO_PARAMS(P);\n"
	const withK = params + "extern \"C\" __global__ void k(P p) {}\n"
	cases := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"two params", map[string]string{"a.cu": params + `extern "C" __global__ void k(P p, int n) {}`},
			"a.cu:4: kernel k takes (P p , int n): a kernel takes one params struct by value"},
		{"pointer param", map[string]string{"a.cu": params + `extern "C" __global__ void k(const P* p) {}`},
			"kernel k takes (const P * p): a kernel takes one params struct by value"},
		{"scalar param", map[string]string{"a.cu": params + `extern "C" __global__ void k(int n) {}`},
			"kernel k takes (int n)"},
		{"not extern C", map[string]string{"a.cu": params + `__global__ void k(P p) {}`},
			`a.cu:4: __global__ function outside extern "C"`},
		{"template kernel", map[string]string{"a.cu": params + "extern \"C\" {\ntemplate <typename T> __global__ void k(P p) {}\n}"},
			`a.cu:5: __global__ function outside extern "C"`},
		{"macro outside extern C", map[string]string{"a.cu": params + "#define K(name) __global__ void name(P p) {}\nK(k)\n"},
			`a.cu:5: K defines a kernel outside extern "C"`},
		{"long field", map[string]string{"a.cu": "struct P { long n; };\nSTHENO_PARAMS(P);\nextern \"C\" __global__ void k(P p) {}"},
			"a.cu:1: struct P: cannot mirror `long n;` in Go: long has no size fixed across hosts and devices"},
		{"method", map[string]string{"a.cu": "struct P { int n; int get() const { return n; } };\nSTHENO_PARAMS(P);\nextern \"C\" __global__ void k(P p) {}"},
			"struct P: cannot mirror `int get ( ) const { return n;` in Go: a params struct holds only fields"},
		{"unknown field type", map[string]string{"a.cu": "struct P { float2 v; };\nSTHENO_PARAMS(P);\nextern \"C\" __global__ void k(P p) {}"},
			"struct P: cannot mirror `float2 v;` in Go: its type: no struct float2"},
		{"no marker", map[string]string{"a.cu": "#include <stdint.h>\nstruct P { int32_t n; };\nextern \"C\" __global__ void k(P p) {}"},
			"a.cu:2: struct P is a kernel's params struct (or part of one), but nothing checks its layout on the C++ side: write STHENO_PARAMS(P);"},
		{"marker of no params", map[string]string{"a.cu": params + "struct Q { int32_t n; };\nSTHENO_PARAMS(Q);\nextern \"C\" __global__ void k(P p) {}"},
			"a.cu:5: STHENO_PARAMS(Q): no kernel takes a struct Q"},
		{"no struct", map[string]string{"a.cu": `extern "C" __global__ void k(Q p) {}`},
			"a.cu:1: kernel k takes Q: no struct Q in a.cu or the files it includes"},
		{"struct not included", map[string]string{"a.cuh": params, "b.cu": `extern "C" __global__ void k(P p) {}`},
			"b.cu:1: kernel k takes P: no struct P in b.cu"},
		{"template struct", map[string]string{"a.cu": "template <typename T> struct P { T n; };\nextern \"C\" __global__ void k(P p) {}"},
			"kernel k takes P: P is a template"},
		{"kernel in header", map[string]string{"a.cuh": params + `extern "C" __global__ void k(P p) {}`, "b.cu": `#include "a.cuh"`},
			"a.cuh:4: kernel k in a header"},
		{"else in the variants' guard", map[string]string{"a.cu": params + "#if STHENO_KERNEL_VARIANTS\nextern \"C\" __global__ void k(P p) {}\n#else\n#endif\n"},
			"a.cu:6: #else in #if STHENO_KERNEL_VARIANTS (line 4): the guard takes no other branch"},
		{"variants' guard spelled otherwise", map[string]string{"a.cu": params + "#ifdef STHENO_KERNEL_VARIANTS\n#endif\n"},
			"a.cu:4: #ifdef STHENO_KERNEL_VARIANTS: write the variants' guard as #if STHENO_KERNEL_VARIANTS"},
		{"unterminated if", map[string]string{"a.cu": params + "#if STHENO_KERNEL_VARIANTS\n" + `extern "C" __global__ void k(P p) {}`},
			"a.cu:4: #if without #endif"},
		{"same kernel twice", map[string]string{"a.cu": params + `extern "C" __global__ void k(P p) {}`, "b.cu": "#include \"a.cu\"\nextern \"C\" __global__ void k(P p) {}"},
			"b.cu:2: kernel k is also defined at x/a.cu:4"},
		{"const annotates nothing", map[string]string{"a.cu": withK + "// stheno:const Foo\nint x;\n"},
			"a.cu:5: stheno:const Foo annotates nothing"},
		{"const without name", map[string]string{"a.cu": params + "// stheno:const\nconstexpr int x = 1;\n"},
			"a.cu:4: stheno:const needs the Go name"},
		{"unknown annotation", map[string]string{"a.cu": params + "// stheno:tile\n"},
			"a.cu:4: unknown annotation stheno:tile"},
		{"conjunction", map[string]string{"a.cu": params + "// stheno:const Foo\nstatic_assert(A::x == 1 && A::y == 2, \"\");\n"},
			"a.cu:5: stheno:const Foo: the static_assert must be one comparison X == N, not a conjunction"},
		{"not an integer", map[string]string{"a.cu": withK + "// stheno:const Foo\nconstexpr float x = 1.5f;\n"},
			"a.cu:6: stheno:const Foo: 1.5f is not an integer literal"},
		{"unknown constant", map[string]string{"a.cu": withK + "// stheno:const Foo\nconstexpr int x = kY * 2;\n"},
			"a.cu:6: stheno:const Foo: kY is not a namespace-scope constexpr of a.cu"},
		{"uint64 on int", map[string]string{"a.cu": "#include <stdint.h>\nstruct P { int32_t n; // stheno:uint64\n};\nSTHENO_PARAMS(P);\nextern \"C\" __global__ void k(P p) {}"},
			"a.cu:2: struct P: cannot mirror `int32_t n;` in Go: stheno:uint64 marks a uint64_t field"},
		{"uint64 annotates nothing", map[string]string{"a.cu": withK + "int x; // stheno:uint64\n"},
			"a.cu:5: stheno:uint64 annotates nothing"},
		{"go name clash", map[string]string{"a.cu": params + "extern \"C\" {\n__global__ void p(P p) {}\n}\n"},
			"kernel p and struct P are both P in Go"},
		{"padding", map[string]string{"a.cu": "#include <stdint.h>\nstruct P {\n  int32_t n;\n  double d;\n};\nSTHENO_PARAMS(P);\nextern \"C\" __global__ void k(P p) {}"},
			"a.cu:4: struct P: 4 bytes of padding before d: declare them as a field"},
		{"tail padding", map[string]string{"a.cu": "#include <stdint.h>\nstruct P {\n  double d;\n  int32_t n;\n};\nSTHENO_PARAMS(P);\nextern \"C\" __global__ void k(P p) {}"},
			"a.cu:2: struct P: 4 bytes of padding at its end"},
		{"field name clash", map[string]string{"a.cu": "struct P { int dy; int DY; };\nSTHENO_PARAMS(P);\nextern \"C\" __global__ void k(P p) {}"},
			"two fields are DY in Go"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fsys := fstest.MapFS{}
			for n, s := range c.files {
				fsys[n] = &fstest.MapFile{Data: []byte(s)}
			}
			_, err := load(fsys, ".", "x", headerName)
			if err == nil {
				t.Fatalf("no error, want %q", c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q, want it to say %q", err, c.want)
			}
		})
	}
}
