// Elementwise kernels that package backend itself needs: filling 8-byte
// values (the driver's memsets stop at 32 bits), adding tensors for
// gorgonia's gradient accumulation (tensor.Adder), and axpy for an SGD step.
//
// Every kernel takes one params struct by value. backend/elementwise.go
// mirrors each struct field for field; all fields are 8 bytes wide, so Go
// and C++ lay them out identically with no padding, and the static_asserts
// below pin the sizes the Go side relies on.
//
// Every kernel is a grid-stride loop over 64-bit indices: tensors may pass
// 2^31 elements, and the launcher caps the grid at a few blocks per SM.

#include <cstdint>

#include "params_gen.cuh"

struct FillParams {
    uint64_t* out;
    int64_t n;       // number of 8-byte elements
    uint64_t value;  // bit pattern of the element (float64, int64, ...); stheno:uint64
};
static_assert(sizeof(FillParams) == 24, "backend/elementwise.go mirrors FillParams");
STHENO_PARAMS(FillParams);

// out = acc ? out + a + b : a + b. b is either a tensor (b != nullptr,
// b_stride 1), one element broadcast (b_stride 0, used for a scalar that
// lives on the device), or absent (b == nullptr), in which case scalar is
// added: Go scalars travel in the params instead of through a host-to-device
// copy, which would synchronise the stream.
struct AddParams {
    void* out;
    const void* a;
    const void* b;
    int64_t n;
    int64_t b_stride;
    double scalar;
};
static_assert(sizeof(AddParams) == 48, "backend/elementwise.go mirrors AddParams");
STHENO_PARAMS(AddParams);

// y += alpha * x.
struct AxpyParams {
    void* y;
    const void* x;
    int64_t n;
    double alpha;
};
static_assert(sizeof(AxpyParams) == 32, "backend/elementwise.go mirrors AxpyParams");
STHENO_PARAMS(AxpyParams);

__device__ __forceinline__ int64_t first_index() {
    return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t grid_stride() {
    return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

extern "C" __global__ void fill_u64(FillParams p) {
    for (int64_t i = first_index(); i < p.n; i += grid_stride()) {
        p.out[i] = p.value;
    }
}

template <typename T, bool Accumulate>
__device__ __forceinline__ void add(const AddParams& p) {
    T* out = static_cast<T*>(p.out);
    const T* a = static_cast<const T*>(p.a);
    const T* b = static_cast<const T*>(p.b);
    // Converting the double scalar to T once is exact for a float32 scalar
    // that the Go side widened to float64.
    const T s = static_cast<T>(p.scalar);
    for (int64_t i = first_index(); i < p.n; i += grid_stride()) {
        // out may alias a or b (gorgonia's unsafe add writes into a), so
        // every input is read before out is written.
        T v = a[i] + (b != nullptr ? b[i * p.b_stride] : s);
        if (Accumulate) {
            v = out[i] + v;
        }
        out[i] = v;
    }
}

extern "C" __global__ void add_f32(AddParams p) { add<float, false>(p); }
extern "C" __global__ void add_f64(AddParams p) { add<double, false>(p); }
extern "C" __global__ void add_acc_f32(AddParams p) { add<float, true>(p); }
extern "C" __global__ void add_acc_f64(AddParams p) { add<double, true>(p); }

template <typename T>
__device__ __forceinline__ void axpy(const AxpyParams& p) {
    T* y = static_cast<T*>(p.y);
    const T* x = static_cast<const T*>(p.x);
    const T alpha = static_cast<T>(p.alpha);
    for (int64_t i = first_index(); i < p.n; i += grid_stride()) {
        y[i] += alpha * x[i];
    }
}

extern "C" __global__ void axpy_f32(AxpyParams p) { axpy<float>(p); }
extern "C" __global__ void axpy_f64(AxpyParams p) { axpy<double>(p); }
