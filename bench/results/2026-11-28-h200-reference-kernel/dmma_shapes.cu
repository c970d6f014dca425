// The fp64 MMA shapes on Hopper: their fragment layouts checked against a CPU product, and their
// rates with 8 independent accumulators per warp (nvcc -std=c++17 -arch=sm_90a -O3; dmma-shapes.txt).
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

__device__ __forceinline__ void mma884(double (&d)[2], double a, double b) {
  asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};\n"
               : "+d"(d[0]), "+d"(d[1]) : "d"(a), "d"(b));
}
__device__ __forceinline__ void mma1684(double (&d)[4], const double (&a)[2], const double (&b)[1]) {
  asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
               : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3]) : "d"(a[0]), "d"(a[1]), "d"(b[0]));
}
__device__ __forceinline__ void mma1688(double (&d)[4], const double (&a)[4], const double (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
               : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(b[0]), "d"(b[1]));
}
__device__ __forceinline__ void mma16816(double (&d)[4], const double (&a)[8], const double (&b)[4]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, {%0,%1,%2,%3};\n"
               : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
               : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]),
                 "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
}

// Assumed layouts (m16n8kK): A's element i is row g + 8*(i%2), col t + 4*(i/2); B's element i is
// row t + 4*i, col g; D's element i is row g + 8*(i/2), col 2t + i%2.
template <int K>
__global__ void check16(const double* A, const double* B, double* D) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  double a[K / 2], b[K / 4], d[4] = {0, 0, 0, 0};
  for (int i = 0; i < K / 2; ++i) a[i] = A[(g + 8 * (i % 2)) * K + t + 4 * (i / 2)];
  for (int i = 0; i < K / 4; ++i) b[i] = B[(t + 4 * i) * 8 + g];
  if constexpr (K == 4) mma1684(d, reinterpret_cast<double(&)[2]>(a), reinterpret_cast<double(&)[1]>(b));
  if constexpr (K == 8) mma1688(d, reinterpret_cast<double(&)[4]>(a), reinterpret_cast<double(&)[2]>(b));
  if constexpr (K == 16) mma16816(d, reinterpret_cast<double(&)[8]>(a), reinterpret_cast<double(&)[4]>(b));
  for (int i = 0; i < 4; ++i) D[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = d[i];
}

template <int K>
bool check_layout() {
  const int M = 16, N = 8;
  double hA[M * K], hB[K * N], hD[M * N], ref[M * N];
  for (int i = 0; i < M * K; ++i) hA[i] = (i * 37 % 101) / 7.0 - 5;
  for (int i = 0; i < K * N; ++i) hB[i] = (i * 53 % 97) / 11.0 - 4;
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += hA[r * K + k] * hB[k * N + c];
      ref[r * N + c] = s;
    }
  double *A, *B, *D;
  CK(cudaMalloc(&A, sizeof hA)); CK(cudaMalloc(&B, sizeof hB)); CK(cudaMalloc(&D, sizeof hD));
  CK(cudaMemcpy(A, hA, sizeof hA, cudaMemcpyHostToDevice)); CK(cudaMemcpy(B, hB, sizeof hB, cudaMemcpyHostToDevice));
  check16<K><<<1, 32>>>(A, B, D);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(hD, D, sizeof hD, cudaMemcpyDeviceToHost));
  double worst = 0;
  for (int i = 0; i < M * N; ++i) worst = fmax(worst, fabs(hD[i] - ref[i]) / fmax(1.0, fabs(ref[i])));
  printf("layout m16n8k%d: max rel diff %.3g -> %s\n", K, worst, worst < 1e-12 ? "OK" : "WRONG");
  return worst < 1e-12;
}

constexpr int kChains = 8;
template <int Shape>  // 0: m8n8k4, 4/8/16: m16n8kK, 1: DFMA
__global__ void rate(double* sink, int iters) {
  double acc[kChains][4];
  for (int c = 0; c < kChains; ++c) for (int e = 0; e < 4; ++e) acc[c][e] = 0;
  double a[8], b[4];
  for (int i = 0; i < 8; ++i) a[i] = 1e-3 * (threadIdx.x + i);
  for (int i = 0; i < 4; ++i) b[i] = 1e-3 * (threadIdx.x - i);
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if constexpr (Shape == 0) mma884(reinterpret_cast<double(&)[2]>(acc[c]), a[0], b[0]);
      if constexpr (Shape == 4) mma1684(acc[c], reinterpret_cast<double(&)[2]>(a), reinterpret_cast<double(&)[1]>(b));
      if constexpr (Shape == 8) mma1688(acc[c], reinterpret_cast<double(&)[4]>(a), reinterpret_cast<double(&)[2]>(b));
      if constexpr (Shape == 16) mma16816(acc[c], a, b);
      if constexpr (Shape == 1) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[c][e] = fma(a[e], b[e], acc[c][e]);
      }
    }
  }
  double s = 0;
  for (int c = 0; c < kChains; ++c) for (int e = 0; e < 4; ++e) s += acc[c][e];
  if (s == 12345.678) sink[0] = s;
}

template <int Shape>
void time_rate(const char* name, double fma_per_warp_op, int blocks_per_sm, int threads) {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  double* sink; CK(cudaMalloc(&sink, 8));
  const int iters = 20000;
  rate<Shape><<<sms * blocks_per_sm, threads>>>(sink, 100);
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  cudaEventRecord(e0);
  rate<Shape><<<sms * blocks_per_sm, threads>>>(sink, iters);
  cudaEventRecord(e1);
  CK(cudaEventSynchronize(e1));
  float ms; cudaEventElapsedTime(&ms, e0, e1);
  const double warps = double(sms) * blocks_per_sm * threads / 32;
  const double flops = 2 * warps * iters * kChains * fma_per_warp_op;
  printf("%-10s warps/SM %3d: %.1f TFLOP/s fp64 (%.2f ms)\n", name, blocks_per_sm * threads / 32, flops / ms / 1e9, ms);
  cudaFree(sink);
}

int main() {
  bool ok = check_layout<4>() & check_layout<8>() & check_layout<16>();
  for (int bps : {1, 2, 4}) {
    time_rate<0>("m8n8k4", 256, bps, 256);
    time_rate<4>("m16n8k4", 512, bps, 256);
    time_rate<8>("m16n8k8", 1024, bps, 256);
    time_rate<16>("m16n8k16", 2048, bps, 256);
    time_rate<1>("dfma", 32 * 4, bps, 256);
  }
  return ok ? 0 : 1;
}
