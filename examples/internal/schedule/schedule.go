package schedule

// WarmupMultiStep is the learning rate over iterations: a linear warm-up
// from LR*WarmupFactor to LR over Warmup iterations, then LR times Gamma
// for every milestone in Steps that has been reached (torchvision's
// WarmupMultiStepLR).
type WarmupMultiStep struct {
	LR           float64
	Warmup       int
	WarmupFactor float64
	Steps        []int
	Gamma        float64
}

// At is the learning rate of iteration it (0-based).
func (s WarmupMultiStep) At(it int) float64 {
	lr := s.LR
	for _, m := range s.Steps {
		if it >= m {
			lr *= s.Gamma
		}
	}
	if it < s.Warmup {
		a := float64(it) / float64(s.Warmup)
		lr *= s.WarmupFactor*(1-a) + a
	}
	return lr
}
