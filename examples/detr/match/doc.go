// Package match solves the linear assignment problem DETR's bipartite
// matcher hands to scipy's linear_sum_assignment: given a cost for every
// (query, target) pair, pick for each target its own query so that the sum
// of the chosen costs is least.
//
// Assign takes the cost matrix row-major, rows the queries and columns the
// targets, of any shape: DETR has more queries than targets
// (Deformable-DETR has 300 queries, a COCO image fewer than 100 objects),
// so min(rows, cols) pairs are matched and the other rows (or columns) stay
// unmatched. An image without targets is a matrix with zero columns, and
// every query stays unmatched.
//
// # Algorithm
//
// Jonker-Volgenant's shortest augmenting path method, as laid out for
// rectangular matrices by Crouse ("On implementing 2D rectangular
// assignment algorithms", IEEE Trans. Aerospace and Electronic Systems,
// 2016), the method scipy's linear_sum_assignment uses. The shorter side is
// matched one element at a time; each step is a Dijkstra search over the
// longer side on costs reduced by the dual variables, which keeps them
// non-negative, followed by an augmentation along the shortest path found.
// With k = min(rows, cols) and m = max(rows, cols) that is O(k^2 m) time
// and O(rows*cols) memory (a copy of the costs in float64, transposed when
// rows > cols).
//
// # Costs that are not finite
//
// NaN and -Inf costs are refused with an error naming the row and column.
// +Inf marks a forbidden pair: Assign finds the cheapest matching of
// min(rows, cols) pairs that avoids every forbidden pair, and returns an
// error wrapping ErrInfeasible when there is none. Finite costs larger in
// magnitude than MaxCost (1e150) are refused as well, so that the sums the
// search forms never overflow; DETR's costs are of order 1.
//
// # Ties
//
// When several matchings share the least total cost, which one Assign
// returns is not specified, and may differ from scipy's choice, but it is
// always the same one for the same input: Assign is deterministic.
package match
