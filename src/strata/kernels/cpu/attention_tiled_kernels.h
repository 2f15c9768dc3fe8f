// The tiles and micro-kernels that the tiled attention kernels share (attention_tiled.cc, the
// whole causal sequence; attention_ring.cc, one block of a ring), and the soft cap, window and
// document helpers that the materialized kernel (attention.cc) uses too. Internal to those three
// files. Every element a tile loop computes is the same fp32 chain of operations in either tiled
// file, so a ring of one causal block gives the tiled kernel's forward bits.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "strata/kernels/cpu/vec.h"

namespace strata::kernels::tile {

// Query and key tile: 64 rows. Head dim and tile widths are padded to 16 floats (the widest
// vector) so that every row the products read or write is whole vectors.
constexpr int kTile = 64;
constexpr int kPad = 16;

inline int round_up(int x, int m) {
  return (x + m - 1) / m * m;
}

// The products' micro-kernels, one struct per instruction set (as pack_gemm's), written once as a
// macro because each function needs its set's target attribute:
//   block<R, NV>: c (R, NV·W) (+)= a (R, K) · b (K, NV·W), a[r·ars + k·acs], b's row k at
//     b + k·ldb. Each element is the fp32 fused-multiply-add chain over k in order, from 0 or
//     from c (add): its value does not depend on the block it is computed in;
//   gemm: c (M, N) (+)= a (M, K) · b (K, N), N a multiple of W, in blocks of 6 rows.
#define STRATA_TILE_KERNEL(NAME, TARGET, VEC, W_, NV_, LOAD, STORE, SET1, FMA, ZERO)               \
  struct NAME {                                                                                    \
    static constexpr int W = W_;                                                                   \
    template <int R, int NV>                                                                       \
    __attribute__((target(TARGET), always_inline)) static inline void block(                       \
        float* c, int64_t ldc, const float* a, int64_t ars, int64_t acs, const float* b,           \
        int64_t ldb, int K, bool add) {                                                            \
      VEC acc[R][NV];                                                                              \
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {                                        \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) {                                     \
          acc[r][v] = add ? LOAD(c + r * ldc + v * W) : ZERO();                                    \
        }                                                                                          \
      }                                                                                            \
      for (int k = 0; k < K; ++k) {                                                                \
        VEC bv[NV];                                                                                \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) {                                     \
          bv[v] = LOAD(b + k * ldb + v * W);                                                       \
        }                                                                                          \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {                                      \
          const VEC ar = SET1(a[r * ars + k * acs]);                                               \
          _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) {                                   \
            acc[r][v] = FMA(ar, bv[v], acc[r][v]);                                                 \
          }                                                                                        \
        }                                                                                          \
      }                                                                                            \
      _Pragma("GCC unroll 8") for (int r = 0; r < R; ++r) {                                        \
        _Pragma("GCC unroll 4") for (int v = 0; v < NV; ++v) {                                     \
          STORE(c + r * ldc + v * W, acc[r][v]);                                                   \
        }                                                                                          \
      }                                                                                            \
    }                                                                                              \
    template <int NV>                                                                              \
    __attribute__((target(TARGET))) static void rows(float* c, int64_t ldc, const float* a,        \
                                                     int64_t ars, int64_t acs, const float* b,     \
                                                     int64_t ldb, int M, int K, bool add) {        \
      int i = 0;                                                                                   \
      for (; i + 6 <= M; i += 6) {                                                                 \
        block<6, NV>(c + i * ldc, ldc, a + i * ars, ars, acs, b, ldb, K, add);                     \
      }                                                                                            \
      c += i * ldc, a += i * ars;                                                                  \
      switch (M - i) {                                                                             \
        case 5:                                                                                    \
          block<5, NV>(c, ldc, a, ars, acs, b, ldb, K, add);                                       \
          break;                                                                                   \
        case 4:                                                                                    \
          block<4, NV>(c, ldc, a, ars, acs, b, ldb, K, add);                                       \
          break;                                                                                   \
        case 3:                                                                                    \
          block<3, NV>(c, ldc, a, ars, acs, b, ldb, K, add);                                       \
          break;                                                                                   \
        case 2:                                                                                    \
          block<2, NV>(c, ldc, a, ars, acs, b, ldb, K, add);                                       \
          break;                                                                                   \
        case 1:                                                                                    \
          block<1, NV>(c, ldc, a, ars, acs, b, ldb, K, add);                                       \
          break;                                                                                   \
        default:                                                                                   \
          break;                                                                                   \
      }                                                                                            \
    }                                                                                              \
    __attribute__((target(TARGET))) static void gemm(float* c, int64_t ldc, const float* a,        \
                                                     int64_t ars, int64_t acs, const float* b,     \
                                                     int64_t ldb, int M, int N, int K, bool add) { \
      int n = 0;                                                                                   \
      for (; n + NV_ * W <= N; n += NV_ * W) {                                                     \
        rows<NV_>(c + n, ldc, a, ars, acs, b + n, ldb, M, K, add);                                 \
      }                                                                                            \
      for (; n < N; n += W) rows<1>(c + n, ldc, a, ars, acs, b + n, ldb, M, K, add);               \
    }                                                                                              \
  };

