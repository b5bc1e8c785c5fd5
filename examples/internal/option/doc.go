// Package option checks the options of the examples' commands and training
// runs (examples/maskrcnn and examples/detr) the same way: every value out
// of its range is reported, all at once and before any work starts, as an
// *Error naming the flag and what it allows; a resumed run is compared
// with its checkpoint's options flag by flag.
package option
