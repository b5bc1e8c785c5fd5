// The block's dynamic shared memory, for every kernel that sizes it at launch.
#pragma once

namespace stheno {

// The block's dynamic shared memory, 16-byte aligned. Under the host
// emulator (kernels/emu/emu.h), the emulated block's.
__device__ __forceinline__ unsigned char* dynamic_smem() {
#ifdef STHENO_EMULATE
  return emu_smem();
#else
  extern __shared__ __align__(16) unsigned char stheno_dynamic_smem[];
  return stheno_dynamic_smem;
#endif
}

}  // namespace stheno
