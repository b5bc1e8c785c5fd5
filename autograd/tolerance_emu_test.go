package autograd

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"testing"
)

// The emulator's harnesses (kernels/emu/*_emu_test.cpp) take their
// tolerances from kernels/emu/harness.h, which copies this package's table
// by name, one a line:
//
//	inline constexpr Tol TolForward32{.abs = 1e-6, .rel = 1e-5};
//
// TestEmuHarnessTolerances fails when a copy's value differs from the
// table's, when the header lacks an entry of the table or has one the table
// lacks, or when a harness declares tolerances of its own, so that the two
// sides cannot drift apart.
func TestEmuHarnessTolerances(t *testing.T) {
	table := map[string]Tolerance{
		"TolForward64": TolForward64,
		"TolForward32": TolForward32,
		"TolGrad":      TolGrad,
		"TolParity64":  TolParity64,
		"TolParity32":  TolParity32,
		"TolTF32":      TolTF32,
		"TolGemm32":    TolGemm32,
		"TolTraining":  TolTraining,
	}
	// Every Tolerance of tolerance.go is in table (a new one goes there and
	// into harness.h).
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "tolerance.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.CompositeLit)
				if !ok {
					continue
				}
				if id, ok := lit.Type.(*ast.Ident); !ok || id.Name != "Tolerance" {
					continue
				}
				declared++
				if _, ok := table[name.Name]; !ok {
					t.Errorf("tolerance.go declares %s, which this test's table lacks (add it here and to kernels/emu/harness.h)", name.Name)
				}
			}
		}
	}
	if declared != len(table) {
		t.Errorf("tolerance.go declares %d tolerances, this test's table holds %d", declared, len(table))
	}

	const header = "../kernels/emu/harness.h"
	src, err := os.ReadFile(header)
	if err != nil {
		t.Fatal(err)
	}
	exact := regexp.MustCompile(`(?m)^inline constexpr Tol (Tol\w*)\{\.abs = ([^,{}]+), \.rel = ([^,{}]+)\};$`)
	// Any declaration of a Tol named Tol...: each must be of the form above.
	loose := regexp.MustCompile(`\bTol\s+(Tol\w*)\s*(?:=\s*(?:Tol\s*)?)?\{`)
	got := map[string]Tolerance{}
	for _, m := range exact.FindAllStringSubmatch(string(src), -1) {
		abs, err1 := strconv.ParseFloat(m[2], 64)
		rel, err2 := strconv.ParseFloat(m[3], 64)
		if err1 != nil || err2 != nil {
			t.Errorf("%s: %s: cannot read %q", header, m[1], m[0])
			continue
		}
		if _, dup := got[m[1]]; dup {
			t.Errorf("%s declares %s twice", header, m[1])
		}
		got[m[1]] = Tolerance{Abs: abs, Rel: rel}
	}
	for _, m := range loose.FindAllStringSubmatch(string(src), -1) {
		if _, ok := got[m[1]]; !ok {
			t.Errorf("%s declares %s in a form this test does not read: write it as %q", header, m[1],
				"inline constexpr Tol "+m[1]+"{.abs = ..., .rel = ...};")
		}
	}
	names := make([]string, 0, len(table))
	for name := range table {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		h, ok := got[name]
		switch {
		case !ok:
			t.Errorf("%s lacks %s", header, name)
		case h != table[name]:
			t.Errorf("%s: %s is {abs %g, rel %g}; tolerance.go's is {Abs %g, Rel %g}", header, name, h.Abs, h.Rel,
				table[name].Abs, table[name].Rel)
		}
	}
	for name := range got {
		if _, ok := table[name]; !ok {
			t.Errorf("%s declares %s, which tolerance.go does not", header, name)
		}
	}

	// The harnesses take their tolerances from the header: none declares
	// its own Tol or a Tol constant.
	harnesses, err := filepath.Glob("../kernels/emu/*_emu_test.cpp")
	if err != nil {
		t.Fatal(err)
	}
	if len(harnesses) == 0 {
		t.Fatal("no harness in ../kernels/emu")
	}
	own := regexp.MustCompile(`struct Tol\b|constexpr Tol\b`)
	for _, path := range harnesses {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if loc := own.FindIndex(b); loc != nil {
			t.Errorf("%s declares tolerances of its own (%q): take them from harness.h", path, b[loc[0]:loc[1]])
		}
	}
}
