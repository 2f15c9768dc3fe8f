// The token and position embeddings of the CUDA backend (backend.h), with the CPU backend's
// results (kernels/cpu/embedding.cc): forwards copy and add; backwards sum each gradient row in
// the CPU's order, so that they give the same bits on every run and no float atomics are needed.
//
// embedding_backward sorts the tokens first: key n = (local row of tokens[n], or R for a token
// outside [row_begin, row_end)) << pbits | n, pbits the bits of N − 1. The keys are unique, so
// their sorted order is unique too (cub's radix sort over the key's bits): each row's positions
// form one run, in increasing n. The block at a run's first key adds its rows of dout in that
// order, rounding to G after each addition as the CPU does: bit for bit the CPU's result.
//
// position_backward with documents gathers each table row's rows of dout alike (key: the row's
// position in its document, then n), summing a run in fp32 and adding it once, as the CPU does.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "strata/kernels/cuda/backend.h"
#include "strata/kernels/cuda/common.cuh"

namespace strata::ops::cuda {

namespace {

constexpr int kThreads = 256;
// The most blocks of a launch that strides over rows: several waves on any sm_80/sm_90 GPU.
constexpr int64_t kMaxBlocks = 4096;
// Threads of the row copy, each moving 2 to 16 bytes at a time.
constexpr int kCopyThreads = 128;

unsigned row_blocks(int64_t rows) {
  return unsigned(std::clamp<int64_t>(rows, 1, kMaxBlocks));
}

// out[n] (units) = rows[tokens[n] − row_begin] (units) for the tokens in [row_begin, row_end);
// a block per token row, striding. U: the widest copy unit the rows' addresses and width allow.
template <typename U>
__global__ void __launch_bounds__(kCopyThreads)
    gather_rows(U* out, const int32_t* tokens, const U* rows, int64_t N, int64_t units,
                int64_t row_begin, int64_t row_end) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const int64_t r = tokens[n];
    if (r < row_begin || r >= row_end) continue;
    const U* src = rows + (r - row_begin) * units;
    U* dst = out + n * units;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) dst[u] = src[u];
  }
}

// f(U{}) for the copy unit of `bytes` (16, 8, 4 or 2).
template <typename F>
void with_unit(size_t bytes, F&& f) {
  switch (bytes) {
    case 16:
      return f(uint4{});
    case 8:
      return f(uint2{});
    case 4:
      return f(uint32_t{});
    default:
      return f(uint16_t{});
  }
}

// The position table's row of row n: t = (pos0 + n) % T, or with documents (doc (B, seq), or
// nullptr) t − doc[b·seq + t] of sequence b = (pos0 + n) / T.
__device__ __forceinline__ int64_t table_row(int64_t n, int64_t T, int64_t pos0, const int32_t* doc,
                                             int64_t seq) {
  const int64_t t = (pos0 + n) % T;
  return doc != nullptr ? t - doc[(pos0 + n) / T * seq + t] : t;
}

// out (N, C) row n += wpe[table_row(n)] (C); a block per row, striding.
template <typename S>
__global__ void __launch_bounds__(kThreads)
    add_positions(S* out, const S* wpe, int64_t N, int64_t T, int64_t C, int64_t pos0,
                  const int32_t* doc, int64_t seq) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    S* o = out + n * C;
    const S* p = wpe + table_row(n, T, pos0, doc, seq) * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) o[c] = from_f<S>(to_f(o[c]) + to_f(p[c]));
  }
}

// dwpe (T, C) row t += Σ of dout (N, C) rows n ≡ t − pos0 (mod T), summed in fp32 in increasing
// n, then added once (the CPU's order). Grid (T, ⌈C / kThreads⌉): a thread per (t, c).
template <typename S, typename G>
__global__ void __launch_bounds__(kThreads)
    sum_positions(G* dwpe, const S* dout, int64_t N, int64_t T, int64_t C, int64_t pos0) {
  const int64_t t = blockIdx.x;
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int64_t n = ((t - pos0) % T + T) % T; n < N; n += T) acc += to_f(dout[n * C + c]);
  G* g = dwpe + t * C + c;
  *g = from_f<G>(to_f(*g) + acc);
}

// keys (N) of the position table's rows with documents: table_row(n) << pbits | n.
__global__ void __launch_bounds__(kThreads)
    position_keys(uint64_t* keys, const int32_t* doc, int64_t N, int64_t T, int64_t seq,
                  int64_t pos0, int pbits) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += stride) {
    keys[n] = (uint64_t(table_row(n, T, pos0, doc, seq)) << pbits) | uint64_t(n);
  }
}

