package kernels

// Float is the set of element types every kernel supports.
type Float interface {
	~float32 | ~float64
}
