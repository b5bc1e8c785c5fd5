package match

import (
	"errors"
	"fmt"
	"math"
)

// MaxCost is the largest magnitude of a finite cost that Assign accepts. The
// dual variables of the search grow to sums of many costs; bounding each
// cost keeps every such sum far from overflowing float64, so an answer is
// never corrupted by an infinity that no cost holds.
const MaxCost = 1e150

// ErrInfeasible is wrapped by Assign's error when every matching of
// min(rows, cols) pairs takes at least one +Inf (forbidden) cost.
var ErrInfeasible = errors.New("match: every complete matching takes a +Inf cost")

// Assign returns the matching of least total cost between the rows and the
// columns of the rows x cols matrix cost, stored row-major (the cost of
// pairing row i with column j is cost[i*cols+j]).
//
// The result has one entry per row: the column matched to row i, or -1 when
// row i is left unmatched. Exactly min(rows, cols) rows are matched, each to
// its own column; with more columns than rows, the columns that no entry
// names are the unmatched ones. Zero rows or columns make an empty matching
// (every entry -1), not an error.
//
// Assign refuses, with an error and no result: negative sizes; len(cost)
// other than rows*cols; a NaN or -Inf cost, or a finite one larger in
// magnitude than MaxCost, naming its row and column. A +Inf cost forbids its
// pair; when no complete matching avoids the forbidden pairs, the error
// wraps ErrInfeasible. The costs are read, never written.
func Assign[F ~float32 | ~float64](cost []F, rows, cols int) ([]int, error) {
	if rows < 0 || cols < 0 {
		return nil, fmt.Errorf("match: sizes must not be negative, got rows %d, cols %d", rows, cols)
	}
	if rows > 0 && cols > math.MaxInt/rows {
		return nil, fmt.Errorf("match: a %d x %d cost matrix has more elements than an int counts", rows, cols)
	}
	if len(cost) != rows*cols {
		return nil, fmt.Errorf("match: cost has %d elements, want rows*cols = %d*%d = %d",
			len(cost), rows, cols, rows*cols)
	}
	for k, x := range cost {
		c := float64(x)
		// Written so that NaN fails the test and reaches the error.
		if !(c >= -MaxCost && c <= MaxCost) && !math.IsInf(c, 1) {
			return nil, fmt.Errorf("match: cost at row %d, column %d is %v: costs must be finite (at most %g in magnitude) or +Inf",
				k/cols, k%cols, c, MaxCost)
		}
	}
	assign := make([]int, rows)
	for i := range assign {
		assign[i] = -1
	}
	if rows == 0 || cols == 0 {
		return assign, nil
	}

	// The search matches every row of a matrix with no more rows than
	// columns; a taller matrix is solved transposed.
	transposed := rows > cols
	n, m := rows, cols
	c := make([]float64, rows*cols)
	if transposed {
		n, m = cols, rows
		for i := range rows {
			for j := range cols {
				c[j*rows+i] = float64(cost[i*cols+j])
			}
		}
	} else {
		for k, x := range cost {
			c[k] = float64(x)
		}
	}
	col4row, failed := shortestAugmentingPaths(c, n, m)
	if failed >= 0 {
		side := "row"
		if transposed {
			side = "column"
		}
		return nil, fmt.Errorf("%w (no matching found for %s %d together with the %ss before it)",
			ErrInfeasible, side, failed, side)
	}
	if transposed {
		for j, i := range col4row {
			assign[i] = j
		}
	} else {
		copy(assign, col4row)
	}
	return assign, nil
}

// shortestAugmentingPaths matches every row of the n x m matrix c (row-major,
// n <= m, no NaN or -Inf) to its own column at least total cost, and returns
// each row's column. When row r cannot be matched together with rows 0..r-1
// without a +Inf cost, it returns r as failed (else -1).
//
// Rows are added one at a time. The dual variables u (rows) and v (columns)
// keep every reduced cost c[i][j] - u[i] - v[j] non-negative and those of
// matched pairs zero, so the cheapest way to add row cur is a shortest path
// in reduced costs from cur to a free column, alternating unmatched and
// matched pairs: Dijkstra's search, whose labels dist are then folded into
// u and v so that the invariant holds for the augmented matching.
func shortestAugmentingPaths(c []float64, n, m int) (col4row []int, failed int) {
	inf := math.Inf(1)
	u := make([]float64, n)
	v := make([]float64, m)
	col4row = make([]int, n)
	row4col := make([]int, m)
	for i := range col4row {
		col4row[i] = -1
	}
	for j := range row4col {
		row4col[j] = -1
	}
	dist := make([]float64, m)    // shortest path length from cur to each column
	pred := make([]int, m)        // the row before each column on its path
	doneCol := make([]bool, m)    // columns whose shortest path is final
	rowsSeen := make([]int, 0, n) // rows reached by the search, cur first
	colsSeen := make([]int, 0, n) // columns made final, in order

	for cur := range n {
		for j := range m {
			dist[j], pred[j], doneCol[j] = inf, -1, false
		}
		rowsSeen, colsSeen = rowsSeen[:0], colsSeen[:0]
		length := 0.0 // the length of the last column made final
		i, sink := cur, -1
		for sink < 0 {
			rowsSeen = append(rowsSeen, i)
			row := c[i*m : (i+1)*m]
			base := length - u[i]
			lowest, next := inf, -1
			for j := range m {
				if doneCol[j] {
					continue
				}
				if d := base + row[j] - v[j]; d < dist[j] {
					dist[j], pred[j] = d, i
				}
				// The nearest column; among equals the first free one, which
				// ends the search sooner, else the first.
				if d := dist[j]; d < lowest ||
					d == lowest && next >= 0 && row4col[next] >= 0 && row4col[j] < 0 {
					lowest, next = d, j
				}
			}
			if next < 0 { // every column left is behind a +Inf cost
				return nil, cur
			}
			length = lowest
			doneCol[next] = true
			colsSeen = append(colsSeen, next)
			if row4col[next] < 0 {
				sink = next
			} else {
				i = row4col[next]
			}
		}

		// Fold the labels into the duals: reduced costs stay non-negative,
		// and those along the new path become zero.
		u[cur] += length
		for _, r := range rowsSeen[1:] {
			u[r] += length - dist[col4row[r]]
		}
		for _, j := range colsSeen {
			v[j] -= length - dist[j]
		}

		// Augment: flip the path's pairs from sink back to cur.
		for j := sink; ; {
			r := pred[j]
			row4col[j] = r
			j, col4row[r] = col4row[r], j
			if r == cur {
				break
			}
		}
	}
	return col4row, -1
}
