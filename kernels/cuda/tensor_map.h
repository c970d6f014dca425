#pragma once
// TMA descriptors (CUtensorMap) for the attention kernel's tiles, made on the host per launch.
// The driver's encoder is reached through the runtime's entry-point query, so that nothing links
// libcuda and the CPU-only builds still load.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/device_utils.cuh"

namespace attnreplay::cuda_attention {

// Tiles of `box_rows` rows from (heads, rows, row_bytes) bytes, row after row: boxes 128 bytes
// wide in the 128-byte swizzle (rows of 64 bytes: 64 wide, 64-byte swizzle), the layout the
// kernel's MMA descriptors read. Rows past `rows` in a head arrive as zeros. A part of a wider
// buffer (a split of the keys) gives the whole buffer's row pitch (bytes) and rows per head.
inline CUtensorMap make_tile_map(const void* base, std::int64_t row_bytes, std::int64_t rows, std::int64_t heads,
                                 int box_rows, const char* what, std::int64_t row_pitch = 0,
                                 std::int64_t head_rows = 0) {
  if (row_pitch == 0) row_pitch = row_bytes;
  if (head_rows == 0) head_rows = rows;
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    ATTNREPLAY_CUDA_CHECK(
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || function == nullptr)
      throw std::runtime_error("attention kernel: the CUDA driver has no cuTensorMapEncodeTiled (TMA needs driver 12.0+)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  }();
  CUtensorMap map{};
  if (rows == 0 || heads == 0) return map;  // nothing to load: the kernel reads no box of it
  const cuuint32_t box_bytes = row_bytes >= 128 ? 128 : 64;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(row_bytes), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(heads)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(row_pitch), static_cast<cuuint64_t>(row_pitch * head_rows)};
  const cuuint32_t box[3] = {box_bytes, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult status =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, const_cast<void*>(base), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, box_bytes == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS)
    throw std::runtime_error(std::string("attention kernel: cuTensorMapEncodeTiled for ") + what + " failed (CUresult " +
                             std::to_string(static_cast<int>(status)) + ", rows of " + std::to_string(row_bytes) +
                             " bytes, " + std::to_string(rows) + " rows, " + std::to_string(heads) + " heads)");
  return map;
}

}  // namespace attnreplay::cuda_attention
