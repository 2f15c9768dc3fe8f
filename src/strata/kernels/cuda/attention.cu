// Causal self-attention on the GPU (backend.h attention_forward / attention_backward), flash-style:
// the probabilities are never stored. The CPU twin is kernels/cpu/attention.cc: the same grouped
// qkv layout, heads h = g·rep + r, causal mask, and AttentionShape's score settings: s_ij =
// scale·q_i·k_j (scale 1/sqrt(hd) unless given), soft-capped to cap·tanh(s_ij/cap) where softcap >
// 0, and with a window w > 0 query i sees only keys j > i − w (the tiles wholly outside it are
// skipped); with documents (doc_begin) only keys j >= doc_begin[b·seq + i], the key tiles wholly
// before a query tile's document, and the query tiles wholly after a key tile's, skipped alike.
//
// Forward: per (query tile, head), loop over the key/value tiles at or before the diagonal (and
// inside the window) with an online softmax (running row max m and sum l), O = Σ_j P_ij v_j / l;
// att (B, heads, T) fp32 keeps each row's lse = ln Σ_j exp(s_ij).
//
// Backward, with P_ij = exp(s_ij − lse_i), dP_ij = dO_i·v_j, dS_ij = P_ij (dP_ij − D_i) (times the
// cap's derivative 1 − tanh²(scale·q_i·k_j/cap) under a soft cap):
//   1. delta:  D_i = Σ_j P_ij dP_ij (= dO_i·O_i, but out is not an argument: this costs QKᵀ and
//      dO·Vᵀ, where recomputing O costs QKᵀ and P·V, and it needs no rounding of P), into
//      runtime scratch (B, heads, T) fp32;
//   2. dK, dV: per (key tile, kv group), loop over the group's rep query heads, then over the query
//      tiles at or after the diagonal (inside the window): dV_j = Σ P_ij dO_i,
//      dK_j = scale Σ dS_ij q_i;
//   3. dQ: per (query tile, head), loop over the key tiles at or before the diagonal (inside the
//      window):
//      dQ_i = scale Σ dS_ij k_j.
// Every output element is written by one block, summed in a fixed order: the same inputs give the
// same bits, with no atomics. Blocks of heavier tiles are issued first (tile index in blockIdx.z).
//
// bf16/fp16 run on tensor cores (mma.sync m16n8k16, fp32 accumulation; ldmatrix from padded
// shared-memory tiles, cp.async double buffering): 64 × 64 tiles, 4 warps of 16 rows, head dim
// padded to D = 64 or 128 with zeros; P and dS are rounded to S as the products' operands. fp32
// runs a SIMT path in fp32 throughout: 32 × 32 tiles, 8 warps, a warp per row, a lane per column.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "strata/kernels/cuda/backend.h"
#include "strata/kernels/cuda/common.cuh"

namespace strata::ops::cuda {

namespace {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;
constexpr int kMaxHeadDim = 128;

// Where the heads of one call live. Rows of qkv hold groups·(rep+2)·hd elements (per group g:
// its rep query heads, its key head, its value head); rows of out and dout groups·rep·hd
// (heads h = g·rep + r); lse and delta are (B, heads, T).
struct Heads {
  int T, heads, rep, hd;
  int64_t qkv_row, out_row;
  float scale;       // AttentionShape's, or 1/sqrt(hd) as the CPU computes it
  float scale_log2;  // scale · log2(e): scores in base 2
  float softcap;     // > 0: scores cap·tanh(s/cap)
  int window;        // > 0: query i sees keys j > i − window
  bool vec;          // hd a multiple of 8 and 16-byte aligned views: 16-byte copies
  // Documents, or nullptr: (B, seq) the position each row's document starts at (row i of batch
  // row b sees keys j >= doc[b·seq + i]).
  const int32_t* doc;
  int seq;

  __device__ int64_t q(int b, int h) const {
    return int64_t(b) * T * qkv_row + int64_t(h / rep) * (rep + 2) * hd + int64_t(h % rep) * hd;
  }
  __device__ int64_t k(int b, int g) const {
    return int64_t(b) * T * qkv_row + int64_t(g) * (rep + 2) * hd + int64_t(rep) * hd;
  }
  __device__ int64_t o(int b, int h) const { return int64_t(b) * T * out_row + int64_t(h) * hd; }
  __device__ int64_t stat(int b, int h) const { return (int64_t(b) * heads + h) * T; }

