// Package cli holds what the examples' commands (examples/maskrcnn,
// examples/detr) do alike around their flags: an interrupt that lets the
// run save its checkpoint (Program.InterruptContext), the exit status and
// messages of an error (Program.ExitCode: 128+n after signal n, 2 for bad
// usage, else 1), usage errors, the check that a mode's flags go together
// (Only), opening the GPU -device names (OpenDevice), and the lists of
// fractions a flag takes (ParseFloats, JoinFloats).
package cli
