package data_test

import (
	"fmt"

	"github.com/stheno-ml/stheno/examples/internal/data"
)

// Generate the synthetic dataset and look at one object.
func ExampleSynthetic() {
	ds, err := data.Synthetic(data.DefaultSynthetic(1, 10))
	if err != nil {
		panic(err)
	}
	img := ds.Images[0]
	o := img.Objects[0]
	fmt.Println(len(ds.Images), "images of", img.W, "x", img.H, "classes", ds.Classes)
	fmt.Println("first object:", ds.Classes[o.Class], "box", o.Box, "box is the mask's:", o.Box == data.BoxOf(o.Mask))
	// Output:
	// 10 images of 64 x 64 classes [circle square triangle]
	// first object: triangle box [13 5 31 26] box is the mask's: true
}

// A mask through COCO's run-length encoding, column by column.
func ExampleCompressRLE() {
	m := data.NewMask(3, 2)
	m.Bits[0] = true       // (0,0)
	m.Bits[3] = true       // (0,1)
	m.Bits[4] = true       // (1,1)
	c := data.EncodeRLE(m) // down column 0, then 1, then 2
	s := data.CompressRLE(c)
	back, _ := data.DecompressRLE(s)
	fmt.Println(c, s, back)
	// Output: [0 2 1 1 2] 021O1 [0 2 1 1 2]
}
