package data

import "math/rand/v2"

// Batch returns the images of training iteration it: the training set is visited
// in a fresh random order every epoch (slot j = it*batch+b of the sequence
// is image perm_epoch[j % len]), each image mirrored with probability 1/2.
// Everything depends on the seed and it alone, so a resumed run sees the
// batches the uninterrupted run would have.
func Batch(images []*Image, seed uint64, it, batch int) []*Image {
	out := make([]*Image, batch)
	var perm []int
	permEpoch := -1
	for b := range batch {
		j := it*batch + b
		epoch := j / len(images)
		if epoch != permEpoch {
			perm = rand.New(rand.NewPCG(seed, uint64(epoch)<<1|1)).Perm(len(images))
			permEpoch = epoch
		}
		img := images[perm[j%len(images)]]
		if rand.New(rand.NewPCG(seed^0xf11b, uint64(j))).IntN(2) == 1 {
			img = Flip(img)
		}
		out[b] = img
	}
	return out
}