// keys (N) as the file's comment says; R = row_end − row_begin.
__global__ void __launch_bounds__(kThreads)
    token_keys(uint64_t* keys, const int32_t* tokens, int64_t N, int64_t row_begin, int64_t row_end,
               int pbits) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; n < N; n += stride) {
    const int64_t r = tokens[n];
    const int64_t local = r >= row_begin && r < row_end ? r - row_begin : row_end - row_begin;
    keys[n] = (uint64_t(local) << pbits) | uint64_t(n);
  }
}

// drows (R, C) += the runs of sorted (N): the block at a run's first key (striding over keys)
// adds the run's dout (N, C) rows in key order, rounding to G after each addition, or with kOnce
// summing them in fp32 and adding the sum once. Grid (strided keys, ⌈C / kThreads⌉): a thread per
// channel of a run. The block stages the run's positions kThreads at a time in shared memory, so
// that its loads of dout overlap instead of waiting on each key in turn.
template <typename S, typename G, bool kOnce>
__global__ void __launch_bounds__(kThreads)
    add_row_runs(G* drows, const S* dout, const uint64_t* sorted, int64_t N, int64_t R, int64_t C,
                 int pbits) {
  __shared__ int64_t positions[kThreads];
  const int64_t c = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  const bool active = c < C;  // every thread takes part in the barriers
  const uint64_t position_mask = (uint64_t(1) << pbits) - 1;
  for (int64_t b = blockIdx.x; b < N; b += gridDim.x) {
    const uint64_t row = sorted[b] >> pbits;
    if (row >= uint64_t(R) || (b > 0 && (sorted[b - 1] >> pbits) == row)) continue;
    G* g = drows + int64_t(row) * C + c;
    float acc = active && !kOnce ? to_f(*g) : 0.0f;
    for (int64_t j0 = b;; j0 += kThreads) {
      // The keys in the run form a prefix of [j0, j0 + kThreads): the keys are sorted.
      const int64_t j = j0 + threadIdx.x;
      const bool in_run = j < N && (sorted[j] >> pbits) == row;
      if (in_run) positions[threadIdx.x] = int64_t(sorted[j] & position_mask);
      const int len = __syncthreads_count(in_run);
      if (active) {
        for (int k = 0; k < len; ++k) {
          if constexpr (kOnce) {
            acc += to_f(dout[positions[k] * C + c]);
          } else {
            acc = to_f(from_f<G>(acc + to_f(dout[positions[k] * C + c])));
          }
        }
      }
      __syncthreads();  // positions is rewritten next
      if (len < kThreads) break;
    }
    if (active) *g = from_f<G>(kOnce ? to_f(*g) + acc : acc);
  }
}

size_t align_up(size_t bytes) {
  constexpr size_t kAlign = 256;
  return (bytes + kAlign - 1) / kAlign * kAlign;
}

// N keys of end_bit bits, written by make_keys(keys) on `stream`, sorted (cub's radix sort) into
// runtime scratch, which holds them until the next use of the scratch.
template <typename F>
const uint64_t* sorted_keys(int64_t N, int end_bit, cudaStream_t stream, F&& make_keys) {
  const size_t key_bytes = align_up(size_t(N) * sizeof(uint64_t));
  size_t sort_bytes = 0;
  STRATA_CUDA_CHECK(
      cub::DeviceRadixSort::SortKeys(nullptr, sort_bytes, static_cast<const uint64_t*>(nullptr),
                                     static_cast<uint64_t*>(nullptr), N, 0, end_bit, stream));
  char* base = static_cast<char*>(scratch(2 * key_bytes + sort_bytes));
  uint64_t* keys = reinterpret_cast<uint64_t*>(base);
  uint64_t* sorted = reinterpret_cast<uint64_t*>(base + key_bytes);
  make_keys(keys);
  STRATA_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(base + 2 * key_bytes, sort_bytes, keys, sorted,
                                                   N, 0, end_bit, stream));
  return sorted;
}

}  // namespace