  // The score of a raw product x = q·k, in base e and in base 2 (x·scale_log2 uncapped, as
  // before soft caps existed), and the derivative of the capped score by the uncapped one.
  __device__ float capped(float x) const { return softcap * tanhf(x * scale / softcap); }
  __device__ float score(float x) const { return softcap > 0.0f ? capped(x) : x * scale; }
  __device__ float score2(float x) const {
    return softcap > 0.0f ? capped(x) * kLog2e : x * scale_log2;
  }
  __device__ float cap_slope(float x) const {
    const float t = tanhf(x * scale / softcap);
    return 1.0f - t * t;
  }
  // Where the document of row `row` (< T) of batch row b starts: 0 without documents.
  __device__ int begin(int b, int row) const {
    return doc != nullptr ? doc[int64_t(b) * seq + row] : 0;
  }
  // Key `key` is hidden from query `row`, whose document starts at `first`: after it, outside
  // its window, or before its document.
  __device__ bool hidden(int row, int key, int first) const {
    return key > row || (window > 0 && row - key >= window) || key < first;
  }
  // The first key tile (of `tile` rows) that a query tile of batch row b starting at row q0 sees,
  // and the last query tile (of nt) that sees a key tile starting at row k0.
  __device__ int first_key_tile(int b, int q0, int tile) const {
    const int first = window > 0 ? max(0, q0 - window + 1) : 0;
    return max(first, begin(b, q0)) / tile;
  }
  __device__ int last_query_tile(int b, int k0, int tile, int nt) const {
    int last = window > 0 ? min(nt - 1, (k0 + tile - 1 + window - 1) / tile) : nt - 1;
    if (doc == nullptr) return last;
    // The last row whose document starts at or before the tile's last key: doc is
    // non-decreasing and doc[i] <= i, so it lies in [k_last, T).
    const int k_last = min(k0 + tile, T) - 1;
    const int32_t* d = doc + int64_t(b) * seq;
    int lo = k_last, hi = T - 1;
    while (lo < hi) {
      const int mid = lo + (hi - lo + 1) / 2;
      if (d[mid] <= k_last) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return min(last, lo / tile);
  }
};

Heads heads_of(const AttentionShape& s, bool vec) {
  const float scale = s.scale != 0.0f ? s.scale : 1.0f / std::sqrt(float(s.hd));
  return {s.T,
          s.groups * s.rep,
          s.rep,
          s.hd,
          int64_t(s.groups) * (s.rep + 2) * s.hd,
          int64_t(s.groups) * s.rep * s.hd,
          scale,
          scale * kLog2e,
          s.softcap,
          s.window,
          vec,
          s.doc_begin,
          s.seq};
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

unsigned tiles(int T, int tile) {
  return unsigned((T + tile - 1) / tile);
}

// Launches kernel on the compute stream with `smem` bytes of dynamic shared memory (above the
// default 48 KiB for the larger tiles, which needs the kernel's opt-in).
template <typename... P, typename... A>
void launch(void (*kernel)(P...), dim3 grid, int threads, size_t smem, A&&... args) {
  STRATA_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<grid, threads, smem, compute_stream()>>>(std::forward<A>(args)...);
  STRATA_CUDA_LAUNCHED();
}

// --- tensor-core path (bf16, fp16) ---------------------------------------------------------------

constexpr int kTile = 64;      // queries or keys per tile
constexpr int kThreads = 128;  // 4 warps, 16 rows of a tile each
constexpr int kBlocks = 8;     // 8-column blocks (one mma's n) across a 64-wide score tile

// A (64, D) tile in shared memory, row stride D + 8 elements: the 16 bytes of padding put the
// 16-byte chunks that ldmatrix reads from 8 consecutive rows in 8 different bank groups.
template <int D>
struct Tile {
  static constexpr int ld = D + 8;
  static constexpr int elems = kTile * ld;
  static constexpr size_t bytes = elems * 2;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global → shared, asynchronously; zeros where !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most the newest group of this thread's copies is in flight.
__device__ __forceinline__ void cp_async_wait_prior() {
  asm volatile("cp.async.wait_group 1;\n" ::: "memory");
}

// Four 8×8 b16 matrices; lane l gives the address of row l % 8 of matrix l / 8 and receives
// in r[i] the elements (l / 4, 2·(l % 4) + {0, 1}) of matrix i; transposed, the elements
// (2·(l % 4) + {0, 1}, l / 4).
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldmatrix_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

// c (16×8 fp32) += a (16×16) · b (16×8). With g = lane / 4, t = lane % 4: c[0..1] is row g,
// columns 2t + {0, 1}, c[2..3] row g + 8; a[0] row g, columns 2t + {0, 1}, a[1] row g + 8, a[2]
// and a[3] the same 8 columns on; b0 rows 2t + {0, 1} of column g, b1 the same 8 rows on.
template <typename S>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two fp32 values as the S pair of one register (lo in the low half), rounded to nearest even.
template <typename S>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<S, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&r, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&r, &v, 4);
  }
  return r;
}

// Rows [r0, r0 + 64) of a head's (T, hd) view (row stride ld elements) into a tile: rows at or
// past T and columns at or past hd are zeros (padded columns then add nothing to a product).
// With h.vec, 16-byte cp.async copies (complete after a cp.async wait); else element copies.
template <int D, typename S>
__device__ __forceinline__ void load_tile(S* tile, const S* src, int64_t ld, int r0,
                                          const Heads& h) {
  if (h.vec) {
    constexpr int kChunks = D / 8;
    for (int c = threadIdx.x; c < kTile * kChunks; c += kThreads) {
      const int r = c / kChunks, col = c % kChunks * 8;
      const bool in = r0 + r < h.T && col < h.hd;
      cp_async16(tile + r * Tile<D>::ld + col, in ? src + int64_t(r0 + r) * ld + col : src, in);
    }
  } else {
    for (int e = threadIdx.x; e < kTile * D; e += kThreads) {
      const int r = e / D, col = e % D;
      tile[r * Tile<D>::ld + col] =
          r0 + r < h.T && col < h.hd ? src[int64_t(r0 + r) * ld + col] : from_f<S>(0.0f);
    }
  }
}

// 64 4-byte row values (fp32 lse or delta, int32 document starts) from rows [r0, r0 + 64) of
// stat (T); zeros past T.
template <typename V>
__device__ __forceinline__ void load_stats(V* dst, const V* stat, int r0, int T) {
  static_assert(sizeof(V) == 4, "cp_async4 copies 4-byte values");
  if (threadIdx.x < kTile) {
    const int r = r0 + threadIdx.x;
    cp_async4(dst + threadIdx.x, r < T ? stat + r : stat, r < T);
  }
}

// The tile's rows [0, T − r0) and columns [0, hd) to rows [r0, …) of a head's view.
template <int D, typename S>
__device__ __forceinline__ void store_tile(S* dst, int64_t ld, const S* tile, int r0,
                                           const Heads& h) {
  if (h.vec) {
    constexpr int kChunks = D / 8;
    for (int c = threadIdx.x; c < kTile * kChunks; c += kThreads) {
      const int r = c / kChunks, col = c % kChunks * 8;
      if (r0 + r < h.T && col < h.hd) {
        *reinterpret_cast<uint4*>(dst + int64_t(r0 + r) * ld + col) =
            *reinterpret_cast<const uint4*>(tile + r * Tile<D>::ld + col);
      }
    }
  } else {
    for (int e = threadIdx.x; e < kTile * D; e += kThreads) {
      const int r = e / D, col = e % D;
      if (r0 + r < h.T && col < h.hd) dst[int64_t(r0 + r) * ld + col] = tile[r * Tile<D>::ld + col];
    }
  }
}

// The A operands (16 × D) of tile rows [row0, row0 + 16), one per 16 columns.
template <int D, typename S>
__device__ __forceinline__ void load_rows(uint32_t (&a)[D / 16][4], const S* tile, int row0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    ldmatrix(a[kk], tile + (row0 + lane % 16) * Tile<D>::ld + kk * 16 + lane / 16 * 8);
  }
}

// acc (16 × 64) += the k-step kk of A · tileᵀ: a the A operand of columns [16kk, 16kk + 16);
// tile (64, D). acc[n] holds columns [8n, 8n + 8) (mma's layout).
template <int D, typename S>
__device__ __forceinline__ void times_tile_t(float (&acc)[kBlocks][4], const uint32_t (&a)[4],
                                             const S* tile, int kk) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n2 = 0; n2 < kBlocks / 2; ++n2) {
    uint32_t b[4];
    ldmatrix(
        b, tile + (n2 * 16 + lane % 8 + lane / 16 * 8) * Tile<D>::ld + kk * 16 + lane / 8 % 2 * 8);
    mma<S>(acc[2 * n2], a, b[0], b[1]);
    mma<S>(acc[2 * n2 + 1], a, b[2], b[3]);
  }
}
// acc (16 × 64) = A · tileᵀ: A (16 × D) given as its operands a (registers, load_rows) or as 16
// rows of a_tile from a_row0; tile (64, D).
template <int D, typename S>
__device__ __forceinline__ void rows_times_tile_t(float (&acc)[kBlocks][4],
                                                  const uint32_t (&a)[D / 16][4], const S* tile) {
#pragma unroll
  for (int n = 0; n < kBlocks; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) times_tile_t<D>(acc, a[kk], tile, kk);
}
template <int D, typename S>
__device__ __forceinline__ void rows_times_tile_t(float (&acc)[kBlocks][4], const S* a_tile,
                                                  int a_row0, const S* tile) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < kBlocks; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldmatrix(a, a_tile + (a_row0 + lane % 16) * Tile<D>::ld + kk * 16 + lane / 16 * 8);
    times_tile_t<D>(acc, a, tile, kk);
  }
}

