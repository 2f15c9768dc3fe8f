#include "strata/kernels/cpu/attention_tiled.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "strata/core/check.h"
#include "strata/core/memory.h"
#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/cpu_features.h"
#include "strata/kernels/cpu/vec.h"

namespace strata::kernels {

namespace {

// Query and key tile: 64 rows. Head dim and tile widths are padded to 16 floats (the widest
// vector) so that every row the products read or write is whole vectors.
constexpr int kTile = 64;
constexpr int kPad = 16;

int round_up(int x, int m) {
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

// Sizes and column offsets of one call. Query head h = g·rep + r.
struct Geom {
  int B, T, NH, KVH, hd, rep;
  int hdp, Tp;  // hd rounded up to kPad, T to kTile
  int64_t qkv_row, out_row;
  float scale;
  Geom(int B_, int T_, int NH_, int KVH_, int hd_)
      : B(B_), T(T_), NH(NH_), KVH(KVH_), hd(hd_), rep(KVH_ > 0 ? NH_ / KVH_ : 0) {
    STRATA_CHECK(NH > 0 && KVH > 0 && NH % KVH == 0, "attention needs heads (", NH,
                 ") to be a multiple of kv heads (", KVH, ")");
    STRATA_CHECK(B > 0 && T > 0 && hd > 0, "attention: empty shape B=", B, " T=", T, " hd=", hd);
    hdp = round_up(hd, kPad), Tp = round_up(T, kTile);
    qkv_row = int64_t(KVH) * (rep + 2) * hd, out_row = int64_t(NH) * hd;
    scale = 1.0f / std::sqrt(float(hd));
  }
  int64_t q_col(int g, int r) const { return (int64_t(g) * (rep + 2) + r) * hd; }
  int64_t k_col(int g) const { return (int64_t(g) * (rep + 2) + rep) * hd; }
  int64_t stat(int b, int h) const { return (int64_t(b) * NH + h) * T; }
  int tiles() const { return (T + kTile - 1) / kTile; }
};

// One thread's workspace, carved from attention_tiled_workspace_floats floats.
struct Tiles {
  float *K, *Kt, *Vt, *dK, *dV;  // (Tp, hdp), (hdp, Tp), (hdp, Tp), (Tp, hdp), (Tp, hdp)
  float *Q, *dO, *dQ;            // (kTile, hdp) each
  float *P, *dP;                 // (kTile, Tp) each
  float* stats;                  // (2·kTile)
  Tiles(float* w, const Geom& s) {
    const int64_t big = int64_t(s.Tp) * s.hdp, tile = int64_t(kTile) * s.hdp;
    const int64_t panel = int64_t(kTile) * s.Tp;
    K = w, Kt = K + big, Vt = Kt + big, dK = Vt + big, dV = dK + big;
    Q = dV + big, dO = Q + tile, dQ = dO + tile;
    P = dQ + tile, dP = P + panel, stats = dP + panel;
  }
};

// dst (rows_p, ld): rows [0, rows) of src (row stride lds, hd columns) widened; columns [hd, ld)
// and rows [rows, rows_p) zero.
template <typename S>
void pack_rows(float* dst, int64_t ld, const S* src, int64_t lds, int rows, int rows_p, int hd) {
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
void pack_transposed(float* dst, int64_t ld, const S* src, int64_t lds, int rows, int cols_p,
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

// Forward of query tile `it` of kv group g of batch row b, for the group's rep heads: keys and
// values [0, i1) packed once, then per head an online softmax over the key tiles.
template <class Kern, typename S>
inline __attribute__((always_inline)) void forward_task(S* out, float* lse, const S* qkv,
                                                        const Geom& s, int b, int g, int it,
                                                        const Tiles& w) {
  constexpr int W = Kern::W;
  const int i0 = it * kTile, i1 = std::min(s.T, i0 + kTile), mq = i1 - i0;
  const S* base = qkv + int64_t(b) * s.T * s.qkv_row;  // (T, qkv_row)
  float* Kt = w.Kt;                                    // (hd, Tp): keys [0, i1)
  float* Vv = w.K;                                     // (Tp, hdp): values [0, i1)
  float* Sc = w.P;                                     // (mq, kTile): scores, then probabilities
  float *acc = w.dQ, *m = w.stats, *l = w.stats + kTile;
  pack_transposed(Kt, s.Tp, base + s.k_col(g), s.qkv_row, i1, round_up(i1, W), s.hd);
  if (out != nullptr) {
    pack_rows(Vv, s.hdp, base + s.k_col(g) + s.hd, s.qkv_row, i1, round_up(i1, W), s.hd);
  }
  for (int r = 0; r < s.rep; ++r) {
    const int h = g * s.rep + r;
    pack_rows(w.Q, s.hdp, base + i0 * s.qkv_row + s.q_col(g, r), s.qkv_row, mq, mq, s.hd);
    std::fill(m, m + mq, -INFINITY);
    std::fill(l, l + mq, 0.0f);
    for (int j0 = 0; j0 < i1; j0 += kTile) {
      const int jn = std::min(i1, j0 + kTile) - j0, nw = round_up(jn, W);
      Kern::gemm(Sc, kTile, w.Q, s.hdp, 1, Kt + j0, s.Tp, mq, nw, s.hd, false);
      for (int i = 0; i < mq; ++i) {
        float* x = Sc + i * kTile;                    // (nw)
        const int n = std::min(jn, i0 + i + 1 - j0);  // keys of row i0 + i in this tile, ≥ 1
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < nw; ++j) {
          const float v = x[j] * s.scale;
          x[j] = v;
          mx = std::max(mx, select_f32(j < n, v, -INFINITY));
        }
        const float mn = std::max(m[i], mx);
        const float alpha = exp_approx(m[i] - mn);  // 0 on the first tile (m = -inf)
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < nw; ++j) {
          const float p = select_f32(j < n, exp_approx(x[j] - mn), 0.0f);
          x[j] = p;
          sum += p;
        }
        l[i] = l[i] * alpha + sum;
        m[i] = mn;
        if (out != nullptr && j0 > 0) {
          float* o = acc + i * s.hdp;
#pragma omp simd
          for (int d = 0; d < s.hdp; ++d) o[d] *= alpha;
        }
      }
      if (out != nullptr) {
        Kern::gemm(acc, s.hdp, Sc, kTile, 1, Vv + int64_t(j0) * s.hdp, s.hdp, mq, s.hdp, nw,
                   j0 > 0);
      }
    }
    float* row_lse = lse + s.stat(b, h) + i0;
    for (int i = 0; i < mq; ++i) row_lse[i] = m[i] + std::log(l[i]);
    if (out == nullptr) continue;
    S* o = out + (int64_t(b) * s.T + i0) * s.out_row + int64_t(h) * s.hd;
    for (int i = 0; i < mq; ++i) {
      const float inv = 1.0f / l[i];
      const float* a = acc + i * s.hdp;
      S* oi = o + i * s.out_row;
#pragma omp simd
      for (int d = 0; d < s.hd; ++d) oi[d] = store<S>(a[d] * inv);
    }
  }
}

// Backward of kv group g of batch row b: this task owns dK and dV of the group and dQ of its rep
// heads, summed in a fixed order (heads, then query tiles, then key tiles).
template <class Kern, typename S>
inline __attribute__((always_inline)) void backward_task(S* dqkv, const S* dout, const S* qkv,
                                                         const float* lse, const Geom& s, int b,
                                                         int g, const Tiles& w) {
  constexpr int W = Kern::W;
  const S* base = qkv + int64_t(b) * s.T * s.qkv_row;  // (T, qkv_row)
  S* dbase = dqkv + int64_t(b) * s.T * s.qkv_row;
  const int64_t big = int64_t(s.Tp) * s.hdp;
  pack_rows(w.K, s.hdp, base + s.k_col(g), s.qkv_row, s.T, s.Tp, s.hd);
  pack_transposed(w.Kt, s.Tp, base + s.k_col(g), s.qkv_row, s.T, s.Tp, s.hd);
  pack_transposed(w.Vt, s.Tp, base + s.k_col(g) + s.hd, s.qkv_row, s.T, s.Tp, s.hd);
  std::fill(w.dK, w.dK + 2 * big, 0.0f);  // dK and dV
  for (int r = 0; r < s.rep; ++r) {
    const int h = g * s.rep + r;
    for (int it = 0; it < s.tiles(); ++it) {
      const int i0 = it * kTile, i1 = std::min(s.T, i0 + kTile), mq = i1 - i0;
      const int nkp = round_up(i1, W);  // panel columns: keys [0, i1), zeros past i1
      pack_rows(w.Q, s.hdp, base + i0 * s.qkv_row + s.q_col(g, r), s.qkv_row, mq, mq, s.hd);
      pack_rows(w.dO, s.hdp, dout + (int64_t(b) * s.T + i0) * s.out_row + int64_t(h) * s.hd,
                s.out_row, mq, mq, s.hd);
      // Raw scores and dP = dO·Vᵀ for every key the tile's rows see.
      for (int j0 = 0; j0 < i1; j0 += kTile) {
        const int nw = round_up(std::min(i1, j0 + kTile) - j0, W);
        Kern::gemm(w.P + j0, s.Tp, w.Q, s.hdp, 1, w.Kt + j0, s.Tp, mq, nw, s.hd, false);
        Kern::gemm(w.dP + j0, s.Tp, w.dO, s.hdp, 1, w.Vt + j0, s.Tp, mq, nw, s.hd, false);
      }
      // P = exp(scale·score − lse) as the forward computed it; D_i = Σ_j P_ij dP_ij;
      // dS = P ⊙ (dP − D), into dP.
      const float* row_lse = lse + s.stat(b, h) + i0;
      for (int i = 0; i < mq; ++i) {
        float *p = w.P + int64_t(i) * s.Tp, *dp = w.dP + int64_t(i) * s.Tp;
        const int n = i0 + i + 1;
        const float li = row_lse[i];
        float D = 0.0f;
#pragma omp simd reduction(+ : D)
        for (int j = 0; j < nkp; ++j) {
          const float pj = select_f32(j < n, exp_approx(p[j] * s.scale - li), 0.0f);
          p[j] = pj;
          D += pj * dp[j];
        }
#pragma omp simd
        for (int j = 0; j < nkp; ++j) dp[j] = p[j] * (dp[j] - D);
      }
      // dV_j += Pᵀ dO, dK_j += dSᵀ Q (scaled once at the end), per key tile.
      for (int j0 = 0; j0 < i1; j0 += kTile) {
        const int nw = round_up(std::min(i1, j0 + kTile) - j0, W);
        Kern::gemm(w.dV + int64_t(j0) * s.hdp, s.hdp, w.P + j0, 1, s.Tp, w.dO, s.hdp, nw, s.hdp, mq,
                   true);
        Kern::gemm(w.dK + int64_t(j0) * s.hdp, s.hdp, w.dP + j0, 1, s.Tp, w.Q, s.hdp, nw, s.hdp, mq,
                   true);
      }
      // dQ = scale · dS K over keys [0, i1).
      Kern::gemm(w.dQ, s.hdp, w.dP, s.Tp, 1, w.K, s.hdp, mq, s.hdp, i1, false);
      S* dq = dbase + i0 * s.qkv_row + s.q_col(g, r);
      for (int i = 0; i < mq; ++i) {
        const float* a = w.dQ + i * s.hdp;
        S* o = dq + i * s.qkv_row;
#pragma omp simd
        for (int d = 0; d < s.hd; ++d) o[d] = store<S>(a[d] * s.scale);
      }
    }
  }
  for (int t = 0; t < s.T; ++t) {
    S* o = dbase + t * s.qkv_row + s.k_col(g);  // dk (hd), then dv (hd)
    const float *dk = w.dK + int64_t(t) * s.hdp, *dv = w.dV + int64_t(t) * s.hdp;
#pragma omp simd
    for (int d = 0; d < s.hd; ++d) o[d] = store<S>(dk[d] * s.scale);
#pragma omp simd
    for (int d = 0; d < s.hd; ++d) o[s.hd + d] = store<S>(dv[d]);
  }
}

template <typename S>
__attribute__((target("avx512f"))) void forward_task512(S* out, float* lse, const S* qkv,
                                                        const Geom& s, int b, int g, int it,
                                                        const Tiles& w) {
  forward_task<Avx512>(out, lse, qkv, s, b, g, it, w);
}
template <typename S>
void forward_task256(S* out, float* lse, const S* qkv, const Geom& s, int b, int g, int it,
                     const Tiles& w) {
  forward_task<Avx2>(out, lse, qkv, s, b, g, it, w);
}
template <typename S>
__attribute__((target("avx512f"))) void backward_task512(S* dqkv, const S* dout, const S* qkv,
                                                         const float* lse, const Geom& s, int b,
                                                         int g, const Tiles& w) {
  backward_task<Avx512>(dqkv, dout, qkv, lse, s, b, g, w);
}
template <typename S>
void backward_task256(S* dqkv, const S* dout, const S* qkv, const float* lse, const Geom& s, int b,
                      int g, const Tiles& w) {
  backward_task<Avx2>(dqkv, dout, qkv, lse, s, b, g, w);
}

std::atomic<bool>& forced_avx2() {
  static std::atomic<bool> f{false};
  return f;
}

// The vector width is the CPU's, never the thread count's: AVX-512F where present.
bool wide() {
  static const bool w = cpu_features().avx512f;
  return w && !forced_avx2().load(std::memory_order_relaxed);
}

// Each thread's tiles: one workspace of threads × attention_tiled_workspace_floats, grown to the
// largest call's and reused (not reentrant, as the kernels' other workspaces).
float* workspace(const Geom& s, int threads) {
  static Buffer buf;
  return reserve_floats(buf,
                        int64_t(threads) * int64_t(attention_tiled_workspace_floats(s.T, s.hd)));
}

}  // namespace

void attention_tiled_force_avx2(bool on) {
  forced_avx2().store(on, std::memory_order_relaxed);
}

size_t attention_tiled_workspace_floats(int T, int hd) {
  const size_t Tp = size_t(round_up(T, kTile)), hdp = size_t(round_up(hd, kPad));
  return 5 * Tp * hdp + 3 * size_t(kTile) * hdp + 2 * size_t(kTile) * Tp + 2 * kTile;
}

template <typename S>
void attention_tiled_forward(S* out, float* lse, const S* qkv, int B, int T, int NH, int KVH,
                             int hd) {
  const Geom s(B, T, NH, KVH, hd);
  const int threads = omp_get_max_threads();
  float* ws = workspace(s, threads);
  const int64_t per = int64_t(attention_tiled_workspace_floats(T, hd));
  // Tasks (query tile, b, g), the longest rows first: tile it sees it + 1 key tiles.
  const int nt = s.tiles();
  const int64_t tasks = int64_t(nt) * B * KVH;
  const bool avx512 = wide();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int it = nt - 1 - int(task / (int64_t(B) * KVH));
    const int b = int(task % (int64_t(B) * KVH)) / KVH, g = int(task % KVH);
    const Tiles w(ws + omp_get_thread_num() * per, s);
    if (avx512) {
      forward_task512(out, lse, qkv, s, b, g, it, w);
    } else {
      forward_task256(out, lse, qkv, s, b, g, it, w);
    }
  }
}

template <typename S>
void attention_tiled_backward(S* dqkv, const S* dout, const S* qkv, const float* lse, int B, int T,
                              int NH, int KVH, int hd) {
  const Geom s(B, T, NH, KVH, hd);
  const int threads = omp_get_max_threads();
  float* ws = workspace(s, threads);
  const int64_t per = int64_t(attention_tiled_workspace_floats(T, hd));
  const int64_t tasks = int64_t(B) * KVH;
  const bool avx512 = wide();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int b = int(task / KVH), g = int(task % KVH);
    const Tiles w(ws + omp_get_thread_num() * per, s);
    if (avx512) {
      backward_task512(dqkv, dout, qkv, lse, s, b, g, w);
    } else {
      backward_task256(dqkv, dout, qkv, lse, s, b, g, w);
    }
  }
}

#define INSTANTIATE_S(S)                                                                         \
  template void attention_tiled_forward<S>(S*, float*, const S*, int, int, int, int, int);       \
  template void attention_tiled_backward<S>(S*, const S*, const S*, const float*, int, int, int, \
                                            int, int);
STRATA_FOR_EACH_S(INSTANTIATE_S)

}  // namespace strata::kernels
