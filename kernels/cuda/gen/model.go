package main

import (
	"fmt"
	"io/fs"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// The model: every kernel of every module with its params struct, the
// structs' layouts as C++ (and Go) lay them out, and the exported
// constants' values.

type typeKind int

const (
	kindScalar typeKind = iota
	kindPointer
	kindArray
	kindStruct
)

type ctype struct {
	kind        typeKind
	cxx         string // spelled for decltype: uint64_t, const void*, int32_t[48], FastDiv
	goType      string // backend.DevicePtr, int32, [48]int32, FastDiv
	size, align int64
	elem        *ctype
	st          *pstruct
}

type field struct {
	cxxName, goName string
	typ             *ctype
	offset          int64
	line            fileLine
}

// fileLine is where a declaration is, for messages.
type fileLine struct {
	f    *file
	line int
}

func (l fileLine) errorf(format string, args ...any) error {
	return l.f.errorf(l.line, format, args...)
}

// memberLine is one C++ member declaration (`int32_t n, c, h;`) as one Go
// line, when its declarators share a type.
type memberLine struct {
	fields        []*field
	doc, trailing string
	goType        string
}

type pstruct struct {
	def         *structDef
	name        string
	lines       []*memberLine
	fields      []*field
	size, align int64
	resolving   bool
}

type pkernel struct {
	def                   *kernelDef
	module                string
	goName                string
	params                *pstruct
	maxThreads, minBlocks int64
	variant               bool // inside #if STHENO_KERNEL_VARIANTS
}

type pconst struct {
	exp   *export
	value int64
}

type family struct {
	name, goName string
	f32, f64     *pkernel
}

type model struct {
	files    map[string]*file
	decls    map[string]*decls
	names    []string // files, sorted
	kernels  []*pkernel
	structs  []*pstruct
	byDef    map[*structDef]*pstruct
	consts   []*pconst
	families []*family
}

// isModule reports whether a file of the kernels directory is a module
// (one fatbin or PTX file): the .cu files.
func isModule(name string) bool { return strings.HasSuffix(name, ".cu") }

// load reads the .cu and .cuh files of dir in fsys (not skip, the
// generated header) and builds the model. display prefixes the paths that
// messages show.
func load(fsys fs.FS, dir, display, skip string) (*model, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	m := &model{files: map[string]*file{}, decls: map[string]*decls{}, byDef: map[*structDef]*pstruct{}}
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || n == skip || !(strings.HasSuffix(n, ".cu") || strings.HasSuffix(n, ".cuh")) {
			continue
		}
		src, err := fs.ReadFile(fsys, path.Join(dir, n))
		if err != nil {
			return nil, err
		}
		f, err := lexFile(path.Join(display, n), n, src)
		if err != nil {
			return nil, err
		}
		d, err := walk(f)
		if err != nil {
			return nil, err
		}
		m.files[n], m.decls[n] = f, d
		m.names = append(m.names, n)
	}
	sort.Strings(m.names)
	if err := m.build(); err != nil {
		return nil, err
	}
	return m, nil
}

// visible returns name and the files it includes, transitively, in
// include order.
func (m *model) visible(name string) []string {
	var out []string
	var visit func(string)
	visit = func(n string) {
		if m.files[n] == nil || slices.Contains(out, n) {
			return
		}
		out = append(out, n)
		for _, inc := range m.files[n].includes {
			visit(inc)
		}
	}
	visit(name)
	return out
}

