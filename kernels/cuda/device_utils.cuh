#pragma once
// Device building blocks shared by the attention and quantization kernels: CUDA error checks that
// name the place, cp.async, mbarriers, TMA copies, register reallocation, named barriers and
// warpgroup-MMA fences and descriptors through inline PTX, and the conversions whose rounding
// docs/quantized.md fixes (RN to bf16/fp16, RN + satfinite to e4m3).
// C++17: nvcc compiles it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
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

// ---- Launches that overlap the kernel before them (programmatic dependent launch) ----

// How a launch orders after the work before it in its stream. after_all: once all of it is done.
// overlapping: its CTAs may start while the kernel just before it finishes (its last wave), and
// wait for that kernel in wait_for_prior_kernel() before reading anything it wrote. A kernel's
// completion must still imply that all work before it is complete, since the next kernel waits on
// it alone: a kernel whose CTAs do not wait has its last CTA wait, at its end
// (complete_after_prior_kernel). The first kernel of a chain is launched after_all, so that no
// CTA of a later one starts before the work before the chain (the previous call's attention, which
// reads what the chain writes) is complete.
enum class Order { after_all, overlapping };

// A bad configuration is reported here, naming `what`; a fault in the kernel at the next sync.
// `cluster` CTAs in a row (grid.x a multiple of it) are scheduled together as a thread block cluster.
template <typename... Params, typename... Args>
void launch_kernel_in_clusters(const char* what, void (*kernel)(Params...), dim3 grid, unsigned cluster, int threads,
                               std::size_t shared_bytes, Order order, cudaStream_t stream, const Args&... args) {
  cudaLaunchAttribute attributes[2] = {};
  unsigned count = 0;
  if (order == Order::overlapping) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count++].val.clusterDim = {cluster, 1, 1};
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  const cudaError_t status = cudaLaunchKernelEx(&config, kernel, args...);
  if (status != cudaSuccess) (void)cudaGetLastError();  // not left for the next call's check to report
  check_cuda(status, what, __FILE__, __LINE__);
}
template <typename... Params, typename... Args>
void launch_kernel(const char* what, void (*kernel)(Params...), dim3 grid, int threads, std::size_t shared_bytes,
                   Order order, cudaStream_t stream, const Args&... args) {
  launch_kernel_in_clusters(what, kernel, grid, 1, threads, shared_bytes, order, stream, args...);
}

// Returns once the kernel before this one (launched overlapping) is complete and its writes are
// visible; at once for a launch after_all.
__device__ __forceinline__ void wait_for_prior_kernel() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// For a kernel that reads nothing the kernels before it in its chain write: its CTAs need not wait
// for the kernel before it, and go on while that one finishes; its grid's last CTA waits, at its
// end, so that this launch completes after it.
__device__ __forceinline__ void complete_after_prior_kernel() {
  if (blockIdx.x == gridDim.x - 1 && blockIdx.y == gridDim.y - 1 && blockIdx.z == gridDim.z - 1) {
    wait_for_prior_kernel();
  }
}
// Lets the next kernel, if launched overlapping, start its CTAs once every CTA of this one has
// started or called this: into the SMs this kernel's last wave leaves idle.
__device__ __forceinline__ void let_next_kernel_start() { asm volatile("griddepcontrol.launch_dependents;\n" ::); }

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
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- Warpgroup MMA (sm_90a; the instructions themselves are in wgmma.cuh) ----

// Orders this thread's earlier register writes before the warpgroup MMAs that follow.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// The compiler does not know that an MMA in flight owns its registers: touching each one here,
// after wgmma_wait, keeps reads of D (and the reuse of A's registers) from moving above the wait.
template <typename T, int kCount>
__device__ __forceinline__ void fence_registers(T (&r)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) {
    if constexpr (std::is_same_v<T, float>) asm volatile("" : "+f"(r[i])::"memory");
    else asm volatile("" : "+r"(r[i])::"memory");
  }
}
// Named barriers (0 is __syncthreads'): sync waits until `threads` have arrived in all, counting
// itself; arrive counts itself and goes on.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// mbarriers (8 bytes of shared memory each): a phase completes when `count` arrivals are in.
__device__ __forceinline__ void mbarrier_init(std::uint64_t* barrier, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)), "r"(count) : "memory");
}
// One arrival on `barrier`.
__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(barrier)) : "memory");
}
// One arrival on `barrier`, whose phase now also waits for `bytes` of asynchronous copies; by the
// threads where `issue` holds, without a branch: code under a branch that only some threads of a
// warp take keeps the compiler from proving what follows warp-uniform.
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(std::uint64_t* barrier, int bytes, bool issue = true) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.u32 p, %2, 0;\n@p mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n}\n" ::"r"(
          shared_address(barrier)),
      "r"(bytes), "r"(static_cast<std::uint32_t>(issue))
      : "memory");
}
// Waits for the completion of the phase of `barrier` whose parity is `parity`.
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* barrier, int parity) {
  std::uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(barrier)), "r"(parity)
        : "memory");
  } while (done == 0);
}
// `parity` (0 or 1), in a form that depends on `a` and `b` as far as ptxas can tell: a wait given
// it is issued after they are computed. ptxas otherwise issues a wait's first try_wait as early as
// it can, and a try_wait that finds its phase incomplete may suspend the warp there, the work
// scheduled after it undone.
__device__ __forceinline__ int parity_after(int parity, float a, float b) {
  std::uint32_t at_least_one;  // (bits of a) ^ (bits of b), with its lowest bit set
  asm("{\n.reg .b32 x;\nxor.b32 x, %1, %2;\nor.b32 %0, x, 1;\n}\n" : "=r"(at_least_one) : "f"(a), "f"(b));
  return static_cast<int>(min(static_cast<std::uint32_t>(parity), at_least_one));
}
// Makes this thread's ordinary stores to shared memory visible to the async proxy (warpgroup MMAs
// reading their operands there); a barrier after it then makes all threads' stores visible.
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Makes initialized mbarriers visible to the copy engine (TMA), which completes their phases.
__device__ __forceinline__ void fence_mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// ---- Thread block clusters ----

