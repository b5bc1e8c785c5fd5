package match_test

import (
	"fmt"

	"github.com/stheno-ml/stheno/examples/detr/match"
)

// Three queries and two targets: each target gets its own query, and the
// query left over (-1) is trained towards "no object".
func ExampleAssign() {
	cost := []float64{ // rows: queries, columns: targets
		0.9, 0.1,
		0.2, 0.8,
		0.5, 0.4,
	}
	assign, err := match.Assign(cost, 3, 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	for query, target := range assign {
		if target >= 0 {
			fmt.Printf("query %d -> target %d\n", query, target)
		}
	}
	fmt.Println(assign)
	// Output:
	// query 0 -> target 1
	// query 1 -> target 0
	// [1 0 -1]
}