func (m *model) build() error {
	seen := map[string]*pkernel{}
	for _, n := range m.names {
		if !isModule(n) {
			if ks := m.decls[n].kernels; len(ks) > 0 {
				return m.files[n].errorf(ks[0].line, "kernel %s in a header: kernels live in the .cu file of their module", ks[0].name)
			}
			continue
		}
		module := strings.TrimSuffix(n, ".cu")
		for _, kd := range m.decls[n].kernels {
			if prev := seen[kd.name]; prev != nil {
				return kd.file.errorf(kd.line, "kernel %s is also defined at %s:%d", kd.name, prev.def.file.path, prev.def.line)
			}
			sd, err := m.lookupStruct(n, kd.paramType)
			if err != nil {
				return kd.file.errorf(kd.line, "kernel %s takes %s: %v", kd.name, kd.paramType, err)
			}
			ps, err := m.resolve(sd)
			if err != nil {
				return err
			}
			k := &pkernel{def: kd, module: module, goName: goName(kd.name), params: ps, variant: kd.file.inVariants(kd.line)}
			if len(kd.bounds) > 2 || len(kd.bounds) == 1 && len(kd.bounds[0]) == 0 {
				return kd.file.errorf(kd.line, "kernel %s: __launch_bounds__ takes max threads and, optionally, min blocks", kd.name)
			}
			for bi, b := range kd.bounds {
				v, err := m.eval(n, b)
				if err != nil {
					return kd.file.errorf(kd.line, "kernel %s: __launch_bounds__: %v", kd.name, err)
				}
				if bi == 0 {
					k.maxThreads = v
				} else {
					k.minBlocks = v
				}
			}
			seen[kd.name] = k
			m.kernels = append(m.kernels, k)
		}
	}
	// The C++ side's check of each params struct: STHENO_PARAMS(S) after S.
	marked := map[*pstruct]bool{}
	for _, n := range m.names {
		for _, mk := range m.decls[n].markers {
			var ps *pstruct
			for _, s := range m.structs {
				if s.name == mk.name && s.def.file.name == n && s.def.line < mk.line {
					ps = s
				}
			}
			if ps == nil {
				return mk.file.errorf(mk.line, "STHENO_PARAMS(%s): no kernel takes a struct %s defined above it in this file (the marker follows a params struct's definition)", mk.name, mk.name)
			}
			marked[ps] = true
		}
	}
	sort.SliceStable(m.structs, func(i, j int) bool {
		a, b := m.structs[i].def, m.structs[j].def
		if a.file.name != b.file.name {
			return a.file.name < b.file.name
		}
		return a.line < b.line
	})
	for _, s := range m.structs {
		if !marked[s] {
			return s.def.file.errorf(s.def.line, "struct %s is a kernel's params struct (or part of one), but nothing checks its layout on the C++ side: write STHENO_PARAMS(%s); after it (and #include \"%s\")", s.name, s.name, headerName)
		}
	}
	for _, n := range m.names {
		for _, e := range m.decls[n].exports {
			v, err := m.eval(n, e.expr)
			if err != nil {
				return e.file.errorf(e.line, "stheno:const %s: %v", e.goName, err)
			}
			m.consts = append(m.consts, &pconst{exp: e, value: v})
		}
		if err := m.decls[n].unusedAnnotation(m.files[n]); err != nil {
			return err
		}
	}
	m.findFamilies()
	return m.checkNames()
}

// lookupStruct finds the plain struct name among the files file sees.
func (m *model) lookupStruct(file, name string) (*structDef, error) {
	var found []*structDef
	template := false
	for _, n := range m.visible(file) {
		for _, s := range m.decls[n].structs {
			if s.name != name {
				continue
			}
			if s.template {
				template = true
				continue
			}
			found = append(found, s)
		}
	}
	switch {
	case len(found) == 1:
		if found[0].base {
			return nil, fmt.Errorf("struct %s has base classes; a params struct is plain", name)
		}
		return found[0], nil
	case len(found) > 1:
		return nil, fmt.Errorf("struct %s is defined twice, at %s:%d and %s:%d", name, found[0].file.path, found[0].line, found[1].file.path, found[1].line)
	case template:
		return nil, fmt.Errorf("%s is a template; a params struct is a plain struct", name)
	}
	return nil, fmt.Errorf("no struct %s in %s or the files it includes", name, file)
}

