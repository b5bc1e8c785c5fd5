// Vector reductions into global memory, for the backward kernels' scatters.
#pragma once

namespace stheno {

// a[0..3] += (x, y, z, w) as one 16-byte reduction (red.global.v4.f32.add):
// sm_90 and PTX ISA 8.1, which nvcc 11.8 cannot assemble, so only the
// *_sm90a.cu modules' kernels (PTX the Makefile retargets) use it. A
// template, so that code which never calls it never carries the
// instruction. a must be 16-byte aligned. Under the host emulator, four
// atomicAdds.
//
// Why: on an H200 the L2 processes atomics per request, and a request of
// 16 bytes a lane costs about what one of 4 bytes does (MSDeformAttn
// backward: 4 scalar atomics per corner -> one of these, encoder 1.41 ->
// 0.84 ms).
template <typename T>
__device__ __forceinline__ void red_add_v4(T* a, T x, T y, T z, T w) {
  static_assert(sizeof(T) == 4, "red.global.v4.f32");
#ifdef STHENO_EMULATE
  atomicAdd(a, x), atomicAdd(a + 1, y), atomicAdd(a + 2, z), atomicAdd(a + 3, w);
#else
  asm volatile("red.global.v4.f32.add [%0], {%1, %2, %3, %4};" ::"l"(a), "f"(x), "f"(y), "f"(z), "f"(w) : "memory");
#endif
}

}  // namespace stheno
