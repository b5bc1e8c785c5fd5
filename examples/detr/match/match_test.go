package match_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stheno-ml/stheno/autograd"
	"github.com/stheno-ml/stheno/examples/detr/match"
)

// checkMatching fails the test unless assign is a matching of
// min(rows, cols) pairs of the rows x cols matrix, and returns its cost,
// summed over the rows in order.
func checkMatching(t *testing.T, name string, cost []float64, rows, cols int, assign []int) float64 {
	t.Helper()
	if len(assign) != rows {
		t.Fatalf("%s: got %d entries, want one per row (%d)", name, len(assign), rows)
	}
	used := make([]bool, cols)
	matched, total := 0, 0.0
	for i, j := range assign {
		if j == -1 {
			continue
		}
		if j < 0 || j >= cols {
			t.Fatalf("%s: row %d matched to column %d, outside [0,%d)", name, i, j, cols)
		}
		if used[j] {
			t.Fatalf("%s: column %d matched twice (%v)", name, j, assign)
		}
		used[j] = true
		matched++
		total += cost[i*cols+j]
	}
	if want := min(rows, cols); matched != want {
		t.Fatalf("%s: %d pairs matched, want min(rows, cols) = %d (%v)", name, matched, want, assign)
	}
	return total
}

// bruteForce returns the least cost of a matching of min(rows, cols) pairs
// that avoids the +Inf costs, summed over the rows in order like
// checkMatching, trying every one; ok is false when none avoids them.
func bruteForce(cost []float64, rows, cols int) (best float64, ok bool) {
	want := min(rows, cols)
	used := make([]bool, cols)
	pick := make([]int, rows)
	best = math.Inf(1)
	var try func(i, matched int)
	try = func(i, matched int) {
		if matched+(rows-i) < want {
			return
		}
		if i == rows {
			total := 0.0
			for r, j := range pick {
				if j >= 0 {
					total += cost[r*cols+j]
				}
			}
			if total < best {
				best, ok = total, true
			}
			return
		}
		pick[i] = -1
		try(i+1, matched)
		for j := range cols {
			if !used[j] && matched < want {
				used[j], pick[i] = true, j
				try(i+1, matched+1)
				used[j] = false
			}
		}
	}
	try(0, 0)
	return best, ok
}

// TestAssignBruteForce checks Assign against every matching of small
// matrices: uniform costs (a unique optimum, almost surely), integer costs
// from {0, 1, 2} (many optima tie, so only the total is compared) and
// matrices with forbidden (+Inf) pairs, some of which have no complete
// matching.
func TestAssignBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 1))
	kinds := []struct {
		name string
		draw func() float64
	}{
		{"uniform", func() float64 { return 2*rng.Float64() - 1 }},
		{"ties", func() float64 { return float64(rng.IntN(3)) }},
		{"forbidden", func() float64 {
			if rng.IntN(10) < 3 {
				return math.Inf(1)
			}
			return float64(rng.IntN(5))
		}},
	}
	infeasible := 0
	for rows := 1; rows <= 6; rows++ {
		for cols := 1; cols <= 6; cols++ {
			for _, kind := range kinds {
				for trial := range 25 {
					name := fmt.Sprintf("%dx%d/%s/%d", rows, cols, kind.name, trial)
					cost := make([]float64, rows*cols)
					for k := range cost {
						cost[k] = kind.draw()
					}
					want, feasible := bruteForce(cost, rows, cols)
					assign, err := match.Assign(cost, rows, cols)
					if !feasible {
						infeasible++
						if !errors.Is(err, match.ErrInfeasible) {
							t.Fatalf("%s: cost %v has no matching without +Inf, got %v, %v", name, cost, assign, err)
						}
						continue
					}
					if err != nil {
						t.Fatalf("%s: cost %v: %v", name, cost, err)
					}
					got := checkMatching(t, name, cost, rows, cols, assign)
					// Both are sums of the same costs in row order, so a
					// different optimum than the brute force's differs from
					// its total only by rounding.
					if err := autograd.TolForward64.Compare([]float64{got}, []float64{want}); err != nil {
						t.Fatalf("%s: cost %v: Assign gave %v of total %v, the best total is %v", name, cost, assign, got, want)
					}
				}
			}
		}
	}
	if infeasible == 0 {
		t.Fatal("no infeasible matrix was drawn: the test of ErrInfeasible did not run")
	}
}

