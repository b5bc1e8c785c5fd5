// Package tensorstore keeps a model's named tensors for the examples'
// parameter stores (examples/maskrcnn/model.Params and
// examples/detr/model.Params embed a Store): learnable tensors, frozen
// ones (no gradient, no optimiser) and the running statistics of
// BatchNorm layers, in one dtype, in host memory or on one GPU.
//
// Tensors are created and initialised from the store's random stream the
// first time a graph asks for them, so the same order of requests and the
// same seed give the same model on either device; on a GPU they are
// initialised on the host and copied there. HostValue, SetValue,
// HostRunningStats and SetRunningStats read and write them through the
// host (checkpoints), and Free gives the device memory back.
//
// What a tensor means to the optimiser (weight decay, learning-rate
// group) is each example's own.
package tensorstore