// scalars maps C++ fixed-size scalar types (their words joined by spaces)
// to Go.
var scalars = map[string]struct {
	goType string
	size   int64
}{
	"bool": {"bool", 1}, "int8_t": {"int8", 1}, "uint8_t": {"uint8", 1}, "signed char": {"int8", 1}, "unsigned char": {"uint8", 1},
	"int16_t": {"int16", 2}, "uint16_t": {"uint16", 2}, "short": {"int16", 2}, "short int": {"int16", 2}, "unsigned short": {"uint16", 2},
	"int32_t": {"int32", 4}, "uint32_t": {"uint32", 4}, "int": {"int32", 4}, "signed": {"int32", 4}, "signed int": {"int32", 4},
	"unsigned": {"uint32", 4}, "unsigned int": {"uint32", 4},
	"int64_t": {"int64", 8}, "long long": {"int64", 8}, "long long int": {"int64", 8}, "signed long long": {"int64", 8},
	"uint64_t": {"uint64", 8}, "unsigned long long": {"uint64", 8},
	"float": {"float32", 4}, "double": {"float64", 8},
}

const devicePtr = "backend.DevicePtr"

// resolve lays out a params struct (and the structs it holds).
func (m *model) resolve(sd *structDef) (*pstruct, error) {
	if ps := m.byDef[sd]; ps != nil {
		if ps.resolving {
			return nil, sd.file.errorf(sd.line, "struct %s holds itself", sd.name)
		}
		return ps, nil
	}
	for _, other := range m.structs {
		if other.name == sd.name {
			return nil, sd.file.errorf(sd.line, "two params structs are called %s (the other at %s:%d); Go needs distinct names", sd.name, other.def.file.path, other.def.line)
		}
	}
	ps := &pstruct{def: sd, name: sd.name, resolving: true}
	m.byDef[sd] = ps
	m.structs = append(m.structs, ps)
	var decl []token
	for _, t := range sd.body {
		if t.text != ";" {
			decl = append(decl, t)
			continue
		}
		if err := m.member(ps, decl); err != nil {
			return nil, err
		}
		decl = nil
	}
	if len(decl) > 0 {
		return nil, sd.file.errorf(decl[0].line, "struct %s: declaration without ;", sd.name)
	}
	if len(ps.fields) == 0 {
		return nil, sd.file.errorf(sd.line, "struct %s has no fields", sd.name)
	}
	ps.align = 1
	var off int64
	for _, f := range ps.fields {
		if a := alignUp(off, f.typ.align); a != off {
			// Implicit padding would let a field be added there unseen by
			// the C++ side's asserts, which check offsets and sizes.
			return nil, f.line.errorf("struct %s: %d bytes of padding before %s: declare them as a field (int32_t unused;)", sd.name, a-off, f.cxxName)
		}
		f.offset = off
		off += f.typ.size
		ps.align = max(ps.align, f.typ.align)
	}
	ps.size = alignUp(off, ps.align)
	if ps.size != off {
		return nil, sd.file.errorf(sd.line, "struct %s: %d bytes of padding at its end: declare them as a field (int32_t unused;)", sd.name, ps.size-off)
	}
	ps.resolving = false
	return ps, nil
}

func alignUp(n, a int64) int64 { return (n + a - 1) / a * a }

var fieldRejects = map[string]bool{
	"static": true, "using": true, "typedef": true, "template": true, "enum": true, "struct": true, "union": true,
	"friend": true, "virtual": true, "mutable": true, "alignas": true, "operator": true, "(": true, "{": true, "=": true,
	":": true, "&": true, "&&": true, "volatile": true,
}

