package progress

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// screen is what a terminal shows after out: '\r' goes back to the start of
// the line, '\n' to the next line, and other characters overwrite what is
// under the cursor. Trailing blanks are trimmed, and a last empty line is
// dropped.
func screen(out string) []string {
	lines := [][]rune{nil}
	col := 0
	for _, r := range out {
		row := &lines[len(lines)-1]
		switch r {
		case '\r':
			col = 0
		case '\n':
			lines = append(lines, nil)
			col = 0
		default:
			for len(*row) <= col {
				*row = append(*row, ' ')
			}
			(*row)[col] = r
			col++
		}
	}
	var s []string
	for _, l := range lines {
		s = append(s, strings.TrimRight(string(l), " "))
	}
	if s[len(s)-1] == "" {
		s = s[:len(s)-1]
	}
	return s
}

// A step of a progress test: an update (line != "" or force), a println
// (print != ""), or done.
type step struct {
	it    int
	line  string
	force bool
	print string
	done  bool
}

func run(p *Progress, steps []step) {
	for _, s := range steps {
		switch {
		case s.print != "":
			p.Println("%s", s.print)
		case s.done:
			p.Done()
		default:
			p.Update(s.it, s.line, s.force)
		}
	}
}

func TestProgressPlain(t *testing.T) {
	for _, tc := range []struct {
		name  string
		total int
		steps []step
		want  []string
	}{
		{"rate-limited", 10, []step{
			{it: 1, line: "loss 1"}, // the first update always shows
			{it: 2, line: "loss 0.9"},
			{it: 5, line: "loss 0.5", force: true},
			{print: "iteration 5: AP 0.1"},
			{it: 6, line: "loss 0.4"},
			{it: 10, line: "loss 0.2", force: true},
			{done: true},
		}, []string{
			" 1/10 [##------------------] loss 1",
			" 5/10 [##########----------] loss 0.5",
			"iteration 5: AP 0.1",
			"10/10 [####################] loss 0.2",
		}},
		{"resumed", 3200, []step{
			{it: 1601, line: "a"}, {it: 3200, line: "b", force: true}, {print: "x"}, {done: true},
		}, []string{
			"1601/3200 [##########----------] a",
			"3200/3200 [####################] b",
			"x",
		}},
		{"no iterations", 0, []step{{print: "nothing to train"}, {done: true}}, []string{"nothing to train"}},
	} {
		var buf bytes.Buffer
		p := New(&buf, tc.total) // not an *os.File: plain
		run(p, tc.steps)
		got := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
		if strings.ContainsRune(buf.String(), '\r') || strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
			t.Errorf("%s: wrote\n%q\nwant\n%q", tc.name, buf.String(), strings.Join(tc.want, "\n")+"\n")
		}
	}
}

func TestProgressTerminal(t *testing.T) {
	long := fmt.Sprintf("loss %.3f (rpn %.3f/%.3f cls %.3f box %.3f mask %.3f) lr %.1e %.1f img/s ETA %s",
		0.812, 0.051, 0.032, 0.21, 0.18, 0.339, 1e-3, 31.2, ETA(232*time.Second))
	for _, tc := range []struct {
		name  string
		total int
		cols  int
		steps []step
		// want: each line of the screen at the end, as a prefix and a
		// suffix that it must have.
		want [][2]string
	}{
		{"run", 10, 0, []step{
			{it: 1, line: "loss 1"},
			{it: 2, line: "loss 0.9"},
			{it: 5, line: "loss 0.5", force: true},
			{print: "iteration 5: AP 0.1"},
			{it: 6, line: "loss 0.4"},
			{it: 10, line: "loss 0.2", force: true},
			{print: "iteration 10: AP 0.3"},
			{done: true},
		}, [][2]string{
			{"iteration 5: AP 0.1", ""},
			{" 100% |####################| (10/10) loss 0.2", ""},
			{"iteration 10: AP 0.3", ""},
		}},
		{"resumed", 3200, 0, []step{{it: 1601, line: "a"}, {done: true}}, [][2]string{
			{"  50% |##########          | (1601/3200) a", ""},
		}},
		{"interrupted", 10, 0, []step{{it: 3, line: "loss 1"}, {done: true}, {print: "interrupted"}}, [][2]string{
			{"  30% |######              | (3/10) loss 1", ""},
			{"interrupted", ""},
		}},
		// The middle of a line too long for the terminal is cut out.
		{"narrow terminal", 3200, 80, []step{{it: 8, line: long}, {done: true}}, [][2]string{
			{"   0% |                    | (8/3200) loss 0.812 (", "31.2 img/s ETA 3m52s"},
		}},
		{"wide terminal", 3200, 200, []step{{it: 8, line: long}, {done: true}}, [][2]string{
			{"   0% |                    | (8/3200) " + long, ""},
		}},
	} {
		var buf bytes.Buffer
		p := newMode(&buf, tc.total, true, func() int { return tc.cols })
		run(p, tc.steps)
		got := screen(buf.String())
		if !strings.HasSuffix(buf.String(), "\n") {
			t.Errorf("%s: the output does not end its last line: %q", tc.name, buf.String())
		}
		if len(got) != len(tc.want) {
			t.Errorf("%s: screen\n%s\nwant %d lines (raw output %q)", tc.name, strings.Join(got, "\n"), len(tc.want), buf.String())
			continue
		}
		for i, w := range tc.want {
			if !strings.HasPrefix(got[i], w[0]) || !strings.HasSuffix(got[i], w[1]) {
				t.Errorf("%s: screen line %d is %q, want %q...%q", tc.name, i, got[i], w[0], w[1])
			}
			if tc.cols > 0 && utf8.RuneCountInString(got[i]) >= tc.cols {
				t.Errorf("%s: screen line %d is %d wide, on a terminal of %d", tc.name, i, utf8.RuneCountInString(got[i]), tc.cols)
			}
		}
	}
}

func TestETA(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "?"}, {0, "0m00s"}, {59*time.Second + 600*time.Millisecond, "1m00s"},
		{3*time.Hour + 5*time.Minute, "3h05m"}, {101 * time.Hour, "?"},
	} {
		if got := ETA(tc.d); got != tc.want {
			t.Errorf("ETA(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}