// acc (16 × D) += P · tile: P (16 × 64) in mma's accumulator layout, rounded to S as the A
// operand; tile (64, D).
template <int D, typename S>
__device__ __forceinline__ void scores_times_tile(float (&acc)[D / 8][4],
                                                  const float (&p)[kBlocks][4], const S* tile) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int k2 = 0; k2 < kBlocks / 2; ++k2) {
    // Accumulator columns [16·k2, 16·k2 + 16) are exactly the A operand of that k-step.
    const uint32_t a[4] = {pack<S>(p[2 * k2][0], p[2 * k2][1]), pack<S>(p[2 * k2][2], p[2 * k2][3]),
                           pack<S>(p[2 * k2 + 1][0], p[2 * k2 + 1][1]),
                           pack<S>(p[2 * k2 + 1][2], p[2 * k2 + 1][3])};
#pragma unroll
    for (int d2 = 0; d2 < D / 16; ++d2) {
      uint32_t b[4];
      ldmatrix_trans(b, tile + (k2 * 16 + lane % 8 + lane / 8 % 2 * 8) * Tile<D>::ld + d2 * 16 +
                            lane / 16 * 8);
      mma<S>(acc[2 * d2], a, b[0], b[1]);
      mma<S>(acc[2 * d2 + 1], a, b[2], b[3]);
    }
  }
}

// acc (16 × D) · (f0 for row g, f1 for row g + 8) as S into tile rows [row0, row0 + 16).
template <int D, typename S>
__device__ __forceinline__ void stage_rows(S* tile, int row0, const float (&acc)[D / 8][4],
                                           float f0, float f1) {
  const int lane = threadIdx.x % 32;
  S* r = tile + (row0 + lane / 4) * Tile<D>::ld + 2 * (lane % 4);
#pragma unroll
  for (int d = 0; d < D / 8; ++d) {
    *reinterpret_cast<uint32_t*>(r + d * 8) = pack<S>(acc[d][0] * f0, acc[d][1] * f0);
    *reinterpret_cast<uint32_t*>(r + 8 * Tile<D>::ld + d * 8) =
        pack<S>(acc[d][2] * f1, acc[d][3] * f1);
  }
}

// Entry e of acc[n] sits at row g + 8·(e / 2), column 8n + 2t + e % 2 of its 16 × 64 tile.
__device__ __forceinline__ int acc_row(int e) {
  return threadIdx.x % 32 / 4 + e / 2 * 8;
}
__device__ __forceinline__ int acc_col(int n, int e) {
  return n * 8 + 2 * (threadIdx.x % 4) + e % 2;
}

// Forward. Grid (heads, B, query tiles); block: 4 warps of 16 queries. Shared: the query tile
// and two buffers each of key and value tiles (5 tiles). At D = 64, 4 blocks fit a Hopper SM's
// shared memory; the bound keeps the registers (128) from being what limits them.
template <typename S, int D>
__global__ void __launch_bounds__(kThreads, D == 64 ? 4 : 1)
    tc_forward(S* out, float* lse, const S* qkv, Heads hs) {
  extern __shared__ __align__(16) unsigned char smem[];
  S* sq = reinterpret_cast<S*>(smem);  // (64, D)
  S* sk = sq + Tile<D>::elems;         // 2 × (64, D)
  S* sv = sk + 2 * Tile<D>::elems;     // 2 × (64, D)
  const int h = blockIdx.x, b = blockIdx.y, qt = gridDim.z - 1 - blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = qt * kTile, row0 = q0 + warp * 16;  // this warp's first query
  const S* q = qkv + hs.q(b, h);
  const S* k = qkv + hs.k(b, h / hs.rep);
  const S* v = k + hs.hd;

  // Without out (the lse only, for selective recompute) neither values nor P·V are needed.
  const bool with_out = out != nullptr;
  const int j0 = hs.first_key_tile(b, q0, kTile);  // the first inside the window and document
  int first[2];  // where the documents of rows g and g + 8 of the warp start
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + acc_row(2 * r);
    first[r] = row < hs.T ? hs.begin(b, row) : 0;
  }
  load_tile<D>(sq, q, hs.qkv_row, q0, hs);
  load_tile<D>(sk + j0 % 2 * Tile<D>::elems, k, hs.qkv_row, j0 * kTile, hs);
  if (with_out) load_tile<D>(sv + j0 % 2 * Tile<D>::elems, v, hs.qkv_row, j0 * kTile, hs);
  cp_async_commit();

  uint32_t qa[D / 16][4];
  float o[D / 8][4] = {};
  // Rows g and g + 8 of the warp: running max (base-2 scores) and this thread's part of the sum.
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int j = j0; j <= qt; ++j) {
    if (j < qt) {
      const int nb = (j + 1) % 2;
      load_tile<D>(sk + nb * Tile<D>::elems, k, hs.qkv_row, (j + 1) * kTile, hs);
      if (with_out) load_tile<D>(sv + nb * Tile<D>::elems, v, hs.qkv_row, (j + 1) * kTile, hs);
    }
    cp_async_commit();
    cp_async_wait_prior();
    __syncthreads();
    if (j == j0) load_rows<D>(qa, sq, warp * 16);
    const S* kt = sk + j % 2 * Tile<D>::elems;
    const S* vt = sv + j % 2 * Tile<D>::elems;

    float s[kBlocks][4];
    rows_times_tile_t<D>(s, qa, kt);
#pragma unroll
    for (int n = 0; n < kBlocks; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = j * kTile + acc_col(n, e), row = row0 + acc_row(e);
        const bool masked = (j == qt && key > row) || (hs.window > 0 && row - key >= hs.window) ||
                            key < first[e / 2];
        s[n][e] = masked ? -INFINITY : hs.score2(s[n][e]);
      }
    }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int n = 0; n < kBlocks; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // Without a window or documents key 0 is never masked and the row max is finite from the
      // first tile on; with them, a row may see no key of its first tiles: its terms are 0 until
      // it does.
      const float base = mx == -INFINITY ? 0.0f : mx;
      corr[r] = exp2f(m[r] - base);
      m[r] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kBlocks; ++n) {
        s[n][2 * r] = exp2f(s[n][2 * r] - base);
        s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - base);
        sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      l[r] = l[r] * corr[r] + sum;
    }
    if (with_out) {
#pragma unroll
      for (int d = 0; d < D / 8; ++d) {
        o[d][0] *= corr[0];
        o[d][1] *= corr[0];
        o[d][2] *= corr[1];
        o[d][3] *= corr[1];
      }
      scores_times_tile<D>(o, s, vt);
    }
    __syncthreads();
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  if (lane % 4 == 0) {
    float* row_lse = lse + hs.stat(b, h);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + acc_row(2 * r);
      if (row < hs.T) row_lse[row] = m[r] * kLn2 + logf(l[r]);
    }
  }
  if (with_out) {
    // Each warp has read only its own 16 rows of the query tile: it stages its output there.
    stage_rows<D>(sq, warp * 16, o, 1.0f / l[0], 1.0f / l[1]);
    __syncthreads();
    store_tile<D>(out + hs.o(b, h), hs.out_row, sq, q0, hs);
  }
}