// member reads one member declaration of ps.
func (m *model) member(ps *pstruct, decl []token) error {
	sd := ps.def
	f := sd.file
	line := decl[0].line
	var words []string
	for _, t := range decl {
		words = append(words, t.text)
	}
	spelled := strings.Join(words, " ")
	bad := func(why string) error {
		return f.errorf(line, "struct %s: cannot mirror `%s;` in Go: %s", sd.name, spelled, why)
	}
	for _, t := range decl {
		if fieldRejects[t.text] {
			return bad("a params struct holds only fields of fixed-size numbers, pointers, arrays of them and plain structs")
		}
	}
	i := 0
	var pre []string
	for i < len(decl) && decl[i].text == "const" {
		pre = append(pre, "const")
		i++
	}
	// The base type: words of a built-in type, or [ns::]*Name.
	var baseName, baseSpelled string
	builtin := map[string]bool{"unsigned": true, "signed": true, "short": true, "long": true, "int": true, "char": true}
	if i < len(decl) && builtin[decl[i].text] {
		var words []string
		for i < len(decl) && builtin[decl[i].text] {
			words = append(words, decl[i].text)
			i++
		}
		baseName = strings.Join(words, " ")
		baseSpelled = baseName
	} else {
		var q string
		for i+1 < len(decl) && decl[i].kind == tokIdent && decl[i+1].text == "::" {
			q += decl[i].text + "::"
			i += 2
		}
		if i >= len(decl) || decl[i].kind != tokIdent {
			return bad("no type")
		}
		baseName = decl[i].text
		baseSpelled = q + baseName
		i++
	}
	for i < len(decl) && decl[i].text == "const" {
		pre = append(pre, "const")
		i++
	}
	if len(pre) > 0 {
		baseSpelled = "const " + baseSpelled
	}

	// What the annotations and comments of this declaration say.
	last := decl[len(decl)-1].line
	anns := m.decls[f.name].annotations
	doc, marks := docAbove(f, anns, line, "uint64")
	var trailing []string
	for l := line; l <= last; l++ {
		for _, c := range f.trailingAt[l] {
			trailing = append(trailing, strings.TrimRight(strings.TrimSpace(annotationRE.ReplaceAllString(c.text, "")), " ;,"))
			for _, a := range anns {
				if a.c == c && a.word == "uint64" {
					a.used = true
					marks = append(marks, "")
				}
			}
		}
	}
	asUint64 := len(marks) > 0

	var ml *memberLine
	for i < len(decl) {
		stars := 0
		for i < len(decl) && (decl[i].text == "*" || decl[i].text == "const" || decl[i].text == "__restrict__") {
			if decl[i].text == "*" {
				stars++
			}
			i++
		}
		if i >= len(decl) || decl[i].kind != tokIdent {
			return bad("no field name")
		}
		name := decl[i].text
		i++
		var t *ctype
		if stars > 0 {
			if asUint64 {
				return bad("stheno:uint64 marks a uint64_t field, not a pointer")
			}
			t = &ctype{kind: kindPointer, cxx: baseSpelled + strings.Repeat("*", stars), goType: devicePtr, size: 8, align: 8}
		} else if sc, ok := scalars[baseName]; ok {
			gt := sc.goType
			if gt == "uint64" && !asUint64 {
				// Params structs carry device addresses as uint64_t.
				gt = devicePtr
			} else if asUint64 && gt != "uint64" {
				return bad("stheno:uint64 marks a uint64_t field")
			}
			t = &ctype{kind: kindScalar, cxx: baseSpelled, goType: gt, size: sc.size, align: sc.size}
		} else if builtin[strings.Fields(baseName)[0]] || baseName == "size_t" || baseName == "ptrdiff_t" || baseName == "intptr_t" || baseName == "uintptr_t" {
			return bad(fmt.Sprintf("%s has no size fixed across hosts and devices: use int32_t, int64_t, uint32_t or uint64_t", baseName))
		} else {
			sd2, err := m.lookupStruct(f.name, baseName)
			if err != nil {
				return bad(fmt.Sprintf("its type: %v (fields are fixed-size numbers, pointers or plain structs)", err))
			}
			st, err := m.resolve(sd2)
			if err != nil {
				return err
			}
			t = &ctype{kind: kindStruct, cxx: baseSpelled, goType: st.name, size: st.size, align: st.align, st: st}
		}
		// Array dimensions, outermost first.
		var dims []int64
		for i < len(decl) && decl[i].text == "[" {
			end := matching(decl, i)
			if end < 0 {
				return bad("unbalanced [")
			}
			n, err := m.eval(f.name, decl[i+1:end])
			if err != nil {
				return bad(fmt.Sprintf("array length: %v", err))
			}
			if n <= 0 {
				return bad("array length must be positive")
			}
			dims = append(dims, n)
			i = end + 1
		}
		if len(dims) > 0 {
			cxx, gt := t.cxx, t.goType
			for k := range dims {
				cxx += fmt.Sprintf("[%d]", dims[k])
				gt = fmt.Sprintf("[%d]", dims[len(dims)-1-k]) + gt
			}
			el := t
			for k := len(dims) - 1; k >= 0; k-- {
				el = &ctype{kind: kindArray, size: el.size * dims[k], align: el.align, elem: el}
			}
			el.cxx, el.goType = cxx, gt
			t = el
		}
		fd := &field{cxxName: name, goName: fieldName(name), typ: t, line: fileLine{f, line}}
		if ml == nil || ml.goType != t.goType {
			ml = &memberLine{goType: t.goType, doc: doc, trailing: strings.Join(trailing, " ")}
			ps.lines = append(ps.lines, ml)
		}
		ml.fields = append(ml.fields, fd)
		ps.fields = append(ps.fields, fd)
		if i < len(decl) {
			if decl[i].text != "," {
				return bad(fmt.Sprintf("unexpected %q", decl[i].text))
			}
			i++
		}
	}
	seen := map[string]bool{}
	for _, fd := range ps.fields {
		if fd.goName != "_" && seen[fd.goName] {
			return bad(fmt.Sprintf("two fields are %s in Go", fd.goName))
		}
		seen[fd.goName] = true
	}
	return nil
}

