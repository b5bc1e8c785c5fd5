package train

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progress shows training on one line that rewrites itself (on a
// terminal), or as a line every few seconds (in a log file).
type progress struct {
	w        io.Writer
	terminal bool
	total    int
	last     time.Time
	every    time.Duration
	width    int // of the line last drawn, to blank its tail
}

func newProgress(w io.Writer, total int) *progress {
	p := &progress{w: w, total: total, every: 10 * time.Second}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.terminal, p.every = true, 200*time.Millisecond
		}
	}
	return p
}

// update draws iteration it's line, rate-limited unless force.
func (p *progress) update(it int, line string, force bool) {
	now := time.Now()
	if !force && now.Sub(p.last) < p.every {
		return
	}
	p.last = now
	const barWidth = 20
	done := barWidth * it / max(p.total, 1)
	bar := strings.Repeat("#", done) + strings.Repeat("-", barWidth-done)
	text := fmt.Sprintf("%*d/%d [%s] %s", len(fmt.Sprint(p.total)), it, p.total, bar, line)
	if !p.terminal {
		fmt.Fprintln(p.w, text)
		return
	}
	pad := max(0, p.width-len(text))
	p.width = len(text)
	fmt.Fprintf(p.w, "\r%s%s", text, strings.Repeat(" ", pad))
}

// println prints a line of its own, below the progress line.
func (p *progress) println(format string, args ...any) {
	if p.terminal && p.width > 0 {
		fmt.Fprint(p.w, "\r"+strings.Repeat(" ", p.width)+"\r")
		p.width = 0
		p.last = time.Time{} // redraw the bar at the next update
	}
	fmt.Fprintf(p.w, format+"\n", args...)
}

// done ends the progress line.
func (p *progress) done() {
	if p.terminal && p.width > 0 {
		fmt.Fprintln(p.w)
		p.width = 0
	}
}

// eta formats a remaining duration.
func eta(d time.Duration) string {
	if d < 0 || d > 100*time.Hour {
		return "?"
	}
	d = d.Round(time.Second)
	if d >= time.Hour {
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
}
