package main

import (
	"regexp"
	"strings"
)

// What a file declares, as the walker finds it. Nothing here is resolved:
// struct bodies and expressions stay tokens until the model needs them.

type structDef struct {
	file     *file
	name     string
	line     int
	body     []token // between the braces
	template bool    // a template or a specialisation: no params struct
	base     bool    // has base classes
	doc      string
}

type constDef struct {
	file *file
	name string
	expr []token
	line int
}

// export is a value the Go side gets as a constant: an annotated constexpr,
// or the right side of an annotated static_assert(X == N, ...).
type export struct {
	file   *file
	goName string
	cxx    string // what the .cu calls it: kColsMaxS, FpropV2::kSmemBytes
	expr   []token
	line   int
	doc    string
}

type kernelDef struct {
	file      *file
	name      string
	paramType string // the struct's name, namespace qualifiers dropped
	bounds    [][]token
	line      int
	doc       string
}

type marker struct {
	file *file
	name string
	line int
}

type decls struct {
	structs []*structDef
	consts  map[string]*constDef
	kernels []*kernelDef
	exports []*export
	markers []*marker
	// annotations: the model consumes stheno:uint64 and then checks
	// that every annotation was used (unusedAnnotation).
	annotations []*annotation
}

// annotation is a stheno:<word> in a comment.
type annotation struct {
	c    *comment
	word string // const, uint64
	arg  string // const: the Go name
	used bool
}

var annotationRE = regexp.MustCompile(`stheno:([a-z0-9]+)`)

type scopeKind int

const (
	scopeNamespace scopeKind = iota // the global scope too
	scopeExternC
	scopeOther // function bodies, struct bodies, initialisers
)

type walker struct {
	f           *file
	d           *decls
	scopes      []scopeKind
	template    bool // a template<...> head precedes the current declaration
	annotations []*annotation
}

// walk reads f's declarations: structs, constexprs and static_asserts at
// namespace scope, extern "C" __global__ kernels (directly or through a
// macro), STHENO_PARAMS(S) markers and stheno: annotations.
func walk(f *file) (*decls, error) {
	w := &walker{f: f, d: &decls{consts: map[string]*constDef{}}}
	for i := range f.comments {
		c := &f.comments[i]
		for _, m := range annotationRE.FindAllStringSubmatchIndex(c.text, -1) {
			a := &annotation{c: c, word: c.text[m[2]:m[3]]}
			switch a.word {
			case "const":
				fields := strings.Fields(c.text[m[1]:])
				if len(fields) == 0 || !isGoIdent(fields[0]) {
					return nil, f.errorf(c.line, "stheno:const needs the Go name of the constant after it")
				}
				a.arg = fields[0]
			case "uint64":
			default:
				return nil, f.errorf(c.line, "unknown annotation stheno:%s (the generator knows stheno:const NAME and stheno:uint64)", a.word)
			}
			w.annotations = append(w.annotations, a)
		}
	}
	if err := w.run(); err != nil {
		return nil, err
	}
	w.d.annotations = w.annotations
	return w.d, nil
}

// unusedAnnotation reports the first annotation of d that annotates nothing.
func (d *decls) unusedAnnotation(f *file) error {
	for _, a := range d.annotations {
		if a.used {
			continue
		}
		if a.word == "const" {
			return f.errorf(a.c.line, "stheno:const %s annotates nothing: put it in the comment right above a namespace-scope constexpr or a static_assert(X == N, ...)", a.arg)
		}
		return f.errorf(a.c.line, "stheno:%s annotates nothing: it goes in the comment of a uint64_t field of a kernel's params struct", a.word)
	}
	return nil
}

func isGoIdent(s string) bool {
	if s == "" || !(s[0] >= 'A' && s[0] <= 'Z') {
		return false
	}
	for _, r := range s {
		if !isIdentRune(r) {
			return false
		}
	}
	return true
}

func (w *walker) scope() scopeKind {
	if len(w.scopes) == 0 {
		return scopeNamespace
	}
	return w.scopes[len(w.scopes)-1]
}

// commentBlock returns the whole-line comments of f directly above line,
// first to last.
func commentBlock(f *file, line int) []*comment {
	var block []*comment
	for l := line - 1; ; {
		c := f.commentAt[l]
		if c == nil {
			break
		}
		block = append([]*comment{c}, block...)
		l = c.line - 1
	}
	return block
}