// Backward step 1, delta (B, heads, T). Grid (heads, B, query tiles); block: 4 warps of 16
// queries. Shared: the query and output-gradient tiles, two buffers each of key and value tiles.
template <typename S, int D>
__global__ void __launch_bounds__(kThreads)
    tc_delta(float* delta, const S* dout, const S* qkv, const float* lse, Heads hs) {
  extern __shared__ __align__(16) unsigned char smem[];
  S* sq = reinterpret_cast<S*>(smem);  // (64, D)
  S* sdo = sq + Tile<D>::elems;        // (64, D)
  S* sk = sdo + Tile<D>::elems;        // 2 × (64, D)
  S* sv = sk + 2 * Tile<D>::elems;     // 2 × (64, D)
  const int h = blockIdx.x, b = blockIdx.y, qt = gridDim.z - 1 - blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = qt * kTile, row0 = q0 + warp * 16;
  const S* k = qkv + hs.k(b, h / hs.rep);
  const S* v = k + hs.hd;

  const int j0 = hs.first_key_tile(b, q0, kTile);
  load_tile<D>(sq, qkv + hs.q(b, h), hs.qkv_row, q0, hs);
  load_tile<D>(sdo, dout + hs.o(b, h), hs.out_row, q0, hs);
  load_tile<D>(sk + j0 % 2 * Tile<D>::elems, k, hs.qkv_row, j0 * kTile, hs);
  load_tile<D>(sv + j0 % 2 * Tile<D>::elems, v, hs.qkv_row, j0 * kTile, hs);
  cp_async_commit();

  const float* row_lse = lse + hs.stat(b, h);
  // Rows g and g + 8 of the warp: lse in base 2 (0 past T: those rows are not written) and where
  // their documents start.
  float lse2[2];
  int first[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + acc_row(2 * r);
    lse2[r] = row < hs.T ? row_lse[row] * kLog2e : 0.0f;
    first[r] = row < hs.T ? hs.begin(b, row) : 0;
  }
  float acc[2] = {0.0f, 0.0f};  // this thread's part of D for rows g and g + 8
  for (int j = j0; j <= qt; ++j) {
    if (j < qt) {
      const int nb = (j + 1) % 2;
      load_tile<D>(sk + nb * Tile<D>::elems, k, hs.qkv_row, (j + 1) * kTile, hs);
      load_tile<D>(sv + nb * Tile<D>::elems, v, hs.qkv_row, (j + 1) * kTile, hs);
    }
    cp_async_commit();
    cp_async_wait_prior();
    __syncthreads();
    float s[kBlocks][4], dp[kBlocks][4];
    rows_times_tile_t<D>(s, sq, warp * 16, sk + j % 2 * Tile<D>::elems);
    rows_times_tile_t<D>(dp, sdo, warp * 16, sv + j % 2 * Tile<D>::elems);
#pragma unroll
    for (int n = 0; n < kBlocks; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = j * kTile + acc_col(n, e), row = row0 + acc_row(e);
        const bool masked = (j == qt && key > row) || (hs.window > 0 && row - key >= hs.window) ||
                            key < first[e / 2];
        const float p = masked ? 0.0f : exp2f(hs.score2(s[n][e]) - lse2[e / 2]);
        acc[e / 2] += p * dp[n][e];
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 1);
    acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], 2);
  }
  if (lane % 4 == 0) {
    float* row_delta = delta + hs.stat(b, h);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = row0 + acc_row(2 * r);
      if (row < hs.T) row_delta[row] = acc[r];
    }
  }
}

