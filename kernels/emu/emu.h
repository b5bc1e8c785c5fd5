// A host emulator for stheno's CUDA kernels, so that their logic is checked
// on machines without a GPU (`make emu-test`; CI runs it). A harness includes
// this header and then the real kernels/*.cu files, which g++ compiles as
// plain C++ (STHENO_EMULATE is defined: conv.cuh routes its inline-PTX
// wrappers here).
//
// What it emulates:
// - a launch (emu::launch): blocks run one after another on the calling OS
//   thread; each thread of a block is a fiber (its own stack, switched to
//   and from in user space, no system call), reused from block to block.
//   The fibers are scheduled cooperatively: one runs until it waits at a
//   barrier or returns, then the next ready one runs. The order is
//   deterministic and alternates: a block's threads start in increasing
//   order at even blocks and in decreasing order at odd ones, and a barrier
//   releases its waiters in the order they arrived after even phases and
//   in the reverse order after odd ones. So a missing barrier shows up
//   (as a read of NaN-filled shared memory, say) whichever of two
//   neighbours reads what the other writes;
// - __syncthreads as a barrier over the block, __syncwarp as one over the
//   warp; a thread that returns drops out of both, as on the GPU. A block
//   whose threads all wait at barriers that can no longer complete is a
//   deadlock: it aborts, saying who waits where;
// - warp shuffles (__shfl_sync, __shfl_xor_sync, __shfl_down_sync, with
//   widths) through a per-warp exchange buffer and one warp barrier: every
//   lane of the warp must take part (full masks only);
// - mma.sync.m16n8k8 TF32 (operands truncated to TF32 as the tensor cores
//   read them, FP32 accumulation), cvt.rna.tf32, ldmatrix .x4, each a warp
//   barrier over the lanes' exchanged operands;
// - cp.async: a thread's copies are queued and land at the latest moment
//   the PTX allows (the cp.async.wait_group that must see them), or at once
//   with EMU_CP_EAGER set in the environment: the two extremes of when a
//   copy may land. Misaligned copies and ldmatrix rows abort, and so does a
//   thread that ends with copies not waited for;
// - dynamic shared memory, filled with 0xff (NaN as floats) at each block's
//   start so that reads of unwritten shared memory show up; static
//   __shared__ variables are function statics (blocks run one at a time);
// - atomicAdd/atomicMax as plain read-modify-writes (exact: one thread runs
//   at a time), __ldg as a plain load, the vector types the kernels use.
//
// What it does not: timing, occupancy, the GPU's memory model (anything the
// kernels get right only because of the emulated barriers' ordering is not
// a proof that they are race free), fused multiply-adds (results differ from
// the GPU in the last bits), and resource limits (registers, shared memory
// size, launch bounds).
//
// Fibers switch by a few instructions of assembly on x86-64 (glibc's
// swapcontext makes a system call per switch to save the signal mask);
// elsewhere, or with EMU_UCONTEXT defined, by ucontext. Under
// AddressSanitizer every switch is announced to it
// (__sanitizer_start_switch_fiber).
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#if !defined(__x86_64__) && !defined(EMU_UCONTEXT)
#define EMU_UCONTEXT 1
#endif
#ifdef EMU_UCONTEXT
#include <ucontext.h>
#endif
#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <pthread.h>
#include <sanitizer/common_interface_defs.h>
#endif

#define STHENO_EMULATE 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __align__(n) alignas(n)
#define __shared__ static

using std::isinf;
using std::isnan;

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct alignas(16) int4 {
  int x, y, z, w;
};
inline int4 make_int4(int a, int b, int c, int d) { return int4{a, b, c, d}; }
struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float a, float b) { return float2{a, b}; }
struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
struct alignas(16) double2 {
  double x, y;
};
inline double2 make_double2(double a, double b) { return double2{a, b}; }

template <class T>
inline T min(T a, T b) { return b < a ? b : a; }
template <class T>
inline T max(T a, T b) { return a < b ? b : a; }

// Arithmetic rounded step by step (the host compiler does not fuse without
// FMA instructions, which the emulator's flags do not enable).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dsub_rn(double a, double b) { return a - b; }

// __ldg: a plain load on the host.
template <class V>
inline V __ldg(const V* p) { return *p; }

