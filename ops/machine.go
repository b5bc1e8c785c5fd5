package ops

import (
	"fmt"

	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/stheno-ml/stheno/backend"
	"github.com/stheno-ml/stheno/kernels"
)

// NewTapeMachine is gorgonia.NewTapeMachine for graphs that may hold
// device values. Before compiling, it runs CheckPlacement: a graph that
// would hand a device value to an op that cannot take it is refused here,
// with the node named, instead of in the middle of a run. A compile error,
// which gorgonia reports by panicking, is returned as an error, and so is
// kernels.CPUKernels' refusal of the environment's STHENO_CPU_KERNELS
// (micro-kernels this CPU cannot run, or none).
//
// It also plans when each device intermediate dies: gorgonia keeps every
// value of a run until the next one, and device memory has no collector,
// so without a plan a training step would hold every activation and every
// gradient of the forward and backward passes at once, until its Scope
// ends. With it, the op that runs right after an intermediate's last
// reader gives the intermediate's memory back to the open Scope's cache
// (backend.Scope.Release), where the next ops of the step find it, as
// PyTorch's caching allocator does when a tensor's last reference goes.
// Nothing is released while no Scope is open.
//
// Before that it removes the gradients G.Grad made and left unread (of
// constants, frozen weights, detached values: the inputs of an op on the
// way to the parameters that do not lead to one themselves), which
// gorgonia would compute on every run for nothing.
//
// So, on a device, read a run's results from nodes that no op reads (the
// loss, the gradients G.Grad returns) or from an ops.ToHost node: any
// other device intermediate's Value is emptied once its readers have run.
// Values bound to input nodes (G.Let, parameters) are never released.
//
// The machine watches every instruction (G.WithWatchlist()), which spares
// it a watch-list search per instruction: a machine given G.WithLogger logs
// every instruction's inputs and result, whatever watch list it is given.
func NewTapeMachine(g *G.ExprGraph, opts ...G.VMOpt) (m G.VM, err error) {
	if _, err := kernels.CPUKernels(); err != nil {
		return nil, err
	}
	pruneDeadGradients(g)
	order, places, err := placements(g)
	if err != nil {
		return nil, err
	}
	planReleases(g, order, func(n *G.Node) bool { return places[n].kind == placeDevice })
	defer func() {
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("ops: NewTapeMachine: gorgonia could not compile the graph: %v", r)
		}
	}()
	// Gorgonia's machine asks, several times per instruction, whether the
	// instruction is on its watch list, searching the list and the
	// graph's node map each time, only to decide whether to log it; with
	// no logger nothing is logged either way. Watching everything skips
	// the search. The one change a user sees: with G.WithLogger, every
	// instruction's inputs and result are logged, whatever watch list is
	// given (NewTapeMachine's doc says so).
	return G.NewTapeMachine(g, append([]G.VMOpt{G.WithWatchlist()}, opts...)...), nil
}

// planReleases decides, for every group of device intermediates that share
// memory, after which of this package's ops it is dead, and records it in
// those ops (specOp.releases). order is the graph in the order the tape
// machine runs it (G.Sort reversed, as gorgonia compiles it); onDevice
// tells the nodes whose values live on a device, the only ones released.
//
// Values share memory through gorgonia's own ops (Reshape returns a view,
// the + that G.Grad inserts may add in place) and through gorgonia's
// common-subexpression elimination (nodes that hash alike read one value),
// so an op's output and inputs are one group unless the op is known to
// write a fresh tensor: this package's ops and autograd's Unpack do. A
// group is dead after the last reader of any of its members. It is kept
// whole when one of its members is an input (a parameter or a G.Let value)
// or is read by nothing (the results a caller reads after the run).
func planReleases(g *G.ExprGraph, order G.Nodes, onDevice func(*G.Node) bool) {
	pos := make(map[*G.Node]int, len(order))
	for i, n := range order {
		pos[n] = i
	}
	parent := make(map[*G.Node]*G.Node, len(order))
	var find func(n *G.Node) *G.Node
	find = func(n *G.Node) *G.Node {
		p, ok := parent[n]
		if !ok || p == n {
			return n
		}
		r := find(p)
		parent[n] = r
		return r
	}
	union := func(a, b *G.Node) {
		ra, rb := find(a), find(b)
		if ra != rb {
			parent[ra] = rb
		}
	}
	byHash := map[uint32]*G.Node{}
	opNodes := map[*specOp]int{} // how many nodes each op is the op of
	for _, n := range order {
		if o, ok := n.Op().(*specOp); ok {
			o.releases = nil
			opNodes[o]++
		}
		if n.Op() != nil && !writesFresh(n.Op()) {
			for _, c := range children(g, n) {
				union(n, c)
			}
		}
		h := n.Hashcode()
		if other, ok := byHash[h]; ok {
			union(n, other)
		} else {
			byHash[h] = n
		}
	}
	type group struct {
		members []*G.Node
		last    int  // position of the last reader
		kept    bool // holds an input or an unread node
		device  bool // some member lives on a device
	}
	groups := map[*G.Node]*group{}
	for _, n := range order {
		r := find(n)
		gr := groups[r]
		if gr == nil {
			gr = &group{last: -1}
			groups[r] = gr
		}
		gr.members = append(gr.members, n)
		gr.last = max(gr.last, pos[n])
		gr.device = gr.device || onDevice(n)
		readers := g.To(n.ID())
		if n.Op() == nil || readers.Len() == 0 {
			gr.kept = true
		}
		for readers.Next() {
			gr.last = max(gr.last, pos[readers.Node().(*G.Node)])
		}
	}
	for _, gr := range groups {
		if gr.kept || !gr.device {
			continue
		}
		// The first op of this package from the last reader on that is the
		// op of one node only (an op shared by two nodes runs twice, the
		// first time too early).
		for _, n := range order[gr.last:] {
			if o, ok := n.Op().(*specOp); ok && opNodes[o] == 1 {
				o.releases = append(o.releases, gr.members...)
				break
			}
		}
	}
}

// writesFresh reports whether op writes its output into memory of its
// own, never into or over an input's.
func writesFresh(op G.Op) bool {
	switch o := op.(type) {
	case *specOp:
		return true
	case DeviceOp:
		return o.RunsOnDevice()
	}
	return false
}

// release gives back the device memory of nodes whose last reader has run
// (planReleases), to the Scope open on their device. Values already
// released, on the host, made before the Scope opened or kept are left
// alone by Scope.Release.
func (op *specOp) release() error {
	var scope *backend.Scope
	var dead []*tensor.Dense
	for _, n := range op.releases {
		t, ok := n.Value().(*tensor.Dense)
		if !ok || !backend.IsDevice(t) || len(t.Raw) == 0 {
			continue
		}
		if scope == nil {
			// The engine names the device; Release itself leaves alone
			// what is not the scope's to free.
			e, ok := t.Engine().(*backend.Engine)
			if !ok {
				continue
			}
			if scope = e.Device().OpenScope(); scope == nil {
				return nil
			}
		}
		dead = append(dead, t)
	}
	if scope == nil {
		return nil
	}
	if _, err := scope.Release(dead...); err != nil {
		return fmt.Errorf("ops: %s: releasing dead values: %w", op.name, err)
	}
	return nil
}