func (w *walker) docAbove(line int, word string) (doc string, args []string) {
	return docAbove(w.f, w.annotations, line, word)
}

// docAbove returns the comment block above line as documentation, and
// consumes its annotations of word; where there is one, the documentation
// is what the block says after it (the text above describes something
// else, a kernel say, more often than the constant).
func docAbove(f *file, annotations []*annotation, line int, word string) (doc string, args []string) {
	var lines []string
	for _, c := range commentBlock(f, line) {
		for _, a := range annotations {
			if a.c == c && a.word == word {
				a.used = true
				args = append(args, a.arg)
			}
		}
		for _, l := range strings.Split(c.text, "\n") {
			l = strings.TrimPrefix(strings.TrimSpace(l), "* ")
			if m := annotationRE.FindStringSubmatch(l); m != nil && strings.HasPrefix(l, "stheno:") {
				if m[1] == word && word != "" {
					lines = nil
				}
				continue // the annotation's own line
			}
			lines = append(lines, l)
		}
	}
	return strings.TrimSpace(strings.Join(lines, "\n")), args
}

// matching returns the index of the token closing the bracket at toks[i].
func matching(toks []token, i int) int {
	open := toks[i].text
	close := map[string]string{"{": "}", "(": ")", "[": "]"}[open]
	depth := 0
	for j := i; j < len(toks); j++ {
		switch toks[j].text {
		case open:
			depth++
		case close:
			depth--
			if depth == 0 {
				return j
			}
		}
	}
	return -1
}

// skipAngles returns the index after the '>' closing the '<' at toks[i].
func skipAngles(toks []token, i int) int {
	depth := 0
	for j := i; j < len(toks); j++ {
		switch toks[j].text {
		case "<":
			depth++
		case ">":
			depth--
		case ">>":
			depth -= 2
		case "(", "[":
			if k := matching(toks, j); k > 0 {
				j = k
			}
		}
		if depth <= 0 {
			return j + 1
		}
	}
	return len(toks)
}

func (w *walker) run() error {
	toks := w.f.toks
	for i := 0; i < len(toks); {
		t := toks[i]
		ns := w.scope() == scopeNamespace || w.scope() == scopeExternC
		next := func(k int) string {
			if i+k < len(toks) {
				return toks[i+k].text
			}
			return ""
		}
		switch {
		case t.text == "{":
			w.scopes = append(w.scopes, scopeOther)
			w.template = false
			i++
		case t.text == "}":
			if len(w.scopes) == 0 {
				return w.f.errorf(t.line, "unbalanced }")
			}
			w.scopes = w.scopes[:len(w.scopes)-1]
			i++
		case t.text == ";":
			w.template = false
			i++
		case t.text == "namespace" && ns:
			j := i + 1
			for j < len(toks) && (toks[j].kind == tokIdent || toks[j].text == "::") {
				j++
			}
			if j < len(toks) && toks[j].text == "{" {
				w.scopes = append(w.scopes, scopeNamespace)
				i = j + 1
			} else {
				i = j
			}
		case t.text == "extern" && next(1) == `"C"`:
			switch next(2) {
			case "{":
				w.scopes = append(w.scopes, scopeExternC)
				i += 3
			case "__global__":
				j, err := w.kernel(toks, i+2, t.line)
				if err != nil {
					return err
				}
				i = j
			default:
				i += 2
			}
		case t.text == "template" && next(1) == "<":
			i = skipAngles(toks, i+1)
			w.template = true
		case t.text == "struct" && ns:
			j, err := w.structDecl(i)
			if err != nil {
				return err
			}
			i = j
		case t.text == "constexpr" && ns && !w.template:
			i = w.constexpr(i)
		case t.text == "static_assert" && next(1) == "(":
			j, err := w.staticAssert(i)
			if err != nil {
				return err
			}
			i = j
		case t.text == "__global__":
			if w.scope() != scopeExternC || w.template {
				return w.f.errorf(t.line, `__global__ function outside extern "C": every kernel is an extern "C" entry point taking one params struct by value`)
			}
			j, err := w.kernel(toks, i, t.line)
			if err != nil {
				return err
			}
			i = j
		case t.text == "STHENO_PARAMS" && next(1) == "(":
			end := matching(toks, i+1)
			if end != i+3 || toks[i+2].kind != tokIdent {
				return w.f.errorf(t.line, "STHENO_PARAMS takes one struct name")
			}
			w.d.markers = append(w.d.markers, &marker{file: w.f, name: toks[i+2].text, line: t.line})
			i = end + 1
		case t.kind == tokIdent && next(1) == "(" && w.f.macros[t.text] != nil && w.f.macros[t.text].definesKernel():
			m := w.f.macros[t.text]
			if w.scope() != scopeExternC {
				return w.f.errorf(t.line, `%s defines a kernel outside extern "C"`, m.name)
			}
			end := matching(toks, i+1)
			if end < 0 {
				return w.f.errorf(t.line, "unterminated %s(", m.name)
			}
			var args [][]token
			var arg []token
			depth := 0
			for _, a := range toks[i+2 : end] {
				switch a.text {
				case "(", "[", "{":
					depth++
				case ")", "]", "}":
					depth--
				}
				if a.text == "," && depth == 0 {
					args = append(args, arg)
					arg = nil
					continue
				}
				arg = append(arg, a)
			}
			args = append(args, arg)
			body, err := m.expand(args, t.line)
			if err != nil {
				return w.f.errorf(t.line, "%v", err)
			}
			g := -1
			for k, b := range body {
				if b.text == "__global__" {
					if g >= 0 {
						return w.f.errorf(t.line, "%s defines more than one kernel", m.name)
					}
					g = k
				}
			}
			if _, err := w.kernel(body, g, t.line); err != nil {
				return err
			}
			i = end + 1
		default:
			i++
		}
	}
	if len(w.scopes) != 0 {
		return w.f.errorf(toks[len(toks)-1].line, "unbalanced {")
	}
	return nil
}

