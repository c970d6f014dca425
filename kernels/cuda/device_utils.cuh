#pragma once
// Device building blocks shared by the attention and quantization kernels: CUDA error checks that
// name the place, warp-level tensor-core MMA, ldmatrix and cp.async through inline PTX, and the
// conversions whose rounding docs/quantized.md fixes (RN to bf16/fp16, RN + satfinite to e4m3).
// C++17: nvcc compiles it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace attnreplay::cuda_attention {

// ---- Errors ----

inline void check_cuda(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + call + ": " +
                           cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

#define ATTNREPLAY_CUDA_CHECK(call) ::attnreplay::cuda_attention::check_cuda((call), #call, __FILE__, __LINE__)
// After a launch: a bad configuration shows up here, a fault in the kernel at the next sync.
#define ATTNREPLAY_CUDA_CHECK_LAUNCH(what) \
  ::attnreplay::cuda_attention::check_cuda(cudaGetLastError(), "launch of " what, __FILE__, __LINE__)

// ---- Shared memory and async copies ----

__device__ __forceinline__ std::uint32_t shared_address(const void* pointer) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(pointer));
}

// 16 bytes global -> shared without staging in registers; `valid` false writes 16 zero bytes
// (src-size 0), so that rows past the end of a sequence read as zeros, never as garbage (a NaN
// there would survive multiplication by a zero probability).
__device__ __forceinline__ void cp_async_16(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Four 8x8 matrices of 16-bit elements (or 8x16 bytes): lanes 8m..8m+7 give the row addresses of
// matrix m; register m of lane l gets row l/4, 4-byte column l%4 of matrix m.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* shared) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(shared))
               : "memory");
}
// The same, each matrix transposed: lane l gets 16-bit elements (2(l%4), l/4) and (2(l%4)+1, l/4).
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* shared) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(shared))
               : "memory");
}

// ---- Warp MMA ----
// Fragment layouts (PTX ISA, mma.m16n8k16 / m16n8k32), with g = lane / 4 and t = lane % 4:
//   A (16 x K, row-major), 4 registers: a0 row g, a1 row g + 8, a2 row g (upper half of K),
//     a3 row g + 8 (upper half); each holds K/8 consecutive columns starting at t * (K/8 per reg).
//   B (K x 8), 2 registers: column g, rows as A's columns (b0 lower half of K, b1 upper half).
//   C (16 x 8), 4 floats/ints: c0, c1 row g columns 2t, 2t + 1; c2, c3 the same for row g + 8.

template <typename Element>
__device__ __forceinline__ void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                          std::uint32_t b1) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<Element, __half>, "bf16 or fp16");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// INT8 x INT8 -> int32, exact.
__device__ __forceinline__ void mma_16832_s8(int (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                             std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// e4m3 x e4m3 -> fp32 (sm_89+).
__device__ __forceinline__ void mma_16832_e4m3(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                               std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// e4m3 x e4m3 -> fp16 accumulator: d0 = row g (columns 2t, 2t + 1), d1 = row g + 8, as half2.
__device__ __forceinline__ void mma_16832_e4m3_f16(std::uint32_t (&d)[2], const std::uint32_t (&a)[4],
                                                   std::uint32_t b0, std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f16.e4m3.e4m3.f16 {%0, %1}, {%2, %3, %4, %5}, {%6, %7}, {%0, %1};\n"
      : "+r"(d[0]), "+r"(d[1])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- Conversions ----

// 2^x by the SFU, as the GPU kinds of docs/quantized.md use (ex2.approx: 2^-inf = +0).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

template <typename Element>
__device__ __forceinline__ float to_float(Element x) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) return __bfloat162float(x);
  else return __half2float(x);
}

// Two floats rounded to nearest even into one register, `lo` in the low half (the lower column).
template <typename Element>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
}

// Four floats to e4m3 (RN, satfinite), x0 in the lowest byte. cvt puts its first source in the
// upper byte, hence the order.
__device__ __forceinline__ std::uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
  std::uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(x3), "f"(x2));
  return static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
}

__device__ __forceinline__ std::uint8_t to_e4m3(float x) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

}  // namespace attnreplay::cuda_attention
