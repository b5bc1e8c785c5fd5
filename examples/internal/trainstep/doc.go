// Package trainstep holds what the examples' training graphs
// (examples/maskrcnn/model.Net, examples/detr/model.Net) do alike around
// a step: open a step's backend.Scope and reset the machine at its end
// (Begin), and read and restore the AdamW state a checkpoint keeps, by
// parameter name, through the host (State, SetState).
package trainstep
