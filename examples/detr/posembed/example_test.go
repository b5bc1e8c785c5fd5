package posembed_test

import (
	"fmt"

	"github.com/stheno-ml/stheno/examples/detr/posembed"
)

// A batch of two images on a 2 x 3 canvas: the second, 1 x 2, is padded on
// the right and at the bottom. With Feats 2 each pixel gets four channels:
// sin and cos of its row's coordinate, then of its column's.
func ExampleSine() {
	mask, err := posembed.PaddingMask(2, 3, [][2]int{{2, 3}, {1, 2}})
	if err != nil {
		fmt.Println(err)
		return
	}
	pos, err := posembed.Sine[float32](mask, 2, 2, 3, posembed.Config{Feats: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	// Image 1, channel 2: sin of the column coordinate, (x - 0.5) / 2 * 2π
	// on its valid row; the padded third column repeats the second.
	fmt.Printf("%.4f\n", pos[(1*4+2)*6:][:3])
	// Output:
	// [1.0000 -1.0000 -1.0000]
}