// Backward step 2, dK and dV. Grid (groups, B, key tiles); block: 4 warps of 16 keys, which
// compute the transposed products (keys as rows) so that each warp owns its rows of dK and dV.
// Shared: the key and value tiles; two buffers each of query and output-gradient tiles and of
// their rows' lse and delta.
template <typename S, int D>
__global__ void __launch_bounds__(kThreads)
    tc_dkdv(S* dqkv, const S* dout, const S* qkv, const float* lse, const float* delta, Heads hs) {
  extern __shared__ __align__(16) unsigned char smem[];
  S* sk = reinterpret_cast<S*>(smem);                                // (64, D)
  S* sv = sk + Tile<D>::elems;                                       // (64, D)
  S* sq = sv + Tile<D>::elems;                                       // 2 × (64, D)
  S* sdo = sq + 2 * Tile<D>::elems;                                  // 2 × (64, D)
  float* slse = reinterpret_cast<float*>(sdo + 2 * Tile<D>::elems);  // 2 × (64)
  float* sdelta = slse + 2 * kTile;                                  // 2 × (64)
  int* sfirst = reinterpret_cast<int*>(sdelta + 2 * kTile);          // 2 × (64) with documents
  const int g = blockIdx.x, b = blockIdx.y, kt = blockIdx.z;
  const int nt = gridDim.z;
  const int warp = threadIdx.x / 32;
  const int key0 = kt * kTile + warp * 16;  // this warp's first key
  // Steps: the group's query heads r in order, and for each the query tiles kt..last in order
  // (last: nt − 1, or the last inside the window and the documents).
  const int per_head = hs.last_query_tile(b, kt * kTile, kTile, nt) - kt + 1,
            steps = hs.rep * per_head;
  const auto fetch = [&](int step) {
    const int hq = g * hs.rep + step / per_head, qt = kt + step % per_head, buf = step % 2;
    load_tile<D>(sq + buf * Tile<D>::elems, qkv + hs.q(b, hq), hs.qkv_row, qt * kTile, hs);
    load_tile<D>(sdo + buf * Tile<D>::elems, dout + hs.o(b, hq), hs.out_row, qt * kTile, hs);
    load_stats(slse + buf * kTile, lse + hs.stat(b, hq), qt * kTile, hs.T);
    load_stats(sdelta + buf * kTile, delta + hs.stat(b, hq), qt * kTile, hs.T);
    if (hs.doc != nullptr) {
      load_stats(sfirst + buf * kTile, hs.doc + int64_t(b) * hs.seq, qt * kTile, hs.T);
    }
  };

  load_tile<D>(sk, qkv + hs.k(b, g), hs.qkv_row, kt * kTile, hs);
  load_tile<D>(sv, qkv + hs.k(b, g) + hs.hd, hs.qkv_row, kt * kTile, hs);
  fetch(0);
  cp_async_commit();

  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  for (int step = 0; step < steps; ++step) {
    if (step + 1 < steps) fetch(step + 1);
    cp_async_commit();
    cp_async_wait_prior();
    __syncthreads();
    const int qt = kt + step % per_head, buf = step % 2;
    const S* qs = sq + buf * Tile<D>::elems;
    const S* dos = sdo + buf * Tile<D>::elems;
    const float* ls = slse + buf * kTile;
    const float* dl = sdelta + buf * kTile;
    const int* fs = sfirst + buf * kTile;

    // Transposed scores and output-gradient products: rows this warp's keys, columns queries.
    float p[kBlocks][4], ds[kBlocks][4];
    rows_times_tile_t<D>(p, sk, warp * 16, qs);
    rows_times_tile_t<D>(ds, sv, warp * 16, dos);
    // The diagonal tile has keys after queries; the last tile has queries past T; with a window,
    // any tile may have queries past it, and with documents queries of later documents.
    const bool edge = qt == kt || qt == nt - 1 || hs.window > 0 || hs.doc != nullptr;
#pragma unroll
    for (int n = 0; n < kBlocks; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = acc_col(n, e), query = qt * kTile + c;
        const int first = hs.doc != nullptr ? fs[c] : 0;
        const bool masked = edge && (hs.hidden(query, key0 + acc_row(e), first) || query >= hs.T);
        const float x = p[n][e];
        p[n][e] = masked ? 0.0f : exp2f(hs.score2(x) - ls[c] * kLog2e);
        ds[n][e] = p[n][e] * (ds[n][e] - dl[c]);
        if (hs.softcap > 0.0f) ds[n][e] *= hs.cap_slope(x);
      }
    }
    scores_times_tile<D>(dv, p, dos);
    scores_times_tile<D>(dk, ds, qs);
    __syncthreads();
  }

  // Each warp has read only its own 16 rows of the key and value tiles: it stages dK and dV there.
  stage_rows<D>(sk, warp * 16, dk, hs.scale, hs.scale);
  stage_rows<D>(sv, warp * 16, dv, 1.0f, 1.0f);
  __syncthreads();
  S* dkg = dqkv + hs.k(b, g);
  store_tile<D>(dkg, hs.qkv_row, sk, kt * kTile, hs);
  store_tile<D>(dkg + hs.hd, hs.qkv_row, sv, kt * kTile, hs);
}

// Backward step 3, dQ. Grid (heads, B, query tiles); block: 4 warps of 16 queries. Shared: the
// query and output-gradient tiles, two buffers each of key and value tiles.
template <typename S, int D>
__global__ void __launch_bounds__(kThreads)
    tc_dq(S* dqkv, const S* dout, const S* qkv, const float* lse, const float* delta, Heads hs) {
  extern __shared__ __align__(16) unsigned char smem[];
  S* sq = reinterpret_cast<S*>(smem);  // (64, D)
  S* sdo = sq + Tile<D>::elems;        // (64, D)
  S* sk = sdo + Tile<D>::elems;        // 2 × (64, D)
  S* sv = sk + 2 * Tile<D>::elems;     // 2 × (64, D)
  const int h = blockIdx.x, b = blockIdx.y, qt = gridDim.z - 1 - blockIdx.z;
  const int warp = threadIdx.x / 32;
  const int q0 = qt * kTile, row0 = q0 + warp * 16;
  const S* k = qkv + hs.k(b, h / hs.rep);
  const S* v = k + hs.hd;

  const int j0 = hs.first_key_tile(b, q0, kTile);
  load_tile<D>(sq, qkv + hs.q(b, h), hs.qkv_row, q0, hs);
  load_tile<D>(sdo, dout + hs.o(b, h), hs.out_row, q0, hs);
  load_tile<D>(sk + j0 % 2 * Tile<D>::elems, k, hs.qkv_row, j0 * kTile, hs);
  load_tile<D>(sv + j0 % 2 * Tile<D>::elems, v, hs.qkv_row, j0 * kTile, hs);
  cp_async_commit();

  // Rows g and g + 8 of the warp: lse (base 2) and delta, 0 past T (those rows are not written),
  // and where their documents start.
  float lse2[2], dl[2];
  int first[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row0 + acc_row(2 * r);
    lse2[r] = row < hs.T ? lse[hs.stat(b, h) + row] * kLog2e : 0.0f;
    dl[r] = row < hs.T ? delta[hs.stat(b, h) + row] : 0.0f;
    first[r] = row < hs.T ? hs.begin(b, row) : 0;
  }
  float dq[D / 8][4] = {};
  for (int j = j0; j <= qt; ++j) {
    if (j < qt) {
      const int nb = (j + 1) % 2;
      load_tile<D>(sk + nb * Tile<D>::elems, k, hs.qkv_row, (j + 1) * kTile, hs);
      load_tile<D>(sv + nb * Tile<D>::elems, v, hs.qkv_row, (j + 1) * kTile, hs);
    }
    cp_async_commit();
    cp_async_wait_prior();
    __syncthreads();
    const S* kt = sk + j % 2 * Tile<D>::elems;
    float s[kBlocks][4], ds[kBlocks][4];
    rows_times_tile_t<D>(s, sq, warp * 16, kt);
    rows_times_tile_t<D>(ds, sdo, warp * 16, sv + j % 2 * Tile<D>::elems);
#pragma unroll
    for (int n = 0; n < kBlocks; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = j * kTile + acc_col(n, e), row = row0 + acc_row(e);
        const bool masked = (j == qt && key > row) || (hs.window > 0 && row - key >= hs.window) ||
                            key < first[e / 2];
        const float p = masked ? 0.0f : exp2f(hs.score2(s[n][e]) - lse2[e / 2]);
        ds[n][e] = p * (ds[n][e] - dl[e / 2]);
        if (hs.softcap > 0.0f) ds[n][e] *= hs.cap_slope(s[n][e]);
      }
    }
    scores_times_tile<D>(dq, ds, kt);
    __syncthreads();
  }

  // Each warp has read only its own 16 rows of the query tile: it stages dQ there.
  stage_rows<D>(sq, warp * 16, dq, hs.scale, hs.scale);
  __syncthreads();
  store_tile<D>(dqkv + hs.q(b, h), hs.qkv_row, sq, q0, hs);
}