// eval evaluates an integer constant expression in file's scope:
// literals, constexprs of the files it sees, + - * / % << >> & | ^ ~ and
// parentheses.
func (m *model) eval(file string, expr []token) (int64, error) {
	e := &evaluator{m: m, file: file, toks: expr, busy: map[string]bool{}}
	return e.top()
}

type evaluator struct {
	m    *model
	file string
	toks []token
	i    int
	busy map[string]bool
}

func (e *evaluator) top() (int64, error) {
	if len(e.toks) == 0 {
		return 0, fmt.Errorf("empty expression")
	}
	v, err := e.binary(0)
	if err != nil {
		return 0, err
	}
	if e.i != len(e.toks) {
		return 0, fmt.Errorf("cannot evaluate %q", spell(e.toks))
	}
	return v, nil
}

func spell(toks []token) string {
	var s []string
	for _, t := range toks {
		s = append(s, t.text)
	}
	return strings.Join(s, " ")
}

var precedence = map[string]int{"|": 1, "^": 2, "&": 3, "<<": 4, ">>": 4, "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}

func (e *evaluator) binary(minPrec int) (int64, error) {
	l, err := e.unary()
	if err != nil {
		return 0, err
	}
	for e.i < len(e.toks) {
		op := e.toks[e.i].text
		p, ok := precedence[op]
		if !ok || p < minPrec {
			break
		}
		e.i++
		r, err := e.binary(p + 1)
		if err != nil {
			return 0, err
		}
		switch op {
		case "|":
			l |= r
		case "^":
			l ^= r
		case "&":
			l &= r
		case "<<":
			l <<= r
		case ">>":
			l >>= r
		case "+":
			l += r
		case "-":
			l -= r
		case "*":
			l *= r
		case "/", "%":
			if r == 0 {
				return 0, fmt.Errorf("division by zero in %q", spell(e.toks))
			}
			if op == "/" {
				l /= r
			} else {
				l %= r
			}
		}
	}
	return l, nil
}

func (e *evaluator) unary() (int64, error) {
	if e.i >= len(e.toks) {
		return 0, fmt.Errorf("cannot evaluate %q", spell(e.toks))
	}
	t := e.toks[e.i]
	switch {
	case t.text == "-" || t.text == "+" || t.text == "~":
		e.i++
		v, err := e.unary()
		switch t.text {
		case "-":
			v = -v
		case "~":
			v = ^v
		}
		return v, err
	case t.text == "(":
		e.i++
		v, err := e.binary(0)
		if err != nil {
			return 0, err
		}
		if e.i >= len(e.toks) || e.toks[e.i].text != ")" {
			return 0, fmt.Errorf("cannot evaluate %q", spell(e.toks))
		}
		e.i++
		return v, nil
	case t.kind == tokNumber:
		e.i++
		s := strings.TrimRight(t.text, "uUlL")
		v, err := strconv.ParseInt(s, 0, 64)
		if err != nil {
			return 0, fmt.Errorf("%s is not an integer literal", t.text)
		}
		return v, nil
	case t.kind == tokIdent:
		// [ns::]*name
		for e.i+1 < len(e.toks) && e.toks[e.i+1].text == "::" && e.i+2 < len(e.toks) {
			e.i += 2
		}
		name := e.toks[e.i].text
		e.i++
		for _, n := range e.m.visible(e.file) {
			if c := e.m.decls[n].consts[name]; c != nil {
				if e.busy[name] {
					return 0, fmt.Errorf("%s is defined in terms of itself", name)
				}
				e.busy[name] = true
				sub := &evaluator{m: e.m, file: n, toks: c.expr, busy: e.busy}
				v, err := sub.top()
				delete(e.busy, name)
				if err != nil {
					return 0, fmt.Errorf("%s: %v", name, err)
				}
				return v, nil
			}
		}
		return 0, fmt.Errorf("%s is not a namespace-scope constexpr of %s or the files it includes", name, e.file)
	}
	return 0, fmt.Errorf("cannot evaluate %q", spell(e.toks))
}

// findFamilies pairs the kernels whose names differ only in an f32 / f64
// word, with the same module and params: one template instantiated for
// both dtypes.
func (m *model) findFamilies() {
	byName := map[string]*pkernel{}
	for _, k := range m.kernels {
		byName[k.def.name] = k
	}
	for _, k := range m.kernels {
		words := strings.Split(k.def.name, "_")
		at := indexOf(words, "f32")
		if at < 0 || slices.Index(words[at+1:], "f32") >= 0 {
			continue
		}
		w64 := slices.Clone(words)
		w64[at] = "f64"
		k64 := byName[strings.Join(w64, "_")]
		if k64 == nil || k64.module != k.module || k64.params != k.params {
			continue
		}
		name := strings.Join(slices.Delete(slices.Clone(words), at, at+1), "_")
		m.families = append(m.families, &family{name: name, goName: goName(name), f32: k, f64: k64})
	}
}

// handWritten are the package's own identifiers (kernel.go).
var handWritten = []string{"Kernel", "KernelInfo", "Kernels", "Lookup", "byDtype", "kernelTable", "kernelIndex"}

func (m *model) checkNames() error {
	owner := map[string]string{}
	for _, n := range handWritten {
		owner[n] = "kernels/cuda/kernel.go"
	}
	claim := func(name, what string) error {
		if prev, ok := owner[name]; ok {
			return fmt.Errorf("%s and %s are both %s in Go", what, prev, name)
		}
		owner[name] = what
		return nil
	}
	for _, s := range m.structs {
		if err := claim(s.name, "struct "+s.name); err != nil {
			return err
		}
	}
	for _, k := range m.kernels {
		if err := claim(k.goName, "kernel "+k.def.name); err != nil {
			return err
		}
	}
	for _, f := range m.families {
		if err := claim(f.goName, "the kernels "+f.f32.def.name+" and "+f.f64.def.name); err != nil {
			return err
		}
	}
	for _, c := range m.consts {
		if err := claim(c.exp.goName, "constant "+c.exp.cxx); err != nil {
			return c.exp.file.errorf(c.exp.line, "%v", err)
		}
	}
	return nil
}
