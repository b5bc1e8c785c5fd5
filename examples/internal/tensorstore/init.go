package tensorstore

import (
	"math"
	"math/rand/v2"
	"slices"

	"gorgonia.org/tensor"
)

// Init makes a tensor's first values, n of them, from the store's random
// stream. Values are drawn in float64 and rounded to the store's dtype.
type Init func(rng *rand.Rand, n int) []float64

// Zeros starts a tensor at 0 (no draw from the stream).
func Zeros() Init { return Constant(0) }

// Constant starts every value at v (no draw from the stream).
func Constant(v float64) Init {
	return func(_ *rand.Rand, n int) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = v
		}
		return out
	}
}

// Normal draws from the normal distribution of mean 0 and deviation std.
func Normal(std float64) Init {
	return func(rng *rand.Rand, n int) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = rng.NormFloat64() * std
		}
		return out
	}
}

// Uniform draws from the uniform distribution over [-bound, bound).
func Uniform(bound float64) Init {
	return func(rng *rand.Rand, n int) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = (2*rng.Float64() - 1) * bound
		}
		return out
	}
}

// Values starts a tensor at vs (at least n of them).
func Values(vs []float64) Init {
	return func(_ *rand.Rand, n int) []float64 { return slices.Clone(vs[:n]) }
}

// Xavier is torch.nn.init.xavier_uniform_ (gain 1): uniform of bound
// sqrt(6/(fanIn+fanOut)).
func Xavier(fanIn, fanOut int) Init {
	return Uniform(math.Sqrt(6 / float64(fanIn+fanOut)))
}

// Kaiming is He initialisation for a ReLU layer: normal with variance
// 2/fan (torchvision initialises its ResNets and Mask R-CNN's mask head
// with fan_out).
func Kaiming(fan int) Init { return Normal(math.Sqrt(2 / float64(fan))) }

// TorchLinear is nn.Linear's default init of its weight and bias (kaiming
// uniform with a = sqrt(5) for the weight): uniform of bound
// 1/sqrt(fanIn) for both.
func TorchLinear(fanIn int) Init { return Uniform(1 / math.Sqrt(float64(fanIn))) }

// DenseOf is a host tensor of dtype dt (float32 or float64) holding vs.
func DenseOf(dt tensor.Dtype, vs []float64, shape ...int) *tensor.Dense {
	if dt == tensor.Float64 {
		return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(vs))
	}
	f := make([]float32, len(vs))
	for i, v := range vs {
		f[i] = float32(v)
	}
	return tensor.New(tensor.WithShape(shape...), tensor.WithBacking(f))
}