// structDecl reads `struct [alignas(..)] Name [<...>] [: bases] { ... };`.
func (w *walker) structDecl(i int) (int, error) {
	toks := w.f.toks
	line := toks[i].line
	j := i + 1
	if j < len(toks) && toks[j].text == "alignas" && j+1 < len(toks) && toks[j+1].text == "(" {
		j = matching(toks, j+1) + 1
	}
	if j >= len(toks) || toks[j].kind != tokIdent {
		return i + 1, nil
	}
	s := &structDef{file: w.f, name: toks[j].text, line: line, template: w.template}
	j++
	if j < len(toks) && toks[j].text == "<" {
		j = skipAngles(toks, j)
		s.template = true
	}
	if j < len(toks) && toks[j].text == ":" && (j+1 >= len(toks) || toks[j+1].text != ":") {
		s.base = true
		for j < len(toks) && toks[j].text != "{" && toks[j].text != ";" {
			j++
		}
	}
	if j >= len(toks) || toks[j].text != "{" {
		return j, nil // a declaration, not a definition
	}
	end := matching(toks, j)
	if end < 0 {
		return 0, w.f.errorf(line, "struct %s: unbalanced {", s.name)
	}
	s.body = toks[j+1 : end]
	s.doc, _ = w.docAbove(line, "")
	w.d.structs = append(w.d.structs, s)
	w.template = false
	return end + 1, nil
}

// constexpr reads `constexpr T name = expr;` (functions are left to run).
func (w *walker) constexpr(i int) int {
	toks := w.f.toks
	j := i
	eq := -1
	for ; j < len(toks); j++ {
		switch toks[j].text {
		case "(", "{":
			if eq < 0 {
				return i + 1 // a function
			}
			if k := matching(toks, j); k > 0 {
				j = k
			}
		case "=":
			if eq < 0 {
				eq = j
			}
		}
		if toks[j].text == ";" {
			break
		}
	}
	if eq < 0 || eq == i+1 || j >= len(toks) {
		return i + 1
	}
	c := &constDef{file: w.f, name: toks[eq-1].text, expr: toks[eq+1 : j], line: toks[i].line}
	w.d.consts[c.name] = c
	if doc, names := w.docAbove(toks[i].line, "const"); len(names) > 0 {
		for _, n := range names {
			w.d.exports = append(w.d.exports, &export{file: w.f, goName: n, cxx: c.name, expr: c.expr, line: c.line, doc: doc})
		}
	}
	return j + 1
}

