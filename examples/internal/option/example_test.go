package option_test

import (
	"fmt"

	"github.com/stheno-ml/stheno/examples/internal/option"
)

// A command checks every option, then reports all the problems at once.
func ExampleChecks() {
	lr, warmup, steps := -1.0, 100, []float64{0.9, 0.5}
	var c option.Checks
	c.Check(option.Finite(lr) && lr > 0 && lr <= 1, "lr", lr, "must be a number in (0, 1]")
	c.Check(warmup >= 0, "warmup", warmup, "must be at least 0")
	c.Check(option.IncreasingFractions(steps), "steps", option.FormatList(steps), "must be increasing fractions of -iters in (0, 1)")
	fmt.Println(c.Err())
	// Output:
	// -lr -1: must be a number in (0, 1]
	// -steps 0.9,0.5: must be increasing fractions of -iters in (0, 1)
}