func TestAssignHand(t *testing.T) {
	inf := math.Inf(1)
	cases := []struct {
		name       string
		cost       []float64
		rows, cols int
		want       []int
	}{
		{"1x1", []float64{5}, 1, 1, []int{0}},
		{"no rows", nil, 0, 3, []int{}},
		{"no columns (an image without targets)", nil, 3, 0, []int{-1, -1, -1}},
		// Row 0 alone would take column 0; the optimum gives it up to row 1.
		{"augmenting path", []float64{
			1, 2,
			1, 10,
		}, 2, 2, []int{1, 0}},
		// Products (i+1)(j+1): the rearrangement inequality pairs them in
		// opposite order.
		{"rearrangement", []float64{
			1, 2, 3,
			2, 4, 6,
			3, 6, 9,
		}, 3, 3, []int{2, 1, 0}},
		{"more queries than targets", []float64{
			0.9, 0.1,
			0.2, 0.8,
			0.5, 0.5,
		}, 3, 2, []int{1, 0, -1}},
		{"more targets than queries", []float64{
			4, 1, 3,
			2, 0, 5,
		}, 2, 3, []int{1, 0}},
		{"negative costs", []float64{
			-5, 0,
			0, -5,
		}, 2, 2, []int{0, 1}},
		{"costs of MaxCost", []float64{
			match.MaxCost, -match.MaxCost,
			-match.MaxCost, match.MaxCost,
		}, 2, 2, []int{1, 0}},
		// The diagonal is forbidden and cheapest elsewhere.
		{"forbidden diagonal", []float64{
			inf, 1, 2,
			2, inf, 1,
			1, 2, inf,
		}, 3, 3, []int{1, 2, 0}},
		// Only row 2 may take column 0, though row 0 is cheaper on it.
		{"forbidden, tall", []float64{
			inf, 0,
			inf, 1,
			9, 5,
		}, 3, 2, []int{1, -1, 0}},
	}
	for _, c := range cases {
		got, err := match.Assign(c.cost, c.rows, c.cols)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
}

func TestAssignFloat32(t *testing.T) {
	got, err := match.Assign([]float32{
		1, 2,
		1, 10,
	}, 2, 2)
	if err != nil || !slices.Equal(got, []int{1, 0}) {
		t.Fatalf("got %v, %v, want [1 0], nil", got, err)
	}
}

func TestAssignErrors(t *testing.T) {
	inf := math.Inf(1)
	cases := []struct {
		name       string
		cost       []float64
		rows, cols int
		want       string // a part of the error's text
		infeasible bool
	}{
		{"negative rows", nil, -1, 2, "sizes must not be negative, got rows -1, cols 2", false},
		{"negative cols", nil, 2, -3, "sizes must not be negative, got rows 2, cols -3", false},
		{"too few costs", []float64{1, 2, 3}, 2, 2, "cost has 3 elements, want rows*cols = 2*2 = 4", false},
		{"too many costs", []float64{1, 2, 3}, 1, 2, "cost has 3 elements, want rows*cols = 1*2 = 2", false},
		{"costs for no rows", []float64{1}, 0, 1, "cost has 1 elements, want rows*cols = 0*1 = 0", false},
		{"size overflow", nil, math.MaxInt, 2, "more elements than an int counts", false},
		{"NaN", []float64{
			0, 1, 2,
			3, 4, math.NaN(),
		}, 2, 3, "cost at row 1, column 2 is NaN", false},
		{"-Inf", []float64{
			0, math.Inf(-1),
			2, 3,
		}, 2, 2, "cost at row 0, column 1 is -Inf", false},
		{"beyond MaxCost", []float64{
			0, 1,
			-2e150, 3,
		}, 2, 2, "cost at row 1, column 0 is -2e+150", false},
		{"forbidden row", []float64{
			0, 1,
			inf, inf,
		}, 2, 2, "no matching found for row 1", true},
		// Two rows may only take column 0.
		{"forbidden rows", []float64{
			0, inf, inf,
			1, inf, inf,
		}, 2, 3, "no matching found for row 1", true},
		// Columns 0 and 1 may only take row 0 (solved transposed).
		{"forbidden, tall", []float64{
			1, 2,
			inf, inf,
			inf, inf,
		}, 3, 2, "no matching found for column 1", true},
	}
	for _, c := range cases {
		got, err := match.Assign(c.cost, c.rows, c.cols)
		if err == nil {
			t.Errorf("%s: got %v, want an error containing %q", c.name, got, c.want)
			continue
		}
		if !strings.HasPrefix(err.Error(), "match: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %q, want one starting with \"match: \" and containing %q", c.name, err, c.want)
		}
		if errors.Is(err, match.ErrInfeasible) != c.infeasible {
			t.Errorf("%s: errors.Is(%q, ErrInfeasible) = %v, want %v", c.name, err, !c.infeasible, c.infeasible)
		}
		if got != nil {
			t.Errorf("%s: got %v with the error, want nil", c.name, got)
		}
	}
}

