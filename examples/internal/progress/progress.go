package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// Progress shows training. On a terminal it is a bar of
// github.com/schollz/progressbar that redraws itself in place (at most
// every 200 ms):
//
//	42% |########            | (1344/3200) loss 0.812 (...) 31.2 img/s ETA 3m52s
//
// the percentage, the iterations done (counted from the start of the run,
// so a resumed run's bar starts where it left off) and, as the description,
// the caller's line as given, its middle cut out if the terminal is too
// narrow for all of it. The bar adds no rate or ETA of its own, so that
// neither shows twice: the caller's line has both, measured over training
// steps alone, where the bar's rolling average would count the pauses for
// evaluations and, in a resumed run, the jump to the first iteration.
//
// Anywhere else (a log file, a pipe) it writes a plain line every 10 s and
// at every forced update.
type Progress struct {
	w     io.Writer
	total int
	last  time.Time
	every time.Duration

	bar   *progressbar.ProgressBar // nil unless on a terminal
	cols  func() int               // the terminal's width, 0 if unknown
	drawn bool                     // the bar is on the screen, unfinished
}

// barWidth is the bar's width in characters, in both modes.
const barWidth = 20

// New returns a Progress of total iterations writing to w: a bar when w is
// a terminal, plain lines otherwise.
func New(w io.Writer, total int) *Progress {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return newMode(w, total, false, nil)
	}
	cols := func() int {
		c, _, err := term.GetSize(int(f.Fd()))
		if err != nil {
			return 0
		}
		return c
	}
	return newMode(w, total, true, cols)
}

// newMode is New with the terminal test done: the tests draw the bar into
// a buffer. cols may be nil.
func newMode(w io.Writer, total int, terminal bool, cols func() int) *Progress {
	p := &Progress{w: w, total: total, every: 10 * time.Second, cols: cols}
	if !terminal || total <= 0 { // progressbar refuses a bar of 0 steps
		return p
	}
	if p.cols == nil {
		p.cols = func() int { return 0 }
	}
	p.every = 200 * time.Millisecond
	p.bar = progressbar.NewOptions(total,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetWidth(barWidth),
		progressbar.OptionSetTheme(progressbar.Theme{Saucer: "#", SaucerPadding: " ", BarStart: "|", BarEnd: "|"}),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionShowDescriptionAtLineEnd(),
		// The finished bar stays on the screen, and what follows starts on
		// a line of its own.
		progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
	)
	return p
}

// Update shows iteration it (counted from the start of the run, so a
// resumed run's bar starts where it left off) and line, at most every
// p.every unless force.
func (p *Progress) Update(it int, line string, force bool) {
	now := time.Now()
	if !force && now.Sub(p.last) < p.every {
		return
	}
	p.last = now
	if p.bar == nil {
		done := barWidth * min(max(it, 0), p.total) / max(p.total, 1)
		bar := strings.Repeat("#", done) + strings.Repeat("-", barWidth-done)
		fmt.Fprintf(p.w, "%*d/%d [%s] %s\n", len(fmt.Sprint(p.total)), it, p.total, bar, line)
		return
	}
	if p.bar.IsFinished() {
		return
	}
	// Describe first: Set to the end finishes the bar, and a finished bar
	// would be drawn again, below itself, by Describe.
	p.bar.Describe(p.fit(line))
	_ = p.bar.Set(min(it, p.total)) // only errors for a bar of 0 steps
	p.drawn = !p.bar.IsFinished()
}

// fit cuts the middle out of line so that the bar's whole line fits the
// terminal, keeping its start and its end (the caller's line starts with the
// total loss and ends with the rate and ETA). A line longer than the
// terminal would wrap, \r would no longer go back to its start, and every
// redraw would add a line.
func (p *Progress) fit(line string) string {
	cols := p.cols()
	if cols <= 0 {
		return line
	}
	// What the bar puts before the description, at its widest.
	head := len(fmt.Sprintf("%4d%% |%s| (%d/%d) ", 100, strings.Repeat(" ", barWidth), p.total, p.total))
	room := cols - 1 - head - 1 // the bar ends in a space; keep off the last column
	r := []rune(line)
	if len(r) <= room {
		return line
	}
	if room < 3 {
		return ""
	}
	keep := room - 1 // and an ellipsis
	return string(r[:keep*2/5]) + "…" + string(r[len(r)-(keep-keep*2/5):])
}

// Println prints a line of its own: on a terminal it takes the bar's place,
// and the bar comes back below it at the next update.
func (p *Progress) Println(format string, args ...any) {
	if p.drawn {
		_ = p.bar.Clear()
		p.drawn = false
		p.last = time.Time{}
	}
	fmt.Fprintf(p.w, format+"\n", args...)
}

// Done ends the bar's line if the run stopped before its last iteration
// (the last one ends it itself).
func (p *Progress) Done() {
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

// ETA formats a remaining duration for a progress line: "3m52s", "2h05m"
// from an hour on, and "?" when it is negative or over 100 hours.
func ETA(d time.Duration) string {
	if d < 0 || d > 100*time.Hour {
		return "?"
	}
	d = d.Round(time.Second)
	if d >= time.Hour {
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
}