template <typename S, int D>
void tc_attention_forward(S* out, float* lse, const S* qkv, const Heads& hs, int B) {
  const dim3 grid(unsigned(hs.heads), unsigned(B), tiles(hs.T, kTile));
  launch(tc_forward<S, D>, grid, kThreads, 5 * Tile<D>::bytes, out, lse, qkv, hs);
}

template <typename S, int D>
void tc_attention_backward(S* dqkv, const S* dout, const S* qkv, const float* lse, float* delta,
                           const Heads& hs, int B, int groups) {
  const unsigned nt = tiles(hs.T, kTile);
  const dim3 per_head(unsigned(hs.heads), unsigned(B), nt);
  launch(tc_delta<S, D>, per_head, kThreads, 6 * Tile<D>::bytes, delta, dout, qkv, lse, hs);
  // lse and delta of two query tiles, and their documents' starts where there are documents.
  const size_t stats = (hs.doc != nullptr ? 6 : 4) * kTile * sizeof(float);
  launch(tc_dkdv<S, D>, dim3(unsigned(groups), unsigned(B), nt), kThreads,
         6 * Tile<D>::bytes + stats, dqkv, dout, qkv, lse, static_cast<const float*>(delta), hs);
  launch(tc_dq<S, D>, per_head, kThreads, 6 * Tile<D>::bytes, dqkv, dout, qkv, lse,
         static_cast<const float*>(delta), hs);
}

// --- SIMT path (fp32) ----------------------------------------------------------------------------

constexpr int kRows = 32;                // rows (queries or keys) of a block, and columns per step
constexpr int kSimtThreads = 256;        // 8 warps
constexpr int kRowsPerWarp = kRows / 8;  // warp w owns rows w, w + 8, w + 16, w + 24
constexpr int kCols = kMaxHeadDim / 32;  // head-dim elements per lane: lane + 32c

// Rows [r0, r0 + 32) of a head's (T, hd) view (row stride ld) into a (32, hd) tile of row stride
// hd + 1 (so that a warp reading a column hits 32 banks); rows past T are zeros.
__device__ __forceinline__ void simt_load(float* tile, const float* src, int64_t ld, int r0,
                                          const Heads& h) {
  for (int e = threadIdx.x; e < kRows * h.hd; e += kSimtThreads) {
    const int r = e / h.hd, d = e % h.hd;
    tile[r * (h.hd + 1) + d] = r0 + r < h.T ? src[int64_t(r0 + r) * ld + d] : 0.0f;
  }
}

// Forward. Grid (heads, B, 32-row tiles); shared: the query tile, a key tile, a value tile. Lane
// l scores key k0 + l for one row at a time; the warp's rows keep their running max, sum and
// output (lane + 32c) in registers.
__global__ void __launch_bounds__(kSimtThreads)
    simt_forward(float* out, float* lse, const float* qkv, Heads hs) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int ld = hs.hd + 1;
  float* sq = reinterpret_cast<float*>(smem);  // (32, hd)
  float* sk = sq + kRows * ld;                 // (32, hd)
  float* sv = sk + kRows * ld;                 // (32, hd)
  const int h = blockIdx.x, b = blockIdx.y, qt = gridDim.z - 1 - blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = qt * kRows;
  const float* k = qkv + hs.k(b, h / hs.rep);
  simt_load(sq, qkv + hs.q(b, h), hs.qkv_row, q0, hs);

  float m[kRowsPerWarp], l[kRowsPerWarp], o[kRowsPerWarp][kCols] = {};
  int first[kRowsPerWarp];  // where the warp's rows' documents start
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int row = q0 + warp + 8 * i;
    m[i] = -INFINITY, l[i] = 0.0f, first[i] = row < hs.T ? hs.begin(b, row) : 0;
  }
  for (int j = hs.first_key_tile(b, q0, kRows); j <= qt; ++j) {
    __syncthreads();  // the previous tiles are read
    simt_load(sk, k, hs.qkv_row, j * kRows, hs);
    simt_load(sv, k + hs.hd, hs.qkv_row, j * kRows, hs);
    __syncthreads();
    float s[kRowsPerWarp] = {};
    for (int d = 0; d < hs.hd; ++d) {
      const float kd = sk[lane * ld + d];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) s[i] += sq[(warp + 8 * i) * ld + d] * kd;
    }
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int row = q0 + warp + 8 * i;
      const bool masked = hs.hidden(row, j * kRows + lane, first[i]);
      const float x = masked ? -INFINITY : hs.score(s[i]);
      const float mx = fmaxf(m[i], warp_max(x));
      // Key 0 is never masked without a window or documents (the max stays finite); with them, a
      // row may see no key of its first tiles: its terms are 0 until it does.
      const float base = mx == -INFINITY ? 0.0f : mx;
      const float corr = expf(m[i] - base);
      const float p = masked ? 0.0f : expf(x - base);
      m[i] = mx;
      l[i] = l[i] * corr + warp_sum(p);
