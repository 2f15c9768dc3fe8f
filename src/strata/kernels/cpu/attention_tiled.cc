#include "strata/kernels/cpu/attention_tiled.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "strata/core/check.h"
#include "strata/core/memory.h"
#include "strata/kernels/cpu/attention_tiled_kernels.h"
#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/cpu_features.h"

namespace strata::kernels {

namespace tile {

namespace {

std::atomic<bool>& forced_avx2() {
  static std::atomic<bool> f{false};
  return f;
}

}  // namespace

bool wide() {
  static const bool w = cpu_features().avx512f;
  return w && !forced_avx2().load(std::memory_order_relaxed);
}

}  // namespace tile

namespace {

using namespace tile;

// Sizes and column offsets of one call. Query head h = g·rep + r.
struct Geom {
  int B, T, NH, KVH, hd, rep;
  int hdp, Tp;  // hd rounded up to kPad, T to kTile
  int64_t qkv_row, out_row;
  float scale, softcap;
  int window;
  const int32_t* pos;
  const int32_t* doc_begin;  // (B, seq) document starts, or nullptr (AttentionScores)
  int seq;
  Geom(int B_, int T_, int NH_, int KVH_, int hd_, const AttentionScores& sc)
      : B(B_),
        T(T_),
        NH(NH_),
        KVH(KVH_),
        hd(hd_),
        rep(KVH_ > 0 ? NH_ / KVH_ : 0),
        softcap(sc.softcap),
        window(sc.window),
        pos(sc.pos),
        doc_begin(sc.doc_begin),
        seq(sc.seq) {
    STRATA_CHECK(NH > 0 && KVH > 0 && NH % KVH == 0, "attention needs heads (", NH,
                 ") to be a multiple of kv heads (", KVH, ")");
    STRATA_CHECK(B > 0 && T > 0 && hd > 0, "attention: empty shape B=", B, " T=", T, " hd=", hd);
    hdp = round_up(hd, kPad), Tp = round_up(T, kTile);
    qkv_row = int64_t(KVH) * (rep + 2) * hd, out_row = int64_t(NH) * hd;
    scale = sc.scale_for(hd);
  }
  int64_t q_col(int g, int r) const { return (int64_t(g) * (rep + 2) + r) * hd; }
  int64_t k_col(int g) const { return (int64_t(g) * (rep + 2) + rep) * hd; }
  int64_t stat(int b, int h) const { return (int64_t(b) * NH + h) * T; }
  int tiles() const { return (T + kTile - 1) / kTile; }
  // The keys query rows [i0, i1) of sequence b see (tile_keys): keys [i0 − window + 1, i1) at
  // most, from the document of row i0 on.
  TileKeys keys(int* lo, int* hi, int i0, int i1, int b) const {
    const int32_t* docs = doc_begin != nullptr ? doc_begin + int64_t(b) * seq : nullptr;
    return tile_keys(lo, hi, i1 - i0, i1, i0, pos, i0, pos, 0, window, docs);
  }
};

// Forward of query tile `it` of kv group g of batch row b, for the group's rep heads: the keys and
// values the tile sees packed once, then per head an online softmax over their key tiles.
template <class Kern, typename S>
inline __attribute__((always_inline)) void forward_task(S* out, float* lse, const S* qkv,
                                                        const Geom& s, int b, int g, int it,
                                                        const Tiles& w) {
  constexpr int W = Kern::W;
  const int i0 = it * kTile, i1 = std::min(s.T, i0 + kTile), mq = i1 - i0;
  int lo[kTile], hi[kTile];
  const TileKeys keys = s.keys(lo, hi, i0, i1, b);  // every row sees itself: never empty
  const int nk = keys.last - keys.first;
  const S* base = qkv + int64_t(b) * s.T * s.qkv_row;  // (T, qkv_row)
  const S* k = base + keys.first * s.qkv_row + s.k_col(g);
  float* Kt = w.Kt;  // (hd, Tp): keys [first, last)
  float* Vv = w.K;   // (Tp, hdp): values [first, last)
  float* Sc = w.P;   // (mq, kTile): scores, then probabilities
  float *acc = w.dQ, *m = w.stats, *l = w.stats + kTile;
  pack_transposed(Kt, s.Tp, k, s.qkv_row, nk, round_up(nk, W), s.hd);
  if (out != nullptr) pack_rows(Vv, s.hdp, k + s.hd, s.qkv_row, nk, round_up(nk, W), s.hd);
  for (int r = 0; r < s.rep; ++r) {
    const int h = g * s.rep + r;
    pack_rows(w.Q, s.hdp, base + i0 * s.qkv_row + s.q_col(g, r), s.qkv_row, mq, mq, s.hd);
    forward_tile<Kern>(out != nullptr ? acc : nullptr, m, l, Sc, w.Q, Kt, s.Tp, Vv, s.hdp, s.hd, mq,
                       nk, lo, hi, s.scale, s.softcap);
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
      int lo[kTile], hi[kTile];
      const TileKeys keys = s.keys(lo, hi, i0, i1, b);  // keys [first, last) of those packed
      const int64_t f = keys.first;
      pack_rows(w.Q, s.hdp, base + i0 * s.qkv_row + s.q_col(g, r), s.qkv_row, mq, mq, s.hd);
      pack_rows(w.dO, s.hdp, dout + (int64_t(b) * s.T + i0) * s.out_row + int64_t(h) * s.hd,
                s.out_row, mq, mq, s.hd);
      backward_tile<Kern>(w.dQ, w.dK + f * s.hdp, w.dV + f * s.hdp, w.P, w.dP, w.Q, w.dO,
                          w.K + f * s.hdp, w.Kt + f, w.Vt + f, s.Tp, lse + s.stat(b, h) + i0,
                          nullptr, s.hdp, s.hd, mq, keys.last - keys.first, lo, hi, s.scale,
                          s.softcap);
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

// Each thread's tiles: one workspace of threads × attention_tiled_workspace_floats, grown to the
// largest call's and reused (not reentrant, as the kernels' other workspaces).
float* workspace(const Geom& s, int threads) {
  static Buffer buf;
  return reserve_floats(buf,
                        int64_t(threads) * int64_t(attention_tiled_workspace_floats(s.T, s.hd)));
}

}  // namespace

void attention_tiled_force_avx2(bool on) {
  tile::forced_avx2().store(on, std::memory_order_relaxed);
}

size_t attention_tiled_workspace_floats(int T, int hd) {
  return tiles_floats(T, hd);
}

template <typename S>
void attention_tiled_forward(S* out, float* lse, const S* qkv, int B, int T, int NH, int KVH,
                             int hd, const AttentionScores& sc) {
  const Geom s(B, T, NH, KVH, hd, sc);
  const int threads = omp_get_max_threads();
  float* ws = workspace(s, threads);
  const int64_t per = int64_t(attention_tiled_workspace_floats(T, hd));
  // Tasks (query tile, b, g), the longest rows first: tile it sees it + 1 key tiles (fewer with a
  // window).
  const int nt = s.tiles();
  const int64_t tasks = int64_t(nt) * B * KVH;
  const bool avx512 = wide();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int it = nt - 1 - int(task / (int64_t(B) * KVH));
    const int b = int(task % (int64_t(B) * KVH)) / KVH, g = int(task % KVH);
    const Tiles w(ws + omp_get_thread_num() * per, s.Tp, s.hdp);
    if (avx512) {
      forward_task512(out, lse, qkv, s, b, g, it, w);
    } else {
      forward_task256(out, lse, qkv, s, b, g, it, w);
    }
  }
}

template <typename S>
void attention_tiled_backward(S* dqkv, const S* dout, const S* qkv, const float* lse, int B, int T,
                              int NH, int KVH, int hd, const AttentionScores& sc) {
  const Geom s(B, T, NH, KVH, hd, sc);
  const int threads = omp_get_max_threads();
  float* ws = workspace(s, threads);
  const int64_t per = int64_t(attention_tiled_workspace_floats(T, hd));
  const int64_t tasks = int64_t(B) * KVH;
  const bool avx512 = wide();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int b = int(task / KVH), g = int(task % KVH);
    const Tiles w(ws + omp_get_thread_num() * per, s.Tp, s.hdp);
    if (avx512) {
      backward_task512(dqkv, dout, qkv, lse, s, b, g, w);
    } else {
      backward_task256(dqkv, dout, qkv, lse, s, b, g, w);
    }
  }
}

#define INSTANTIATE_S(S)                                                                         \
  template void attention_tiled_forward<S>(S*, float*, const S*, int, int, int, int, int,        \
                                           const AttentionScores&);                              \
  template void attention_tiled_backward<S>(S*, const S*, const S*, const float*, int, int, int, \
                                            int, int, const AttentionScores&);
STRATA_FOR_EACH_S(INSTANTIATE_S)

}  // namespace strata::kernels
