// Package autograd holds what every stheno op shares for differentiation and
// for testing it:
//
//   - Unpack, which splits the packed output of a backward op that computes
//     several gradients at once (MSDeformAttn's value, location and weight
//     gradients, say) into one node per gradient;
//   - GradCheck, a central-difference gradient checker in float64 that works
//     on any graph of gorgonia and stheno ops;
//   - the tolerance table: the one place where the accuracy every test
//     demands of a result is written down.
package autograd
