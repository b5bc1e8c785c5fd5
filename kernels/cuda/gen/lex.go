package main

import (
	"bytes"
	"fmt"
	"strings"
)

// The lexer reads just enough C++ for the kernels' declarations: comments
// (kept, for documentation and annotations), preprocessor directives
// (#include "x" and function-like #defines, the rest dropped) and tokens.
// Conditional directives are ignored: the generator sees every branch.

type tokKind int

const (
	tokIdent tokKind = iota
	tokNumber
	tokString
	tokPunct
)

type token struct {
	kind tokKind
	text string
	line int
}

// comment is a // or /* */ comment.
type comment struct {
	line, endLine int
	text          string
	trailing      bool // code comes before it on its first line
}

// macro is a function-like #define.
type macro struct {
	name   string
	params []string
	body   []token
	line   int
}

// file is one lexed source file.
type file struct {
	path     string // as messages name it: kernels/roialign.cu
	name     string // base name: roialign.cu
	toks     []token
	comments []comment
	macros   map[string]*macro
	includes []string // quoted #includes, as written
	// variants are the line ranges inside #if STHENO_KERNEL_VARIANTS:
	// kernels that only experiments build (make kernels VARIANTS=1).
	variants [][2]int
	conds    []cond // the open conditionals, innermost last

	commentAt  map[int]*comment   // whole-line comments, by each line they cover
	trailingAt map[int][]*comment // comments after code, by line
}

func (f *file) errorf(line int, format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s", f.path, line, fmt.Sprintf(format, args...))
}

func lexFile(path, name string, src []byte) (*file, error) {
	f := &file{path: path, name: name, macros: map[string]*macro{}}
	code, err := f.stripComments(src)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(code), "\n")
	for i := 0; i < len(lines); i++ {
		if !strings.HasPrefix(strings.TrimSpace(lines[i]), "#") {
			continue
		}
		first := i
		text := lines[i]
		lines[i] = ""
		for strings.HasSuffix(strings.TrimRight(text, " \t\r"), "\\") && i+1 < len(lines) {
			text = strings.TrimSuffix(strings.TrimRight(text, " \t\r"), "\\") + " "
			i++
			text += lines[i]
			lines[i] = ""
		}
		if err := f.directive(first+1, strings.TrimSpace(text)[1:]); err != nil {
			return nil, err
		}
	}
	if n := len(f.conds); n > 0 {
		return nil, f.errorf(f.conds[n-1].line, "#if without #endif")
	}
	for i, l := range lines {
		toks, err := f.tokenize(l, i+1)
		if err != nil {
			return nil, err
		}
		f.toks = append(f.toks, toks...)
	}
	f.commentAt, f.trailingAt = map[int]*comment{}, map[int][]*comment{}
	for i := range f.comments {
		c := &f.comments[i]
		if c.trailing {
			f.trailingAt[c.line] = append(f.trailingAt[c.line], c)
			continue
		}
		for l := c.line; l <= c.endLine; l++ {
			f.commentAt[l] = c
		}
	}
	return f, nil
}

// stripComments returns src with its comments blanked (newlines kept) and
// records them.
func (f *file) stripComments(src []byte) ([]byte, error) {
	code := bytes.Clone(src)
	line, lineHasCode := 1, false
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == '\n':
			line++
			lineHasCode = false
			i++
		case c == '/' && i+1 < len(src) && src[i+1] == '/':
			j := i
			for j < len(src) && src[j] != '\n' {
				code[j] = ' '
				j++
			}
			f.comments = append(f.comments, comment{line: line, endLine: line, text: string(src[i+2 : j]), trailing: lineHasCode})
			i = j
		case c == '/' && i+1 < len(src) && src[i+1] == '*':
			end := bytes.Index(src[i+2:], []byte("*/"))
			if end < 0 {
				return nil, f.errorf(line, "unterminated /* comment")
			}
			end += i + 4
			start := line
			for k := i; k < end; k++ {
				if src[k] == '\n' {
					line++
				} else {
					code[k] = ' '
				}
			}
			f.comments = append(f.comments, comment{line: start, endLine: line, text: string(src[i+2 : end-2]), trailing: lineHasCode})
			i = end
		case c == '"' || c == '\'':
			j := i + 1
			for j < len(src) && src[j] != c {
				if src[j] == '\\' {
					j++
				}
				if j < len(src) && src[j] == '\n' {
					return nil, f.errorf(line, "unterminated literal")
				}
				j++
			}
			i = j + 1
			lineHasCode = true
		default:
			if c != ' ' && c != '\t' && c != '\r' {
				lineHasCode = true
			}
			i++
		}
	}
	return code, nil
}

// variantsMacro guards the kernels left out of the shipped modules.
const variantsMacro = "STHENO_KERNEL_VARIANTS"

// cond is an open #if, #ifdef or #ifndef.
type cond struct {
	line    int
	variant bool // #if STHENO_KERNEL_VARIANTS
}