#pragma unroll
      for (int c = 0; c < kCols; ++c) o[i][c] *= corr;
      for (int jj = 0; jj < kRows; ++jj) {
        const float pj = __shfl_sync(0xffffffffu, p, jj);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const int d = lane + 32 * c;
          if (d < hs.hd) o[i][c] += pj * sv[jj * ld + d];
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int row = q0 + warp + 8 * i;
    if (row >= hs.T) continue;
    if (lane == 0) lse[hs.stat(b, h) + row] = m[i] + logf(l[i]);
    if (out == nullptr) continue;
    float* orow = out + hs.o(b, h) + int64_t(row) * hs.out_row;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = lane + 32 * c;
      if (d < hs.hd) orow[d] = o[i][c] / l[i];
    }
  }
}

// Backward steps 1 (delta, dq == nullptr) and 3 (dQ, reading delta). Grid (heads, B, 32-row
// tiles); shared: the query and output-gradient tiles, a key tile, a value tile. Lane l takes key
// k0 + l for one row at a time.
__global__ void __launch_bounds__(kSimtThreads)
    simt_delta_dq(float* dqkv, float* delta, const float* dout, const float* qkv, const float* lse,
                  Heads hs) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int ld = hs.hd + 1;
  float* sq = reinterpret_cast<float*>(smem);  // (32, hd)
  float* sdo = sq + kRows * ld;                // (32, hd)
  float* sk = sdo + kRows * ld;                // (32, hd)
  float* sv = sk + kRows * ld;                 // (32, hd)
  const int h = blockIdx.x, b = blockIdx.y, qt = gridDim.z - 1 - blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int q0 = qt * kRows;
  const float* k = qkv + hs.k(b, h / hs.rep);
  simt_load(sq, qkv + hs.q(b, h), hs.qkv_row, q0, hs);
  simt_load(sdo, dout + hs.o(b, h), hs.out_row, q0, hs);

  // Per row of the warp: lse, delta (0 past T: those rows are not written), where its document
  // starts.
  float rl[kRowsPerWarp], rd[kRowsPerWarp], acc[kRowsPerWarp] = {}, dq[kRowsPerWarp][kCols] = {};
  int first[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int row = q0 + warp + 8 * i;
    rl[i] = row < hs.T ? lse[hs.stat(b, h) + row] : 0.0f;
    rd[i] = row < hs.T && dqkv != nullptr ? delta[hs.stat(b, h) + row] : 0.0f;
    first[i] = row < hs.T ? hs.begin(b, row) : 0;
  }
  for (int j = hs.first_key_tile(b, q0, kRows); j <= qt; ++j) {
    __syncthreads();  // the previous tiles are read
    simt_load(sk, k, hs.qkv_row, j * kRows, hs);
    simt_load(sv, k + hs.hd, hs.qkv_row, j * kRows, hs);
    __syncthreads();
    float s[kRowsPerWarp] = {}, dp[kRowsPerWarp] = {};
    for (int d = 0; d < hs.hd; ++d) {
      const float kd = sk[lane * ld + d], vd = sv[lane * ld + d];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        s[i] += sq[(warp + 8 * i) * ld + d] * kd;
        dp[i] += sdo[(warp + 8 * i) * ld + d] * vd;
      }
    }
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int row = q0 + warp + 8 * i;
      const float p =
          hs.hidden(row, j * kRows + lane, first[i]) ? 0.0f : expf(hs.score(s[i]) - rl[i]);
      if (dqkv == nullptr) {
        acc[i] += p * dp[i];
        continue;
      }
      float ds = p * (dp[i] - rd[i]);
      if (hs.softcap > 0.0f) ds *= hs.cap_slope(s[i]);
      for (int jj = 0; jj < kRows; ++jj) {
        const float dsj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const int d = lane + 32 * c;
          if (d < hs.hd) dq[i][c] += dsj * sk[jj * ld + d];
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int row = q0 + warp + 8 * i;
    if (dqkv == nullptr) {
      const float sum = warp_sum(acc[i]);
      if (row < hs.T && lane == 0) delta[hs.stat(b, h) + row] = sum;
      continue;
    }
    if (row >= hs.T) continue;
    float* dqrow = dqkv + hs.q(b, h) + int64_t(row) * hs.qkv_row;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = lane + 32 * c;
      if (d < hs.hd) dqrow[d] = dq[i][c] * hs.scale;
    }
  }
}

