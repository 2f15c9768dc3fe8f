// The linear layers' bias gradient, db (N) += Σ_rows dy (M, N), as the CPU backend's linear_dbias
// computes it (fp32 sums, db rounded once), summed in a fixed order: the grid and the order are
// gemm_plan.h's bias_grad_launch.
#include "strata/kernels/cuda/common.cuh"
#include "strata/kernels/cuda/gemm_plan.h"

namespace strata::ops::cuda {

namespace {

// Block (bx, by): columns [32·bx, +32) of dy's rows [chunk_rows·by, +chunk_rows). With
// partial == nullptr (one chunk) the sums go into db; otherwise into partial (gridDim.y, N).
template <typename S, typename G>
__global__ void __launch_bounds__(kBiasGradCols* kBiasGradRowThreads)
    bias_grad_chunk(G* db, float* partial, const S* dy, int64_t M, int64_t N, int64_t chunk_rows) {
  __shared__ float sums[kBiasGradRowThreads][kBiasGradCols];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t col = int64_t(blockIdx.x) * kBiasGradCols + tx;
  const int64_t r0 = int64_t(blockIdx.y) * chunk_rows;
  const int64_t r1 = r0 + chunk_rows < M ? r0 + chunk_rows : M;
  float acc = 0.0f;
  if (col < N) {
    for (int64_t r = r0 + ty; r < r1; r += kBiasGradRowThreads) acc += to_f(dy[r * N + col]);
  }
  sums[ty][tx] = acc;
  __syncthreads();
  if (ty != 0 || col >= N) return;
  float s = sums[0][tx];
#pragma unroll
  for (int j = 1; j < kBiasGradRowThreads; ++j) s += sums[j][tx];
  if (partial == nullptr) {
    db[col] = from_f<G>(to_f(db[col]) + s);
  } else {
    partial[int64_t(blockIdx.y) * N + col] = s;
  }
}

// db (N) += Σ_c partial (chunks, N), chunk by chunk in order.
template <typename G>
__global__ void bias_grad_finish(G* db, const float* partial, int64_t chunks, int64_t N) {
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= N) return;
  float s = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) s += partial[c * N + col];
  db[col] = from_f<G>(to_f(db[col]) + s);
}

}  // namespace

void bias_grad(Tensor db, Tensor dy) {
  const int64_t N = db.numel(), M = N > 0 ? dy.numel() / N : 0;
  if (M == 0 || N == 0) return;
  const BiasGradLaunch l = bias_grad_launch(M, N);
  float* partial = l.scratch_floats > 0
                       ? static_cast<float*>(scratch(l.scratch_floats * sizeof(float)))
                       : nullptr;
  const cudaStream_t stream = compute_stream();
  with_types("linear_backward_weight", dy.dtype, db.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    const dim3 grid(unsigned(l.col_blocks), unsigned(l.row_chunks));
    const dim3 block(kBiasGradCols, kBiasGradRowThreads);
    bias_grad_chunk<S, G>
        <<<grid, block, 0, stream>>>(dev<G>(db), partial, dev<const S>(dy), M, N, l.chunk_rows);
    STRATA_CUDA_LAUNCHED();
    if (partial == nullptr) return;
    constexpr int kThreads = 256;
    bias_grad_finish<G>
        <<<blocks_for(N, kThreads), kThreads, 0, stream>>>(dev<G>(db), partial, l.row_chunks, N);
    STRATA_CUDA_LAUNCHED();
  });
}

}  // namespace strata::ops::cuda