// Atomics: the fibers of a launch take turns on one OS thread and never
// switch inside these, so a plain read-modify-write is atomic (and exact).
template <class V>
inline V atomicAdd(V* p, V v) {
  const V old = *p;
  *p = old + v;
  return old;
}
inline int atomicMax(int* p, int v) {
  const int old = *p;
  if (v > old) *p = v;
  return old;
}

// Context switches between fibers. A context is the stack pointer of a
// suspended fiber (x86-64) or a ucontext_t.
#ifndef EMU_UCONTEXT
// emu_switch(from, to) pushes the callee-saved registers and the SSE and
// x87 control words on the current stack, stores the stack pointer in
// *from, loads `to` and pops the same from there. A new fiber's stack is
// laid out as if it had been suspended here, returning into
// emu_fiber_start, which calls r13(r12).
extern "C" void emu_switch(void** from, void* to);
extern "C" void emu_fiber_start();
asm(R"(
  .text
  .p2align 4
  .weak emu_switch
  .hidden emu_switch
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
  .p2align 4
  .weak emu_fiber_start
  .hidden emu_fiber_start
  .type emu_fiber_start, @function
emu_fiber_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size emu_fiber_start, .-emu_fiber_start
)");
#endif

namespace emu {

struct Thread {
  uint3 tid, bid;
  dim3 bdim, gdim;
  int warp, lane;
};

// A barrier of the cooperative scheduler: `expected` participants, of which
// `arrived` wait in `waiters` (fiber indices); the last to arrive releases
// them and goes on. phase counts completions.
struct Bar {
  int expected = 0, arrived = 0;
  unsigned phase = 0;
  std::vector<int> waiters;
  void reset(int n) {
    expected = n, arrived = 0, phase = 0;
    waiters.clear();
  }
};

// cp.async copies of one thread (see the header comment): q holds every
// copy not landed yet from index head on; ends[g] is the end in q of
// committed group g (groups before gh have landed); what follows the last
// committed group is the open one.
struct Copy {
  void* dst;
  const void* src;
  int size, src_bytes;
};
struct CpState {
  std::vector<Copy> q;
  std::vector<size_t> ends;
  size_t head = 0, gh = 0;
  size_t open_begin() const { return ends.empty() ? 0 : ends.back(); }
};

struct Warp {
  Bar bar;
  uint64_t xchg[2][32];       // shuffles and ldmatrix: a value per lane
  uint32_t mma[2][32 * 6];    // mma.sync: a lane's a[4] and b[2]
};

struct Fiber {
#ifdef EMU_UCONTEXT
  ucontext_t ctx;
#else
  void* sp = nullptr;
#endif
  char* stack = nullptr;  // lowest address of the usable stack
  size_t stack_size = 0;
  Thread t;
  CpState cp;
  int index = 0;
  enum { kReady, kWaiting, kDone } state = kReady;
  const Bar* waits_on = nullptr;
};

// The launch in progress (launches run one at a time, on the calling thread).
struct Sched {
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  Bar block_bar;
  std::vector<unsigned char> smem;
  std::vector<int> ready;  // a ring of fiber indices
  size_t ready_head = 0, ready_n = 0;
  int live = 0;  // fibers of this block that have not returned
  Fiber main;  // the launching thread's context (its stack is not ours)
  void (*body)(const void*) = nullptr;
  const void* arg = nullptr;
};
inline Sched S;
inline Fiber* cur = nullptr;  // the fiber running now
inline Thread& T() { return cur->t; }
}  // namespace emu

#define threadIdx (emu::cur->t.tid)
#define blockIdx (emu::cur->t.bid)
#define blockDim (emu::cur->t.bdim)
#define gridDim (emu::cur->t.gdim)