// Backward step 2, dK and dV. Grid (groups, B, 32-key tiles); shared: the key and value tiles,
// a query tile, an output-gradient tile and their rows' lse and delta. Warp w owns keys w + 8i;
// lane l takes query q0 + l for one key at a time.
__global__ void __launch_bounds__(kSimtThreads)
    simt_dkdv(float* dqkv, const float* dout, const float* qkv, const float* lse,
              const float* delta, Heads hs) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int ld = hs.hd + 1;
  float* sk = reinterpret_cast<float*>(smem);  // (32, hd)
  float* sv = sk + kRows * ld;                 // (32, hd)
  float* sq = sv + kRows * ld;                 // (32, hd)
  float* sdo = sq + kRows * ld;                // (32, hd)
  float* slse = sdo + kRows * ld;              // (32)
  float* sdelta = slse + kRows;                // (32)
  const int g = blockIdx.x, b = blockIdx.y, kt = blockIdx.z, nt = gridDim.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int k0 = kt * kRows;
  simt_load(sk, qkv + hs.k(b, g), hs.qkv_row, k0, hs);
  simt_load(sv, qkv + hs.k(b, g) + hs.hd, hs.qkv_row, k0, hs);

  float dk[kRowsPerWarp][kCols] = {}, dv[kRowsPerWarp][kCols] = {};
  const int qt_last = hs.last_query_tile(b, k0, kRows, nt);
  for (int r = 0; r < hs.rep; ++r) {
    const int hq = g * hs.rep + r;
    for (int qt = kt; qt <= qt_last; ++qt) {
      const int q0 = qt * kRows;
      __syncthreads();  // the previous tiles are read
      simt_load(sq, qkv + hs.q(b, hq), hs.qkv_row, q0, hs);
      simt_load(sdo, dout + hs.o(b, hq), hs.out_row, q0, hs);
      if (threadIdx.x < kRows) {
        const int row = q0 + threadIdx.x;
        slse[threadIdx.x] = row < hs.T ? lse[hs.stat(b, hq) + row] : 0.0f;
        sdelta[threadIdx.x] = row < hs.T ? delta[hs.stat(b, hq) + row] : 0.0f;
      }
      __syncthreads();
      float s[kRowsPerWarp] = {}, dp[kRowsPerWarp] = {};
      for (int d = 0; d < hs.hd; ++d) {
        const float qd = sq[lane * ld + d], od = sdo[lane * ld + d];
#pragma unroll
        for (int i = 0; i < kRowsPerWarp; ++i) {
          s[i] += qd * sk[(warp + 8 * i) * ld + d];
          dp[i] += od * sv[(warp + 8 * i) * ld + d];
        }
      }
      const int query = q0 + lane;
      const int first = query < hs.T ? hs.begin(b, query) : 0;
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const int key = k0 + warp + 8 * i;
        const bool masked = hs.hidden(query, key, first) || query >= hs.T;
        const float p = masked ? 0.0f : expf(hs.score(s[i]) - slse[lane]);
        float ds = p * (dp[i] - sdelta[lane]);
        if (hs.softcap > 0.0f) ds *= hs.cap_slope(s[i]);
        for (int jj = 0; jj < kRows; ++jj) {
          const float pj = __shfl_sync(0xffffffffu, p, jj);
          const float dsj = __shfl_sync(0xffffffffu, ds, jj);
#pragma unroll
          for (int c = 0; c < kCols; ++c) {
            const int d = lane + 32 * c;
            if (d < hs.hd) {
              dv[i][c] += pj * sdo[jj * ld + d];
              dk[i][c] += dsj * sq[jj * ld + d];
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int key = k0 + warp + 8 * i;
    if (key >= hs.T) continue;
    float* dkrow = dqkv + hs.k(b, g) + int64_t(key) * hs.qkv_row;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int d = lane + 32 * c;
      if (d < hs.hd) {
        dkrow[d] = dk[i][c] * hs.scale;
        dkrow[hs.hd + d] = dv[i][c];
      }
    }
  }
}

size_t simt_tiles_bytes(const Heads& hs, int n) {
  return size_t(n) * kRows * (hs.hd + 1) * 4;
}

// What the kernels and their grids (B in y, T's tiles in z: at most 65535 each) take.
void check_shape(const char* op, const AttentionShape& s) {
  STRATA_CHECK(s.hd <= kMaxHeadDim, op, ": the CUDA attention takes head dims up to ", kMaxHeadDim,
               ", got ", s.hd);
  STRATA_CHECK(s.B <= 65535 && tiles(s.T, kRows) <= 65535, op, ": B=", s.B, " T=", s.T,
               " exceed the CUDA attention's grid (B and T/32 at most 65535)");
  STRATA_CHECK(s.window == 0 || s.pos == nullptr, op,
               ": a window over positions other than 0..T-1 (context parallelism) runs on the CPU "
               "only");
  STRATA_CHECK(s.doc_begin == nullptr || (s.pos == nullptr && s.seq >= s.T), op,
               ": documents over positions other than 0..T-1 (context parallelism) run on the "
               "CPU only, and need seq >= T (got seq=",
               s.seq, ", T=", s.T, ")");
}

}  // namespace

void attention_forward(Tensor out, Tensor att, Tensor qkv, const AttentionShape& s) {
  constexpr const char* op = "attention_forward";
  check_shape(op, s);
  const bool vec =
      s.hd % 8 == 0 && aligned16(qkv.data) && (out.data == nullptr || aligned16(out.data));
  const Heads hs = heads_of(s, vec);
  with_type(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    if constexpr (std::is_same_v<S, float>) {
      launch(simt_forward, dim3(unsigned(hs.heads), unsigned(s.B), tiles(s.T, kRows)), kSimtThreads,
             simt_tiles_bytes(hs, 3), dev<float>(out), dev<float>(att), dev<const float>(qkv), hs);
    } else if (s.hd <= 64) {
      tc_attention_forward<S, 64>(dev<S>(out), dev<float>(att), dev<const S>(qkv), hs, s.B);
    } else {
      tc_attention_forward<S, 128>(dev<S>(out), dev<float>(att), dev<const S>(qkv), hs, s.B);
    }
  });
}

// `scratch` is sized for the CPU backend (its dscores); here delta lives in runtime scratch.
void attention_backward(Tensor dqkv, Tensor, Tensor dout, Tensor qkv, Tensor att,
                        const AttentionShape& s) {
  constexpr const char* op = "attention_backward";
  check_shape(op, s);
  const bool vec =
      s.hd % 8 == 0 && aligned16(qkv.data) && aligned16(dqkv.data) && aligned16(dout.data);
  const Heads hs = heads_of(s, vec);
  float* delta = static_cast<float*>(scratch(sizeof(float) * size_t(s.B) * hs.heads * s.T));
  const float* lse = dev<const float>(att);
  with_type(op, qkv.dtype, [&](auto z) {
    using S = decltype(z);
    if constexpr (std::is_same_v<S, float>) {
      const dim3 per_head(unsigned(hs.heads), unsigned(s.B), tiles(s.T, kRows));
      const size_t four = simt_tiles_bytes(hs, 4);
      launch(simt_delta_dq, per_head, kSimtThreads, four, static_cast<float*>(nullptr), delta,
             dev<const float>(dout), dev<const float>(qkv), lse, hs);
      launch(simt_dkdv, dim3(unsigned(s.groups), unsigned(s.B), tiles(s.T, kRows)), kSimtThreads,
             four + 2 * kRows * sizeof(float), dev<float>(dqkv), dev<const float>(dout),
             dev<const float>(qkv), lse, static_cast<const float*>(delta), hs);
      launch(simt_delta_dq, per_head, kSimtThreads, four, dev<float>(dqkv), delta,
             dev<const float>(dout), dev<const float>(qkv), lse, hs);
    } else if (s.hd <= 64) {
      tc_attention_backward<S, 64>(dev<S>(dqkv), dev<const S>(dout), dev<const S>(qkv), lse, delta,
                                   hs, s.B, s.groups);
    } else {
      tc_attention_backward<S, 128>(dev<S>(dqkv), dev<const S>(dout), dev<const S>(qkv), lse, delta,
                                    hs, s.B, s.groups);
    }
  });
}

}  // namespace strata::ops::cuda
