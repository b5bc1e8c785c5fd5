package data

import (
	"slices"
	"testing"
)

// Iteration i's batch is a function of the seed and i alone, and an epoch
// visits every image once.
func TestBatch(t *testing.T) {
	ds, err := Synthetic(SyntheticConfig{Seed: 1, Count: 6, Size: 32})
	if err != nil {
		t.Fatal(err)
	}
	var ids []int
	for it := range 3 {
		b := Batch(ds.Images, 5, it, 2)
		again := Batch(ds.Images, 5, it, 2)
		for i := range b {
			if b[i].ID != again[i].ID || !slices.Equal(b[i].Pix, again[i].Pix) {
				t.Fatalf("iteration %d differs between calls", it)
			}
			ids = append(ids, b[i].ID)
		}
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []int{1, 2, 3, 4, 5, 6}) {
		t.Errorf("an epoch visited %v", ids)
	}
}