// TestAssignDeterministic runs Assign twice on a DETR-sized matrix full of
// ties and on a copy of it: the same matching each time, and the costs left
// as they were.
func TestAssignDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 2))
	const rows, cols = 300, 100
	cost := make([]float64, rows*cols)
	for k := range cost {
		cost[k] = float64(rng.IntN(4))
	}
	saved := slices.Clone(cost)
	first, err := match.Assign(cost, rows, cols)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cost, saved) {
		t.Fatal("Assign changed the costs")
	}
	for run := range 2 {
		got, err := match.Assign(slices.Clone(saved), rows, cols)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, first) {
			t.Fatalf("run %d: a different matching of the same costs", run+2)
		}
	}
}

// TestAssignLarge checks matrices too large for the brute force: the
// matching is complete, no exchange of two pairs and no move of a pair to
// an unmatched row (or column) makes it cheaper, which every optimum
// satisfies, and the transposed matrix gets a matching of the same cost.
func TestAssignLarge(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 3))
	for _, size := range [][2]int{{300, 100}, {100, 300}, {57, 57}, {40, 7}} {
		rows, cols := size[0], size[1]
		name := fmt.Sprintf("%dx%d", rows, cols)
		cost := make([]float64, rows*cols)
		costT := make([]float64, rows*cols)
		for i := range rows {
			for j := range cols {
				x := rng.Float64()
				cost[i*cols+j], costT[j*rows+i] = x, x
			}
		}
		assign, err := match.Assign(cost, rows, cols)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		total := checkMatching(t, name, cost, rows, cols, assign)
		c := func(i, j int) float64 {
			if j < 0 {
				return 0
			}
			return cost[i*cols+j]
		}
		// Exchanging the columns of rows a and b covers both exchanges of
		// matched pairs and, when one is unmatched (-1), moves of a pair.
		for a := range rows {
			for b := a + 1; b < rows; b++ {
				ja, jb := assign[a], assign[b]
				before, after := c(a, ja)+c(b, jb), c(a, jb)+c(b, ja)
				if after < before-autograd.TolForward64.Abs {
					t.Fatalf("%s: rows %d and %d cost %v matched to %d and %d, %v the other way",
						name, a, b, before, ja, jb, after)
				}
			}
		}
		// A matched row moving to an unmatched column.
		used := make([]bool, cols)
		for _, j := range assign {
			if j >= 0 {
				used[j] = true
			}
		}
		for i, ji := range assign {
			for j := range cols {
				if ji >= 0 && !used[j] && c(i, j) < c(i, ji)-autograd.TolForward64.Abs {
					t.Fatalf("%s: row %d costs %v on column %d and %v on the unmatched column %d",
						name, i, c(i, ji), ji, c(i, j), j)
				}
			}
		}
		assignT, err := match.Assign(costT, cols, rows)
		if err != nil {
			t.Fatalf("%s transposed: %v", name, err)
		}
		totalT := checkMatching(t, name+" transposed", costT, cols, rows, assignT)
		if err := autograd.TolForward64.Compare([]float64{totalT}, []float64{total}); err != nil {
			t.Fatalf("%s: the transposed matrix's matching costs %v, the matrix's %v", name, totalT, total)
		}
	}
}

// BenchmarkAssign times Assign on uniform random costs: DETR's largest
// case (300 queries, 100 targets), a typical COCO image (10 targets) and a
// square matrix of the queries.
func BenchmarkAssign(b *testing.B) {
	for _, size := range [][2]int{{300, 100}, {300, 10}, {300, 300}} {
		rows, cols := size[0], size[1]
		b.Run(fmt.Sprintf("rows=%d/cols=%d", rows, cols), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(33, 4))
			cost := make([]float64, rows*cols)
			for k := range cost {
				cost[k] = rng.Float64()
			}
			for b.Loop() {
				if _, err := match.Assign(cost, rows, cols); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