// inVariants reports whether line lies inside #if STHENO_KERNEL_VARIANTS.
func (f *file) inVariants(line int) bool {
	for _, r := range f.variants {
		if line > r[0] && line < r[1] {
			return true
		}
	}
	return false
}

// directive records #include "x", function-like #defines and the regions
// of #if STHENO_KERNEL_VARIANTS (whose other branches it refuses: a kernel
// is a variant or not, whatever the build).
func (f *file) directive(line int, d string) error {
	d = strings.TrimSpace(d)
	word, rest := d, ""
	if i := strings.IndexAny(d, " \t<\"("); i >= 0 {
		word, rest = d[:i], strings.TrimSpace(d[i:])
	}
	switch word {
	case "if", "ifdef", "ifndef":
		f.conds = append(f.conds, cond{line: line, variant: word == "if" && rest == variantsMacro})
		if !f.conds[len(f.conds)-1].variant && strings.Contains(rest, variantsMacro) {
			return f.errorf(line, "#%s %s: write the variants' guard as #if %s", word, rest, variantsMacro)
		}
	case "elif", "else":
		if n := len(f.conds); n > 0 && f.conds[n-1].variant {
			return f.errorf(line, "#%s in #if %s (line %d): the guard takes no other branch", word, variantsMacro, f.conds[n-1].line)
		}
	case "endif":
		n := len(f.conds)
		if n == 0 {
			return f.errorf(line, "#endif without #if")
		}
		if c := f.conds[n-1]; c.variant {
			f.variants = append(f.variants, [2]int{c.line, line})
		}
		f.conds = f.conds[:n-1]
	case "include":
		if strings.HasPrefix(rest, `"`) {
			if end := strings.Index(rest[1:], `"`); end >= 0 {
				f.includes = append(f.includes, rest[1:1+end])
			}
		}
	case "define":
		i := strings.IndexFunc(rest, func(r rune) bool { return !isIdentRune(r) })
		if i < 0 || rest[i] != '(' {
			return nil // object-like: nothing the generator reads
		}
		name := rest[:i]
		end := strings.Index(rest, ")")
		if end < 0 {
			return f.errorf(line, "#define %s: unterminated parameter list", name)
		}
		m := &macro{name: name, line: line}
		for _, p := range strings.Split(rest[i+1:end], ",") {
			if p = strings.TrimSpace(p); p != "" {
				m.params = append(m.params, p)
			}
		}
		body, err := f.tokenize(rest[end+1:], line)
		if err != nil {
			return err
		}
		m.body = body
		f.macros[name] = m
	}
	return nil
}

func isIdentRune(r rune) bool {
	return r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9'
}

var puncts = []string{"::", "<<", ">>", "==", "!=", "<=", ">=", "&&", "||", "->", "##", "..."}

func (f *file) tokenize(s string, line int) ([]token, error) {
	var toks []token
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\r' || c == '\n':
			i++
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := i
			for j < len(s) && isIdentRune(rune(s[j])) {
				j++
			}
			toks = append(toks, token{tokIdent, s[i:j], line})
			i = j
		case c >= '0' && c <= '9':
			j := i
			for j < len(s) && (isIdentRune(rune(s[j])) || s[j] == '.') {
				j++
			}
			toks = append(toks, token{tokNumber, s[i:j], line})
			i = j
		case c == '"' || c == '\'':
			j := i + 1
			for j < len(s) && s[j] != c {
				if s[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(s) {
				return nil, f.errorf(line, "unterminated literal")
			}
			toks = append(toks, token{tokString, s[i : j+1], line})
			i = j + 1
		default:
			p := s[i : i+1]
			for _, q := range puncts {
				if strings.HasPrefix(s[i:], q) {
					p = q
					break
				}
			}
			toks = append(toks, token{tokPunct, p, line})
			i += len(p)
		}
	}
	return toks, nil
}

// expand substitutes args for m's parameters in its body; the tokens take
// line, the invocation's.
func (m *macro) expand(args [][]token, line int) ([]token, error) {
	if len(args) != len(m.params) {
		return nil, fmt.Errorf("macro %s takes %d arguments, given %d", m.name, len(m.params), len(args))
	}
	var out []token
	for _, t := range m.body {
		if t.text == "#" || t.text == "##" || t.text == "..." {
			return nil, fmt.Errorf("macro %s uses %s, which the generator does not expand", m.name, t.text)
		}
		if t.kind == tokIdent {
			if k := indexOf(m.params, t.text); k >= 0 {
				for _, a := range args[k] {
					a.line = line
					out = append(out, a)
				}
				continue
			}
		}
		t.line = line
		out = append(out, t)
	}
	return out, nil
}

func indexOf(s []string, x string) int {
	for i, v := range s {
		if v == x {
			return i
		}
	}
	return -1
}

func (m *macro) definesKernel() bool {
	for _, t := range m.body {
		if t.text == "__global__" {
			return true
		}
	}
	return false
}
