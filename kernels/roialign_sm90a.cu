// The float32 RoIAlign backwards with vector reductions into the
// channels-last gradient (red.global.v4.f32.add: sm_90, PTX ISA 8.1), which
// nvcc 11.8 cannot assemble: like conv_sm90a.cu, compiled to compute_90 PTX
// and retargeted by the Makefile, compiled by the driver when the module is
// first loaded. ops picks the separable one on compute capability 9.0 GPUs
// when C % 4 == 0, and roialign.cu's kernels elsewhere; the tap-by-tap one
// is a variant, kept to compare against.
//
// The host emulator's test (kernels/emu) includes roialign.cu whole, then
// this file for its kernels.
#ifndef STHENO_EMULATE
#define STHENO_ROIALIGN_TEMPLATES_ONLY
#include "roialign.cu"
#endif

extern "C" {
__global__ void __launch_bounds__(stheno::kThreads) roialign_bwd_nhwc_sep_red4_f32(stheno::RoIAlignParams p) {
  stheno::roialign<float, true, true>(p, true);
}
#if STHENO_KERNEL_VARIANTS
__global__ void __launch_bounds__(stheno::kThreads) roialign_bwd_nhwc_taps_red4_f32(stheno::RoIAlignParams p) {
  stheno::roialign<float, true, true>(p, false);
}
#endif
}
