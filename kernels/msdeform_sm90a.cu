// The float32 MSDeformAttn backward with vector reductions into grad_value
// (red.global.v4.f32.add: sm_90, PTX ISA 8.1). nvcc 11.8 cannot assemble
// that instruction, so, like conv_sm90a.cu, this file is compiled to
// compute_90 PTX and retargeted by the Makefile; the driver compiles it when
// the module is first loaded. ops picks msdeform_bwd_red4_rs4_occ3_f32 on
// compute capability 9.0 GPUs and msdeform.cu's kernels elsewhere.
//
// The kernels are msdeform_backward_scatter's with kQuad: a lane takes 4
// consecutive channels, loads each corner's as one float4 and adds its 4
// gradients with one 16-byte reduction (_red4), where msdeform.cu's _c4
// kernels take channels 8 apart and issue 4 scalar atomics (each group of 8
// lanes then covering one 32-byte sector per instruction). The rest of the
// names as in msdeform.cu (_rs<K>: points per reduce-scatter, _occ<B>:
// registers for B blocks of kBlock threads per SM); all are heads fastest.
//
// The host emulator's test (kernels/emu) includes msdeform.cu whole, then
// this file for its kernels.
#ifndef STHENO_EMULATE
#define STHENO_MSDEFORM_TEMPLATES_ONLY
#include "msdeform.cu"
#endif

#define STHENO_BWD_Q(name, K, H, B)                                                     \
  __global__ void __launch_bounds__(stheno::kBlock, B) name(stheno::MSDeformParams p) { \
    stheno::msdeform_backward_scatter<float, K, 4, H, true>(p);                         \
  }

extern "C" {
STHENO_BWD_Q(msdeform_bwd_red4_rs4_occ3_f32, 4, true, 3)
}

#if STHENO_KERNEL_VARIANTS
extern "C" {
STHENO_BWD_Q(msdeform_bwd_red4_rs4_occ2_f32, 4, true, 2)
STHENO_BWD_Q(msdeform_bwd_red4_rs4_occ4_f32, 4, true, 4)
STHENO_BWD_Q(msdeform_bwd_red4_rs8_occ3_f32, 8, true, 3)
}
#endif  // STHENO_KERNEL_VARIANTS