// GCC 12's AVX-512 intrinsics start their results from _mm512_undefined_*(), which its
// -Wmaybe-uninitialized reports as a use of an uninitialised value.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Blocks of 6 x 64 (24 of the 32 zmm registers) and of 6 x 16 (12 of the 16 ymm registers).
STRATA_TILE_KERNEL(Avx512, "avx512f", __m512, 16, 4, _mm512_loadu_ps, _mm512_storeu_ps,
                   _mm512_set1_ps, _mm512_fmadd_ps, _mm512_setzero_ps)
STRATA_TILE_KERNEL(Avx2, "avx2,fma", __m256, 8, 2, _mm256_loadu_ps, _mm256_storeu_ps,
                   _mm256_set1_ps, _mm256_fmadd_ps, _mm256_setzero_ps)
#pragma GCC diagnostic pop
#undef STRATA_TILE_KERNEL

// One thread's workspace for keys [0, T) (Tp = T rounded up to kTile, hdp = hd to kPad), carved
// from attention_tiled_workspace_floats(T, hd) floats.
struct Tiles {
  float *K, *Kt, *Vt, *dK, *dV;  // (Tp, hdp), (hdp, Tp), (hdp, Tp), (Tp, hdp), (Tp, hdp)
  float *Q, *dO, *dQ;            // (kTile, hdp) each
  float *P, *dP;                 // (kTile, Tp) each
  float* stats;                  // (2·kTile)
  Tiles(float* w, int Tp, int hdp) {
    const int64_t big = int64_t(Tp) * hdp, tile = int64_t(kTile) * hdp;
    const int64_t panel = int64_t(kTile) * Tp;
    K = w, Kt = K + big, Vt = Kt + big, dK = Vt + big, dV = dK + big;
    Q = dV + big, dO = Q + tile, dQ = dO + tile;
    P = dQ + tile, dP = P + panel, stats = dP + panel;
  }
};

// Floats of one thread's Tiles for keys [0, T).
inline size_t tiles_floats(int T, int hd) {
  const size_t Tp = size_t(round_up(T, kTile)), hdp = size_t(round_up(hd, kPad));
  return 5 * Tp * hdp + 3 * size_t(kTile) * hdp + 2 * size_t(kTile) * Tp + 2 * kTile;
}

// tanh(x) = 1 − 2/(e^{2x} + 1) through exp_approx, so that the loops calling it vectorise;
// absolute error about 1e-7, exactly ±1 where e^{2x} saturates.
inline float tanh_approx(float x) {
  return 1.0f - 2.0f / (exp_approx(2.0f * x) + 1.0f);
}

// The first of n keys, the one at row 0 at position kpos[0] (kpos nullptr: k, k + 1, …;
// increasing), at a position >= first.
inline int first_key_at(const int32_t* kpos, int64_t k, int n, int64_t first) {
  if (kpos == nullptr) return int(std::clamp<int64_t>(first - k, 0, n));
  return int(std::partition_point(kpos, kpos + n, [&](int32_t p) { return p < first; }) - kpos);
}