namespace emu {

#ifdef EMU_ASAN
// The launching thread's stack, for AddressSanitizer's bookkeeping.
inline void main_stack(char** bottom, size_t* size) {
  static char* b = nullptr;
  static size_t s = 0;
  if (!b) {
    pthread_attr_t a;
    void* addr;
    pthread_getattr_np(pthread_self(), &a);
    pthread_attr_getstack(&a, &addr, &s);
    pthread_attr_destroy(&a);
    b = static_cast<char*>(addr);
  }
  *bottom = b, *size = s;
}
#endif

// Suspends the running context in `from` and resumes `to`.
inline void switch_to(Fiber& from, Fiber& to) {
  cur = &to;
#ifdef EMU_ASAN
  void* fake = nullptr;
  char* bottom = to.stack;
  size_t size = to.stack_size;
  if (&to == &S.main) main_stack(&bottom, &size);
  __sanitizer_start_switch_fiber(&fake, bottom, size);
#endif
#ifdef EMU_UCONTEXT
  swapcontext(&from.ctx, &to.ctx);
#else
  emu_switch(&from.sp, to.sp);
#endif
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

// Stacks, mapped once and kept for every later launch, each with an
// inaccessible page below it so that an overflow faults.
#ifdef EMU_ASAN
constexpr size_t kStackBytes = size_t(1) << 20;
#else
constexpr size_t kStackBytes = size_t(256) << 10;
#endif
constexpr size_t kGuardBytes = 4096;
inline char* stack(int i) {
  static char* base = nullptr;
  constexpr size_t per = kStackBytes + kGuardBytes;
  if (!base) {
    void* m = mmap(nullptr, per * 1024, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      perror("emu: mmap of the fiber stacks");
      abort();
    }
    base = static_cast<char*>(m);
    for (int j = 0; j < 1024; ++j) mprotect(base + per * j, kGuardBytes, PROT_NONE);
  }
  return base + per * i + kGuardBytes;
}

[[noreturn]] inline void deadlock() {
  fflush(stdout);
  const Thread& t = S.fibers[0].t;
  fprintf(stderr, "emu: deadlock in block (%u,%u,%u) of a launch of %u threads: %d not ended, none can go on:\n",
          t.bid.x, t.bid.y, t.bid.z, t.bdim.x * t.bdim.y * t.bdim.z, S.live);
  auto list = [](const Bar* b, const char* what) {
    int n = 0, first = -1;
    for (auto& f : S.fibers)
      if (f.state == Fiber::kWaiting && f.waits_on == b) first = first < 0 ? f.index : first, ++n;
    if (n)
      fprintf(stderr, "  %d thread(s) wait at %s (first: thread %d), %d of %d arrived\n", n, what, first, b->arrived,
              b->expected);
  };
  list(&S.block_bar, "__syncthreads");
  for (size_t w = 0; w < S.warps.size(); ++w) {
    char what[96];
    snprintf(what, sizeof what, "warp %zu's barrier (__syncwarp, a shuffle, ldmatrix or mma)", w);
    list(&S.warps[w].bar, what);
  }
  abort();
}

// Runs the next ready fiber; `self` (suspended, waiting or done) resumes
// when someone switches back to it. With nothing ready, the block has
// ended (back to the launcher) or is deadlocked.
inline void run_next(Fiber& self) {
  if (S.ready_n > 0) {
    const int i = S.ready[S.ready_head];
    S.ready_head = (S.ready_head + 1) % S.ready.size();
    --S.ready_n;
    Fiber& next = S.fibers[i];
    if (&next != &self) switch_to(self, next);
    return;
  }
  if (S.live == 0) {
    switch_to(self, S.main);
    return;
  }
  deadlock();
}
inline void make_ready(int i) {
  S.ready[(S.ready_head + S.ready_n) % S.ready.size()] = i;
  ++S.ready_n;
  S.fibers[i].state = Fiber::kReady;
}
// Completes a barrier's phase: its waiters become ready, in the order they
// arrived after even phases and in the reverse order after odd ones (the
// last to arrive goes on first).
inline void release(Bar& b) {
  if (b.phase % 2 == 0)
    for (int i : b.waiters) make_ready(i);
  else
    for (auto it = b.waiters.rbegin(); it != b.waiters.rend(); ++it) make_ready(*it);
  b.waiters.clear();
  b.arrived = 0;
  ++b.phase;
}
// Waits until every participant of b has arrived (or dropped out).
inline void wait(Bar& b) {
  if (++b.arrived == b.expected) {
    release(b);
    return;
  }
  Fiber& self = *cur;
  b.waiters.push_back(self.index);
  self.state = Fiber::kWaiting;
  self.waits_on = &b;
  run_next(self);
}
// A participant leaves for good: the current phase, and every later one,
// waits for one fewer.
inline void drop(Bar& b) {
  --b.expected;
  if (b.arrived > 0 && b.arrived == b.expected) release(b);
}

inline Warp& warp() { return S.warps[T().warp]; }
inline void warp_wait() { wait(warp().bar); }
}  // namespace emu

inline void __syncthreads() { emu::wait(emu::S.block_bar); }
inline void __syncwarp() { emu::warp_wait(); }

namespace emu {
// Lane src_in_seg of the calling lane's segment of `width` lanes; a source
// outside the segment returns the lane's own value (as __shfl_down_sync
// past the end does). The exchange buffer alternates with the warp
// barrier's phase: a lane can write the one of phase p+2 only once every
// lane has arrived at phase p+1, after reading phase p's.
template <class V>
inline V shfl_from(V v, int src_in_seg, int width) {
  static_assert(sizeof(V) <= 8, "");
  if (width <= 0 || width > 32 || (width & (width - 1))) {
    fprintf(stderr, "bad shuffle width %d\n", width);
    abort();
  }
  Warp& w = warp();
  const int lane = T().lane;
  uint64_t* x = w.xchg[w.bar.phase & 1];
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(V));
  x[lane] = bits;
  wait(w.bar);
  const int seg = lane & ~(width - 1);
  const int src = src_in_seg >= 0 && src_in_seg < width ? seg + src_in_seg : lane;
  const uint64_t o = x[src];
  V r;
  memcpy(&r, &o, sizeof(V));
  return r;
}
inline void full_mask(unsigned mask) {
  if (mask != 0xffffffffu) {
    fprintf(stderr, "emulated shuffles take full masks only\n");
    abort();
  }
}
}  // namespace emu