// staticAssert reads an annotated static_assert(X == N, "..."): N is the
// value exported.
func (w *walker) staticAssert(i int) (int, error) {
	toks := w.f.toks
	line := toks[i].line
	end := matching(toks, i+1)
	if end < 0 {
		return 0, w.f.errorf(line, "unbalanced static_assert(")
	}
	doc, names := w.docAbove(line, "const")
	if len(names) == 0 {
		return end + 1, nil
	}
	depth, eq, comma := 0, -1, -1
	for k := i + 2; k < end; k++ {
		switch toks[k].text {
		case "(", "[", "<":
			depth++
		case ")", "]", ">":
			depth--
		case "==":
			if depth == 0 && eq < 0 {
				eq = k
			}
		case "&&", "||":
			if depth == 0 && comma < 0 {
				return 0, w.f.errorf(line, "stheno:const %s: the static_assert must be one comparison X == N, not a conjunction", names[0])
			}
		case ",":
			if depth == 0 && comma < 0 {
				comma = k
			}
		}
	}
	if eq < 0 || (comma >= 0 && eq > comma) {
		return 0, w.f.errorf(line, "stheno:const %s: the static_assert must compare X == N", names[0])
	}
	if comma < 0 {
		comma = end
	}
	var cxx strings.Builder
	for _, t := range toks[i+2 : eq] {
		cxx.WriteString(t.text)
		if t.text == "," {
			cxx.WriteString(" ")
		}
	}
	for _, n := range names {
		w.d.exports = append(w.d.exports, &export{file: w.f, goName: n, cxx: cxx.String(), expr: toks[eq+1 : comma], line: line, doc: doc})
	}
	return end + 1, nil
}

// kernel reads `__global__ void [__launch_bounds__(...)] name(Params p)`
// from toks[g]; line is where messages point (a macro's invocation). It
// returns the index after the declaration's body (or ;).
func (w *walker) kernel(toks []token, g, line int) (int, error) {
	k := &kernelDef{file: w.f, line: line}
	j := g + 1
	void := false
	for j < len(toks) {
		switch toks[j].text {
		case "void":
			void = true
			j++
			continue
		case "__launch_bounds__":
			if j+1 >= len(toks) || toks[j+1].text != "(" {
				return 0, w.f.errorf(line, "__launch_bounds__ without (")
			}
			end := matching(toks, j+1)
			var arg []token
			for _, t := range toks[j+2 : end] {
				if t.text == "," {
					k.bounds = append(k.bounds, arg)
					arg = nil
					continue
				}
				arg = append(arg, t)
			}
			k.bounds = append(k.bounds, arg)
			j = end + 1
			continue
		}
		break
	}
	if j >= len(toks) || toks[j].kind != tokIdent {
		return 0, w.f.errorf(line, "cannot read the kernel's name after __global__")
	}
	k.name = toks[j].text
	if !void {
		return 0, w.f.errorf(line, "kernel %s: a kernel returns void", k.name)
	}
	if j+1 >= len(toks) || toks[j+1].text != "(" {
		return 0, w.f.errorf(line, "kernel %s: no parameter list", k.name)
	}
	end := matching(toks, j+1)
	if end < 0 {
		return 0, w.f.errorf(line, "kernel %s: unbalanced (", k.name)
	}
	params := toks[j+2 : end]
	var spelled []string
	for _, t := range params {
		spelled = append(spelled, t.text)
	}
	bad := func() error {
		return w.f.errorf(line, "kernel %s takes (%s): a kernel takes one params struct by value, like (MyParams p)", k.name, strings.Join(spelled, " "))
	}
	if len(params) > 0 && params[0].text == "const" {
		params = params[1:]
	}
	// [ns::]*Type [name]
	p := 0
	for p+1 < len(params) && params[p].kind == tokIdent && params[p+1].text == "::" {
		p += 2
	}
	if p >= len(params) || params[p].kind != tokIdent {
		return 0, bad()
	}
	k.paramType = params[p].text
	switch rest := params[p+1:]; {
	case len(rest) == 0:
	case len(rest) == 1 && rest[0].kind == tokIdent:
	default:
		return 0, bad()
	}
	switch k.paramType {
	case "void", "int", "unsigned", "float", "double", "bool", "char", "long", "short":
		return 0, bad()
	}
	k.doc, _ = w.docAbove(line, "")
	w.d.kernels = append(w.d.kernels, k)
	j = end + 1
	if j < len(toks) && toks[j].text == "{" {
		if e := matching(toks, j); e > 0 {
			return e + 1, nil
		}
	}
	return j, nil
}