// The earliest position a query at position qp sees: inside its window (window > 0: above
// qp − window) and its document (docs: the sequence's document starts by position,
// AttentionScores::docs; nullptr: one document).
inline int64_t earliest_key(int64_t qp, int window, const int32_t* docs) {
  const int64_t first = window > 0 ? qp - window + 1 : 0;
  return docs != nullptr ? std::max<int64_t>(first, docs[qp]) : first;
}

// Which of a block's nk keys the mq rows of a query tile see: the rows are query rows q, q + 1, …
// at positions qpos[q + i] (qpos nullptr: q + i); the keys are key rows k, k + 1, … at positions
// kpos[k + j] (nullptr: k + j). Row i sees keys j < min(nk, diag + i + 1) (the causal mask on rows;
// diag >= nk: no mask) inside the window (window > 0) and the row's document (docs, as
// earliest_key). Returns [first, last): first a multiple of kTile, last the end of the keys any
// row sees (first >= last: none); lo and hi (mq) then hold row i's keys [lo, hi) counted from
// first (lo >= hi: none). The key tiles before `first` are those no row sees: the callers skip
// them.
struct TileKeys {
  int first, last;
};
inline TileKeys tile_keys(int* lo, int* hi, int mq, int nk, int diag, const int32_t* qpos,
                          int64_t q, const int32_t* kpos, int64_t k, int window,
                          const int32_t* docs) {
  int first = nk, last = 0;
  for (int i = 0; i < mq; ++i) {
    hi[i] = std::min(nk, diag + i + 1);
    lo[i] = 0;
    if (window > 0 || docs != nullptr) {
      const int64_t qp = qpos != nullptr ? qpos[q + i] : q + i;
      lo[i] =
          first_key_at(kpos != nullptr ? kpos + k : nullptr, k, nk, earliest_key(qp, window, docs));
    }
    if (lo[i] < hi[i]) first = std::min(first, lo[i]), last = std::max(last, hi[i]);
  }
  first = first / kTile * kTile;
  for (int i = 0; i < mq; ++i) lo[i] -= first, hi[i] -= first;
  return {first, last};
}

// Scores in place: each of rows (mq, nw) of row stride ld, x → cap·tanh(x·scale/cap).
inline void cap_scores(float* x, int64_t ld, int mq, int nw, float scale, float cap) {
  const float k = scale / cap;
  for (int i = 0; i < mq; ++i) {
    float* r = x + i * ld;
#pragma omp simd
    for (int j = 0; j < nw; ++j) r[j] = cap * tanh_approx(r[j] * k);
  }
}

// The vector width: AVX-512F where the CPU has it, unless attention_tiled_force_avx2 (never the
// thread count's). Defined in attention_tiled.cc.
bool wide();

// dst (rows_p, ld): rows [0, rows) of src (row stride lds, hd columns) widened; columns [hd, ld)
// and rows [rows, rows_p) zero.
template <typename S>
inline void pack_rows(float* dst, int64_t ld, const S* src, int64_t lds, int rows, int rows_p,
                      int hd) {
  for (int r = 0; r < rows; ++r) {
    float* d = dst + r * ld;
    const S* s = src + r * lds;
#pragma omp simd
    for (int c = 0; c < hd; ++c) d[c] = load(s[c]);
    for (int64_t c = hd; c < ld; ++c) d[c] = 0.0f;
  }
  for (int r = rows; r < rows_p; ++r) std::fill(dst + r * ld, dst + (r + 1) * ld, 0.0f);
}

// dst (hd, ld) = the first `rows` rows of src (row stride lds, hd columns) transposed and
// widened; columns [rows, cols_p) zero. In blocks of 16 rows so each read row and written
// column stays in cache.
template <typename S>
inline void pack_transposed(float* dst, int64_t ld, const S* src, int64_t lds, int rows, int cols_p,
                            int hd) {
  for (int r0 = 0; r0 < rows; r0 += 16) {
    const int r1 = std::min(rows, r0 + 16);
    for (int d = 0; d < hd; ++d) {
      float* o = dst + d * ld;
      for (int r = r0; r < r1; ++r) o[r] = load(src[r * lds + d]);
    }
  }
  for (int d = 0; d < hd; ++d) std::fill(dst + d * ld + rows, dst + d * ld + cols_p, 0.0f);
}