template <class V>
inline V __shfl_xor_sync(unsigned mask, V v, int off, int width = 32) {
  emu::full_mask(mask);
  return emu::shfl_from(v, (emu::T().lane & (width - 1)) ^ off, width);
}
template <class V>
inline V __shfl_sync(unsigned mask, V v, int src, int width = 32) {
  emu::full_mask(mask);
  return emu::shfl_from(v, src & (width - 1), width);
}
template <class V>
inline V __shfl_down_sync(unsigned mask, V v, unsigned delta, int width = 32) {
  emu::full_mask(mask);
  const int i = (emu::T().lane & (width - 1)) + static_cast<int>(delta);
  return emu::shfl_from(v, i < width ? i : -1, width);
}

inline unsigned __umulhi(unsigned a, unsigned b) { return static_cast<unsigned>((static_cast<uint64_t>(a) * b) >> 32); }
inline float bits_to_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
// cvt.rna.tf32.f32: round the magnitude to 10 mantissa bits, ties away.
inline uint32_t emu_to_tf32(float x) {
  uint32_t b = float_to_bits(x);
  if ((b & 0x7f800000u) != 0x7f800000u) b += 0x1000u;
  return b & 0xffffe000u;
}

// cp.async (see the header comment).
namespace emu {
inline bool cp_eager() {
  static const bool e = getenv("EMU_CP_EAGER") != nullptr;
  return e;
}
inline void land(const Copy& c) {
  unsigned char* d = static_cast<unsigned char*>(c.dst);
  memset(d, 0, c.size);
  if (c.src_bytes > 0) memcpy(d, c.src, c.src_bytes);
}
// At a thread's end: copies still in flight would land after the block is
// gone, a bug. (Empty groups may be left.)
inline void cp_check_and_reset(CpState& s) {
  if (s.head < s.open_begin()) {
    fprintf(stderr, "a thread ended with cp.async copies not waited for\n");
    abort();
  }
  if (s.q.size() > s.open_begin()) {
    fprintf(stderr, "a thread ended with cp.async copies not committed\n");
    abort();
  }
  s.q.clear(), s.ends.clear(), s.head = 0, s.gh = 0;
}
}  // namespace emu
// Copies of 16 bytes so far, for tests that check which path a kernel took.
inline std::atomic<long> emu_cp16_count{0};
inline void emu_cp_async(void* dst, const void* src, int size, int src_bytes) {
  if (size == 16) emu_cp16_count.fetch_add(1, std::memory_order_relaxed);
  if (reinterpret_cast<uintptr_t>(dst) % size != 0 || (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % size != 0)) {
    fprintf(stderr, "misaligned cp.async of %d bytes\n", size);
    abort();
  }
  emu::Copy c{dst, src, size, src_bytes};
  if (emu::cp_eager())
    emu::land(c);
  else
    emu::cur->cp.q.push_back(c);
}
inline void emu_cp_async_commit() {
  auto& s = emu::cur->cp;
  s.ends.push_back(s.q.size());
}
// Lands the oldest groups until at most n are in flight.
inline void emu_cp_async_wait(int n) {
  auto& s = emu::cur->cp;
  while (static_cast<long>(s.ends.size() - s.gh) > n) {
    for (; s.head < s.ends[s.gh]; ++s.head) emu::land(s.q[s.head]);
    ++s.gh;
  }
  if (s.gh == s.ends.size()) {
    // Everything committed has landed: keep only the open group's copies.
    s.q.erase(s.q.begin(), s.q.begin() + s.head);
    s.ends.clear(), s.head = 0, s.gh = 0;
  }
}

