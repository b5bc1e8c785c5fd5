package option

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"strings"
)

// Error is a value outside what an option allows. Option is the option's
// command-line name (its flag without the dash).
type Error struct {
	Option  string
	Value   any
	Allowed string
}

func (e *Error) Error() string {
	return fmt.Sprintf("-%s %v: %s", e.Option, e.Value, e.Allowed)
}

// Checks collects the options that fail their checks, so that a command
// line with several mistakes has them all reported at once rather than one
// per attempt. The zero value is ready to use.
type Checks struct {
	errs []error
}

// Check records an *Error for option unless ok: value is what was given,
// allowed (formatted with args) says what the option takes.
func (c *Checks) Check(ok bool, option string, value any, allowed string, args ...any) {
	if !ok {
		c.errs = append(c.errs, &Error{Option: option, Value: value, Allowed: fmt.Sprintf(allowed, args...)})
	}
}

// Err is errors.Join of the recorded *Errors, one per line, or nil.
func (c *Checks) Err() error { return errors.Join(c.errs...) }

// Finite reports whether v is a number other than ±Inf. Range checks on
// floats start with it: NaN fails every comparison, so a check written as
// "v < lo || v > hi means bad" would let NaN through.
func Finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// IncreasingFractions reports whether s increases strictly inside (0, 1),
// as the fractions of a run where the learning rate steps down must. An
// empty s does; NaN does not.
func IncreasingFractions(s []float64) bool {
	for i, f := range s {
		if !(f > 0 && f < 1) || (i > 0 && !(f > s[i-1])) {
			return false
		}
	}
	return true
}

// FormatList writes s as a comma-separated flag value, "0.75,0.9".
func FormatList(s []float64) string {
	parts := make([]string, len(s))
	for i, f := range s {
		parts[i] = fmt.Sprint(f)
	}
	return strings.Join(parts, ",")
}

// AbsPath is p made absolute, or p itself if that fails. A checkpoint
// names its data by absolute path, so that the run resumes from any
// working directory, and compares paths that way.
func AbsPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// Changes lists the options that a resumed run gives with other values
// than its checkpoint's, one line each.
type Changes []string

// Compare adds "-option: the checkpoint's is SAVED, given GIVEN" when the
// two values print differently.
func (c *Changes) Compare(option string, given, saved any) {
	if fmt.Sprint(given) != fmt.Sprint(saved) {
		*c = append(*c, fmt.Sprintf("-%s: the checkpoint's is %v, given %v", option, saved, given))
	}
}
