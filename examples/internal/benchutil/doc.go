// Package benchutil holds what the examples' GPU benchmarks share:
// opening the GPU or skipping, timing a training step with the device's
// counters, and reporting the host steps' time. It is imported by tests
// only.
package benchutil