// ldmatrix .x4 .b16 of 32-bit words: lane 8j+r gives row r of matrix j;
// lane l gets word l%4 of row l/4 of matrix j in r[j].
inline void emu_ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  emu::Warp& w = emu::warp();
  const int l = emu::T().lane;
  uint64_t* x = w.xchg[w.bar.phase & 1];
  x[l] = reinterpret_cast<uint64_t>(row);
  emu::wait(w.bar);
  for (int j = 0; j < 4; ++j) {
    const uint64_t a = x[8 * j + l / 4];
    if (a % 16 != 0) {
      fprintf(stderr, "misaligned ldmatrix row\n");
      abort();
    }
    memcpy(&r[j], reinterpret_cast<const unsigned char*>(a) + 4 * (l % 4), 4);
  }
}
inline unsigned char* emu_smem() { return emu::S.smem.data(); }

// mma.sync.m16n8k8 row.col f32.tf32.tf32.f32, per the PTX ISA fragment
// layout: lane 4g+t holds a = {A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]},
// b = {B[t][g], B[t+4][g]}, d = {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]}.
// Each lane reads the rows of A and columns of B of its four outputs from
// the lanes that hold them.
inline void emu_mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  emu::Warp& w = emu::warp();
  const int L = emu::T().lane;
  uint32_t* m = w.mma[w.bar.phase & 1];
  for (int i = 0; i < 4; ++i) m[L * 6 + i] = a[i];
  for (int i = 0; i < 2; ++i) m[L * 6 + 4 + i] = b[i];
  emu::wait(w.bar);
  // The MMA reads 19 bits of each operand.
  const auto tf = [](uint32_t u) { return bits_to_float(u & 0xffffe000u); };
  // Row g and g+8 of A (lanes 4g..4g+3: A[g][k] in register 2(k>=4),
  // A[g+8][k] in 1+2(k>=4)); columns 2t and 2t+1 of B (lanes 4c..4c+3:
  // B[k][c] in register 4+(k>=4)).
  const int g = L >> 2, t = L & 3;
  float a0[8], a1[8], b0[8], b1[8];
  for (int k = 0; k < 8; ++k) {
    const uint32_t* ra = m + (4 * g + (k & 3)) * 6 + 2 * (k >> 2);
    a0[k] = tf(ra[0]);
    a1[k] = tf(ra[1]);
    b0[k] = tf(m[(8 * t + (k & 3)) * 6 + 4 + (k >> 2)]);
    b1[k] = tf(m[(8 * t + 4 + (k & 3)) * 6 + 4 + (k >> 2)]);
  }
  // d = {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]}, each summed over
  // k in increasing order (the four sums side by side).
  float s0 = d[0], s1 = d[1], s2 = d[2], s3 = d[3];
  for (int k = 0; k < 8; ++k) {
    s0 += a0[k] * b0[k];
    s1 += a0[k] * b1[k];
    s2 += a1[k] * b0[k];
    s3 += a1[k] * b1[k];
  }
  d[0] = s0, d[1] = s1, d[2] = s2, d[3] = s3;
}

