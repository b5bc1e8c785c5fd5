// The float32 MSDeformAttn backward with vector reductions into grad_value
// (red.global.v4.f32.add: sm_90, PTX ISA 8.1). nvcc 11.8 cannot assemble
// that instruction, so, like conv_sm90a.cu, this file is compiled to
// compute_90 PTX and retargeted by the Makefile; the driver compiles it when
// the module is first loaded. ops picks these kernels on compute capability
// 9.0 GPUs and msdeform.cu's elsewhere.
//
// The kernels are msdeform_backward_scatter's with kQuad: a lane takes 4
// consecutive channels, loads each corner's as one float4 and adds its 4
// gradients with one 16-byte reduction, where the msdeform.cu kernels take
// channels 8 apart and issue 4 scalar atomics (each group of 8 lanes then
// covering one 32-byte sector per instruction). Names: _q4 for the quad
// channels, the rest as in msdeform.cu (_r<K>: points per reduce-scatter,
// _h: heads fastest, _b<B>: registers for B blocks of 256 threads per SM).
//
// The host emulator's test (kernels/emu) includes msdeform.cu whole, then
// this file for its kernels.
#ifndef STHENO_EMULATE
#define STHENO_MSDEFORM_TEMPLATES_ONLY
#include "msdeform.cu"
#endif

#define STHENO_BWD_Q(name, K, H, B)                                          \
  __global__ void __launch_bounds__(256, B) name(stheno::MSDeformParams p) { \
    stheno::msdeform_backward_scatter<float, K, 4, H, true>(p);              \
  }

extern "C" {
STHENO_BWD_Q(msdeform_backward_f32_q4_r4_h, 4, true, 2)
STHENO_BWD_Q(msdeform_backward_f32_q4_r4_h_b3, 4, true, 3)
STHENO_BWD_Q(msdeform_backward_f32_q4_r4_h_b4, 4, true, 4)
STHENO_BWD_Q(msdeform_backward_f32_q4_r8_h_b3, 8, true, 3)
}
