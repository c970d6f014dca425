#pragma once
// How many thread block clusters of a kernel the GPU holds at once: asked by the preparation's
// plans (kernels/cuda/quantize.cu) and reported with the device (replay/measure/cuda_clock.cu).
// C++17: nvcc compiles it.
#include <cuda_runtime.h>

#include <cstddef>

namespace attnreplay::cuda_attention {

// Clusters of `cluster` CTAs of `kernel` (`threads` threads and `shared_bytes` of dynamic shared
// memory a CTA) that the GPU holds at once, with the kernel's attributes as they stand; 0 where
// the runtime does not say (its error cleared, so that no later check reports it).
template <typename... Params>
int max_active_clusters(void (*kernel)(Params...), unsigned cluster, int threads, std::size_t shared_bytes) {
  cudaLaunchAttribute dimension{};
  dimension.id = cudaLaunchAttributeClusterDimension;
  dimension.val.clusterDim = {cluster, 1, 1};
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(cluster);
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = shared_bytes;
  config.attrs = &dimension;
  config.numAttrs = 1;
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return clusters;
}

}  // namespace attnreplay::cuda_attention