// Forward of one query tile of one head: an online softmax over the key tiles of keys [0, nk).
// Q (mq, hdp) the packed queries; Kt (hd, ldk) the keys transposed, zero in columns
// [nk, round_up(nk, W)); V (nk, hdp) the values. Query row i sees keys [lo[i], hi[i]) (tile_keys;
// key tiles that no row sees are skipped). Scores are q·k·scale, soft-capped where softcap > 0.
// Leaves m, l (mq) the running maximum and sum of the scores (-inf and 0 for a row that sees no
// key) and acc (mq, hdp) the unnormalised output Σ_j p_ij v_j; acc nullptr: m and l only (the
// lse). Sc (mq, kTile) is scratch.
template <class Kern>
inline __attribute__((always_inline)) void forward_tile(float* acc, float* m, float* l, float* Sc,
                                                        const float* Q, const float* Kt,
                                                        int64_t ldk, const float* V, int hdp,
                                                        int hd, int mq, int nk, const int* lo,
                                                        const int* hi, float scale, float softcap) {
  constexpr int W = Kern::W;
  std::fill(m, m + mq, -INFINITY);
  std::fill(l, l + mq, 0.0f);
  const float sc = softcap > 0.0f ? 1.0f : scale;  // what multiplies the scores below
  bool started = false;                            // acc holds a tile's products
  for (int j0 = 0; j0 < nk; j0 += kTile) {
    const int jn = std::min(nk, j0 + kTile) - j0, nw = round_up(jn, W);
    bool seen = false;
    for (int i = 0; i < mq; ++i) seen |= std::max(lo[i], j0) < std::min(hi[i], j0 + jn);
    if (!seen) continue;
    Kern::gemm(Sc, kTile, Q, hdp, 1, Kt + j0, ldk, mq, nw, hd, false);
    if (softcap > 0.0f) cap_scores(Sc, kTile, mq, nw, scale, softcap);
    for (int i = 0; i < mq; ++i) {
      float* x = Sc + i * kTile;                               // (nw)
      const int a = lo[i] - j0, n = std::min(jn, hi[i] - j0);  // keys [a, n) of row i here
      float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
      for (int j = 0; j < nw; ++j) {
        const float v = x[j] * sc;
        x[j] = v;
        mx = std::max(mx, select_f32(j >= a && j < n, v, -INFINITY));
      }
      const float mn = std::max(m[i], mx);
      const float base = mn == -INFINITY ? 0.0f : mn;  // a row that has seen no key yet: all 0
      const float alpha = exp_approx(m[i] - base);     // 0 on the row's first keys (m = -inf)
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < nw; ++j) {
        const float p = select_f32(j >= a && j < n, exp_approx(x[j] - base), 0.0f);
        x[j] = p;
        sum += p;
      }
      l[i] = l[i] * alpha + sum;
      m[i] = mn;
      if (acc != nullptr && started) {
        float* o = acc + i * hdp;
#pragma omp simd
        for (int d = 0; d < hdp; ++d) o[d] *= alpha;
      }
    }
    if (acc != nullptr) {
      Kern::gemm(acc, hdp, Sc, kTile, 1, V + int64_t(j0) * hdp, hdp, mq, hdp, nw, started);
    }
    started = true;
  }
}