void embedding_forward(Tensor out, Tensor tokens, Tensor rows, int64_t row_begin, int64_t row_end) {
  const int64_t N = tokens.numel();
  if (N == 0) return;
  const size_t row_bytes = size_t(rows.numel() / (row_end - row_begin)) * dtype_size(rows.dtype);
  size_t unit = 16;
  while (unit > 2 &&
         (reinterpret_cast<uintptr_t>(out.data) % unit != 0 ||
          reinterpret_cast<uintptr_t>(rows.data) % unit != 0 || row_bytes % unit != 0)) {
    unit /= 2;
  }
  with_unit(unit, [&](auto u) {
    using U = decltype(u);
    gather_rows<U><<<row_blocks(N), kCopyThreads, 0, compute_stream()>>>(
        dev<U>(out), dev<const int32_t>(tokens), dev<const U>(rows), N,
        int64_t(row_bytes / sizeof(U)), row_begin, row_end);
    STRATA_CUDA_LAUNCHED();
  });
}

// drows (R, C) += dout's rows (N, C) summed per table row: make_keys(keys, pbits) writes each
// row n's key (its table row << pbits | n; table row R for rows outside the table), which are
// sorted so that each table row's run is summed in fp32 and added once (kOnce: runs are whole,
// as add_row_runs says).
template <bool kOnce, typename MakeKeys>
void add_rows_by_key(const char* op, Tensor drows, Tensor dout, int64_t N, int64_t R, int64_t C,
                     MakeKeys&& make_keys) {
  if (N == 0) return;
  const int pbits = std::bit_width(uint64_t(N - 1));
  const int end_bit = pbits + std::bit_width(uint64_t(R));  // keys < (R + 1) << pbits
  const cudaStream_t stream = compute_stream();
  const uint64_t* sorted =
      sorted_keys(N, end_bit, stream, [&](uint64_t* keys) { make_keys(keys, pbits, stream); });
  with_types(op, dout.dtype, drows.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    const dim3 grid(row_blocks(N), blocks_for(C, kThreads));
    add_row_runs<S, G, kOnce>
        <<<grid, kThreads, 0, stream>>>(dev<G>(drows), dev<const S>(dout), sorted, N, R, C, pbits);
    STRATA_CUDA_LAUNCHED();
  });
}

void embedding_backward(Tensor drows, Tensor dout, Tensor tokens, int64_t row_begin,
                        int64_t row_end) {
  const int64_t N = tokens.numel(), R = row_end - row_begin, C = drows.numel() / R;
  add_rows_by_key<false>("embedding_backward", drows, dout, N, R, C,
                         [&](uint64_t* keys, int pbits, cudaStream_t stream) {
                           token_keys<<<blocks_for(N, kThreads), kThreads, 0, stream>>>(
                               keys, dev<const int32_t>(tokens), N, row_begin, row_end, pbits);
                           STRATA_CUDA_LAUNCHED();
                         });
}

void position_forward(Tensor out, Tensor wpe, int64_t T, int64_t pos0, const int32_t* doc_begin,
                      int64_t seq) {
  const int64_t C = out.dim(-1), N = out.numel() / C;
  if (N == 0) return;
  with_type("position_forward", out.dtype, [&](auto s) {
    using S = decltype(s);
    add_positions<S><<<row_blocks(N), kThreads, 0, compute_stream()>>>(
        dev<S>(out), dev<const S>(wpe), N, T, C, pos0, doc_begin, seq);
    STRATA_CUDA_LAUNCHED();
  });
}

void position_backward(Tensor dwpe, Tensor dout, int64_t T, int64_t pos0, const int32_t* doc_begin,
                       int64_t seq) {
  const int64_t C = dout.dim(-1), N = dout.numel() / C;
  if (doc_begin != nullptr) {
    add_rows_by_key<true>("position_backward", dwpe, dout, N, T, C,
                          [&](uint64_t* keys, int pbits, cudaStream_t stream) {
                            position_keys<<<blocks_for(N, kThreads), kThreads, 0, stream>>>(
                                keys, doc_begin, N, T, seq, pos0, pbits);
                            STRATA_CUDA_LAUNCHED();
                          });
    return;
  }
  with_types("position_backward", dout.dtype, dwpe.dtype, [&](auto s, auto g) {
    using S = decltype(s);
    using G = decltype(g);
    const dim3 grid(unsigned(T), blocks_for(C, kThreads));
    sum_positions<S, G>
        <<<grid, kThreads, 0, compute_stream()>>>(dev<G>(dwpe), dev<const S>(dout), N, T, C, pos0);
    STRATA_CUDA_LAUNCHED();
  });
}

}  // namespace strata::ops::cuda
