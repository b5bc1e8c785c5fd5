package ops

import (
	"reflect"
	"runtime"
	"sync"
	"unsafe"
	"weak"

	G "gorgonia.org/gorgonia"
)

// Gradients no one reads. gorgonia's G.Grad asks each op on the way from
// the loss back to the parameters for the gradients of all its inputs,
// and keeps those of the inputs that lead to a parameter; the others stay
// in the graph, and a tape machine computes them on every run: the
// gradient of a broadcast constant (a Sum over the dims it was broadcast
// along, as large as the op's output), of a frozen weight, of a detached
// reference. specOp.SymDiff records the nodes it makes, and NewTapeMachine
// removes those that no node reads and that are no node's gradient
// (pruneDeadGradients), with the nodes only they read.

// symDiffNodes holds, per graph, the IDs of the nodes specOp.SymDiff made:
// a *symDiffRecord under the graph's weak pointer, dropped when the graph
// is collected.
var symDiffNodes sync.Map

type symDiffRecord struct {
	mu  sync.Mutex
	ids map[int64]bool
}

// recordSymDiff records the nodes of g after the first before: those a
// SymDiff call just made (gorgonia appends new nodes to AllNodes; a node
// equal to one already there is not new).
func recordSymDiff(g *G.ExprGraph, before int) {
	all := g.AllNodes()
	if len(all) <= before {
		return
	}
	key := weak.Make(g)
	v, loaded := symDiffNodes.LoadOrStore(key, &symDiffRecord{ids: map[int64]bool{}})
	if !loaded {
		runtime.AddCleanup(g, func(k weak.Pointer[G.ExprGraph]) { symDiffNodes.Delete(k) }, key)
	}
	r := v.(*symDiffRecord)
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range all[before:] {
		r.ids[n.ID()] = true
	}
}

// graphOf is the graph of the first node of ns that is not nil, or nil.
func graphOf(ns G.Nodes) *G.ExprGraph {
	for _, n := range ns {
		if n != nil {
			return n.Graph()
		}
	}
	return nil
}

// pruneDeadGradients removes from g the nodes a SymDiff made that nothing
// reads and that are not the gradient of a node (G.Grad's results are
// gradients of the parameters, and gradient nodes it sums are gradients
// of the nodes they sum for), then the SymDiff nodes only those read, and
// so on. It returns how many it removed.
func pruneDeadGradients(g *G.ExprGraph) int {
	v, ok := symDiffNodes.Load(weak.Make(g))
	if !ok {
		return 0
	}
	index, ok := nodeIndex(g)
	if !ok {
		return 0
	}
	r := v.(*symDiffRecord)
	r.mu.Lock()
	defer r.mu.Unlock()
	all := g.AllNodes()
	readers := make(map[*G.Node]int, len(all))
	for _, n := range all {
		for _, c := range children(g, n) {
			readers[c]++
		}
	}
	dead := func(n *G.Node) bool {
		return r.ids[n.ID()] && n.Op() != nil && readers[n] == 0 && len(n.DerivOf()) == 0
	}
	var queue []*G.Node
	for _, n := range all {
		if dead(n) {
			queue = append(queue, n)
		}
	}
	removed := 0
	for len(queue) > 0 {
		n := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		kids := children(g, n)
		g.RemoveNode(n)
		removed++
		for _, c := range kids {
			if readers[c]--; readers[c] == 0 && dead(c) {
				queue = append(queue, c)
			}
		}
	}
	if removed > 0 {
		index.Set(reflect.MakeMap(index.Type()))
	}
	return removed
}

// nodeIndex is g's cache of each node's position in AllNodes, by ID
// (gorgonia's ExprGraph.byID). RemoveNode shifts the positions after the
// node it removes but leaves the cache as it was, so that a later lookup
// by ID (From, To: every walk of the graph) finds another node; emptying
// the cache after removing makes the lookups fill it afresh. ok is false
// where the field is not there (another gorgonia): then nothing is
// removed.
func nodeIndex(g *G.ExprGraph) (index reflect.Value, ok bool) {
	f := reflect.ValueOf(g).Elem().FieldByName("byID")
	if !f.IsValid() || f.Kind() != reflect.Map || f.Type().Key().Kind() != reflect.Int64 {
		return reflect.Value{}, false
	}
	return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem(), true
}