// max(*word, value) into the copy of `word` in the shared memory of the cluster's CTA `rank`, whose
// mbarrier at `barrier`'s place counts the 4 bytes; no fence: the mbarrier's phase makes it visible.
__device__ __forceinline__ void cluster_max_into(unsigned* word, std::uint64_t* barrier, unsigned rank,
                                                 unsigned value) {
  std::uint32_t remote_word, remote_barrier;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote_word) : "r"(shared_address(word)), "r"(rank));
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote_barrier)
               : "r"(shared_address(barrier)), "r"(rank));
  asm volatile("red.async.relaxed.cluster.shared::cluster.mbarrier::complete_tx::bytes.max.u32 [%0], %1, [%2];\n" ::"r"(
                   remote_word),
               "r"(value), "r"(remote_barrier)
               : "memory");
}

// ---- Tensor memory access (TMA) ----

// One box of a 3-D tensor map (a CUtensorMap in kernel parameters, constant or global memory)
// at coordinates (x, y, z) into shared memory; its bytes count towards `barrier`'s phase. Boxes
// reaching past the tensor's bounds are filled with zeros.
// Issued by the threads where `issue` holds (branch-free, as mbarrier_arrive_expect_bytes).
__device__ __forceinline__ void tma_load_3d(void* shared, const void* tensor_map, int x, int y, int z,
                                            std::uint64_t* barrier, bool issue = true) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.u32 p, %6, 0;\n"
      "@p cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n}\n" ::"r"(
          shared_address(shared)),
      "l"(tensor_map), "r"(x), "r"(y), "r"(z), "r"(shared_address(barrier)), "r"(static_cast<std::uint32_t>(issue))
      : "memory");
}

// A warpgroup gives back (or takes) registers, so that another may have more: all of its threads
// execute it, and the counts of all warpgroups must fit the register file.
template <int kRegisters>
__device__ __forceinline__ void registers_decrease_to() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void registers_increase_to() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// A shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"): start address, leading
// and stride byte offsets, each >> 4; swizzle of 128 or 64 bytes.
__device__ __forceinline__ std::uint64_t matrix_descriptor(std::uint32_t address, std::uint32_t leading_bytes,
                                                           std::uint32_t stride_bytes, int swizzle_bytes) {
  const std::uint64_t mode = swizzle_bytes == 128 ? 1 : 2;
  return static_cast<std::uint64_t>((address & 0x3FFFF) >> 4) |
         (static_cast<std::uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<std::uint64_t>(stride_bytes >> 4) << 32) | (mode << 62);
}

// ---- Conversions ----

// 2^x by the SFU, as the GPU kinds of docs/quantized.md use (2^-inf = +0). .ftz flushes results
// below 2^-126 to zero; without it each exp2 costs three more instructions (a range check and two
// scalings), which the softmax of 64 scores a thread per key block feels.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
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

// round(y) as an INT8 code in the low byte, ties to even as __float2int_rn, for a y that rounds to
// at most 127 in magnitude, or a NaN: adding 1.5 · 2^23 leaves the integer in the low bits of the
// sum, and fmaxf takes a NaN sum to 1.5 · 2^23 − 256, whose low byte is 0, as __float2int_rn gives
// for a NaN. Three full-rate instructions, where the conversion and two clamps took a quarter-rate
// one and two more.
__device__ __forceinline__ std::uint32_t int8_code_bits(float y) {
  return __float_as_uint(fmaxf(__fadd_rn(y, 12582912.0f), 12582656.0f));
}

// The same for any y, clamped to ±127 (±inf included): a quarter-rate conversion and two clamps,
// for a group whose inverse overflowed (its max |x| below fp32's normal range).
__device__ __forceinline__ std::uint32_t int8_code_bits_clamped(float y) {
  return static_cast<std::uint32_t>(max(-127, min(127, __float2int_rn(y))));
}

// The low bytes of four words as one, a's in the lowest byte: four INT8 codes.
__device__ __forceinline__ std::uint32_t pack_low_bytes(std::uint32_t a, std::uint32_t b, std::uint32_t c,
                                                        std::uint32_t d) {
  return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

// Four floats to e4m3 (RN, satfinite), x0 in the lowest byte. cvt puts its first source in the
// upper byte, hence the order.
__device__ __forceinline__ std::uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
  std::uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(x3), "f"(x2));
  return static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
}

}  // namespace attnreplay::cuda_attention