namespace emu {
// A fiber's life: for each block of the launch, the kernel, the end of
// thread checks, leaving the block's barriers, and the next fiber.
inline void fiber_main(Fiber* f) {
#ifdef EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);  // the first switch here
#endif
  for (;;) {
    S.body(S.arg);
    cp_check_and_reset(f->cp);
    drop(S.warps[f->t.warp].bar);
    drop(S.block_bar);
    f->state = Fiber::kDone;
    --S.live;
    run_next(*f);  // resumed for the next block
  }
}
#ifdef EMU_UCONTEXT
inline void fiber_entry(unsigned lo, unsigned hi) {
  fiber_main(reinterpret_cast<Fiber*>((uintptr_t(hi) << 32) | lo));
}
#endif
// A fiber that starts in fiber_main(f) on stack i.
inline void make_fiber(Fiber& f, int i) {
  f.stack = stack(i);
  f.stack_size = kStackBytes;
#ifdef EMU_UCONTEXT
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack;
  f.ctx.uc_stack.ss_size = f.stack_size;
  f.ctx.uc_link = nullptr;
  const uintptr_t a = reinterpret_cast<uintptr_t>(&f);
  makecontext(&f.ctx, reinterpret_cast<void (*)()>(fiber_entry), 2, unsigned(a), unsigned(a >> 32));
#else
  uint64_t* top = reinterpret_cast<uint64_t*>(f.stack + f.stack_size);  // 16-byte aligned
  uint64_t* sp = top - 10;  // emu_fiber_start's return address at top-3: 16-byte aligned stack there
  uint32_t mxcsr;
  uint16_t fpucw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  memset(sp, 0, 10 * 8);
  memcpy(sp, &mxcsr, 4);
  memcpy(reinterpret_cast<char*>(sp) + 4, &fpucw, 2);
  sp[3] = reinterpret_cast<uint64_t>(&fiber_main);  // r13
  sp[4] = reinterpret_cast<uint64_t>(&f);           // r12
  sp[7] = reinterpret_cast<uint64_t>(&emu_fiber_start);
  f.sp = sp;
#endif
}

// Runs kernel k over grid x block with smem bytes of dynamic shared memory.
template <class P>
void launch(void (*k)(P), dim3 grid, dim3 block, size_t smem, const P& p) {
  const int nt = block.x * block.y * block.z;
  const int nw = (nt + 31) / 32;
  const long nblocks = long(grid.x) * grid.y * grid.z;
  if (nt <= 0 || nt > 1024 || nblocks <= 0) {
    fprintf(stderr, "bad launch: %ld blocks of %d threads\n", nblocks, nt);
    abort();
  }
  if (cur) {
    fprintf(stderr, "emu::launch from inside a kernel\n");
    abort();
  }
  struct Call {
    void (*k)(P);
    const P* p;
  } call{k, &p};
  S.body = [](const void* c) {
    const Call* cl = static_cast<const Call*>(c);
    cl->k(*cl->p);
  };
  S.arg = &call;
  S.fibers.clear();
  S.fibers.resize(nt);
  S.warps.resize(nw);
  S.ready.assign(nt, 0);
  for (int t = 0; t < nt; ++t) {
    Fiber& f = S.fibers[t];
    f.index = t;
    f.t.tid = uint3{static_cast<unsigned>(t % block.x), static_cast<unsigned>(t / block.x % block.y),
                    static_cast<unsigned>(t / (block.x * block.y))};
    f.t.bdim = block;
    f.t.gdim = grid;
    f.t.warp = t / 32;
    f.t.lane = t % 32;
    make_fiber(f, t);
  }
  for (long b = 0; b < nblocks; ++b) {
    const uint3 bid{static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                    static_cast<unsigned>(b / (long(grid.x) * grid.y))};
    S.block_bar.reset(nt);
    for (int w = 0; w < nw; ++w) {
      S.warps[w].bar.reset(std::min(32, nt - 32 * w));
      memset(S.warps[w].xchg, 0, sizeof S.warps[w].xchg);
      memset(S.warps[w].mma, 0, sizeof S.warps[w].mma);
    }
    S.smem.assign(smem + 16, 0xff);
    S.ready_head = 0, S.ready_n = 0;
    for (int t = 0; t < nt; ++t) {
      S.fibers[t].t.bid = bid;
      S.fibers[t].waits_on = nullptr;
      make_ready(b % 2 == 0 ? t : nt - 1 - t);
    }
    S.live = nt;
    run_next(S.main);
  }
  cur = nullptr;
}
}  // namespace emu