// Backward of one query tile of one head against keys [0, nk), row i seeing keys [lo[i], hi[i])
// (as forward_tile). Q, dO (mq, hdp) packed; K (nk, hdp) the keys; Kt, Vt (hd, ld) the keys and
// values transposed, zero in columns [nk, round_up(nk, W)); P, dP (mq, ld) scratch; row_lse (mq)
// the forward's lse of the rows; delta (mq) = rowsum(dO ∘ O), or nullptr: computed here as
// Σ_j P_ij dP_ij. Accumulates dV += Pᵀ dO and dK += dSᵀ Q (unscaled) and writes dQ (mq, hdp) =
// dS K (unscaled), dS the gradient of the scores before the soft cap.
template <class Kern>
inline __attribute__((always_inline)) void backward_tile(
    float* dQ, float* dK, float* dV, float* P, float* dP, const float* Q, const float* dO,
    const float* K, const float* Kt, const float* Vt, int64_t ld, const float* row_lse,
    const float* delta, int hdp, int hd, int mq, int nk, const int* lo, const int* hi, float scale,
    float softcap) {
  constexpr int W = Kern::W;
  const int nkp = round_up(nk, W);  // panel columns: keys [0, nk), zeros past nk
  // Raw scores and dP = dO·Vᵀ for every key the tile's rows see.
  for (int j0 = 0; j0 < nk; j0 += kTile) {
    const int nw = round_up(std::min(nk, j0 + kTile) - j0, W);
    Kern::gemm(P + j0, ld, Q, hdp, 1, Kt + j0, ld, mq, nw, hd, false);
    Kern::gemm(dP + j0, ld, dO, hdp, 1, Vt + j0, ld, mq, nw, hd, false);
  }
  // P = exp(score − lse) as the forward computed it; D_i = Σ_j P_ij dP_ij unless given;
  // dS = P ⊙ (dP − D), into dP. With a soft cap the score is cap·t, t = tanh(scale·raw/cap), and
  // dS is multiplied by its derivative 1 − t²: a first pass keeps t in P (and sums D), a second
  // makes P and dS of it.
  const float kc = softcap > 0.0f ? scale / softcap : 0.0f;
  for (int i = 0; i < mq; ++i) {
    float *p = P + int64_t(i) * ld, *dp = dP + int64_t(i) * ld;
    const int a = lo[i], n = std::min(nk, hi[i]);
    const float li = row_lse[i];
    float D = 0.0f;
    if (softcap > 0.0f) {
      if (delta == nullptr) {
#pragma omp simd reduction(+ : D)
        for (int j = 0; j < nkp; ++j) {
          const float t = tanh_approx(p[j] * kc);
          p[j] = t;
          D += select_f32(j >= a && j < n, exp_approx(softcap * t - li), 0.0f) * dp[j];
        }
      } else {
        D = delta[i];
#pragma omp simd
        for (int j = 0; j < nkp; ++j) p[j] = tanh_approx(p[j] * kc);
      }
#pragma omp simd
      for (int j = 0; j < nkp; ++j) {
        const float t = p[j];
        const float pj = select_f32(j >= a && j < n, exp_approx(softcap * t - li), 0.0f);
        p[j] = pj;
        dp[j] = pj * (dp[j] - D) * (1.0f - t * t);
      }
      continue;
    }
    if (delta == nullptr) {
#pragma omp simd reduction(+ : D)
      for (int j = 0; j < nkp; ++j) {
        const float pj = select_f32(j >= a && j < n, exp_approx(p[j] * scale - li), 0.0f);
        p[j] = pj;
        D += pj * dp[j];
      }
    } else {
      D = delta[i];
#pragma omp simd
      for (int j = 0; j < nkp; ++j) {
        p[j] = select_f32(j >= a && j < n, exp_approx(p[j] * scale - li), 0.0f);
      }
    }
#pragma omp simd
    for (int j = 0; j < nkp; ++j) dp[j] = p[j] * (dp[j] - D);
  }
  // dV_j += Pᵀ dO, dK_j += dSᵀ Q, per key tile.
  for (int j0 = 0; j0 < nk; j0 += kTile) {
    const int nw = round_up(std::min(nk, j0 + kTile) - j0, W);
    Kern::gemm(dV + int64_t(j0) * hdp, hdp, P + j0, 1, ld, dO, hdp, nw, hdp, mq, true);
    Kern::gemm(dK + int64_t(j0) * hdp, hdp, dP + j0, 1, ld, Q, hdp, nw, hdp, mq, true);
  }
  // dQ = dS K over keys [0, nk).
  Kern::gemm(dQ, hdp, dP, ld, 1, K, hdp, mq, hdp, nk, false);
}

}  // namespace strata::kernels::tile
