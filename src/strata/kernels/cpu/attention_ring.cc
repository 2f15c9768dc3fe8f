#include "strata/kernels/cpu/attention_ring.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "strata/core/check.h"
#include "strata/core/memory.h"
#include "strata/kernels/cpu/attention_tiled_kernels.h"
#include "strata/kernels/cpu/common.h"

namespace strata::kernels {

namespace {

using namespace tile;

// Sizes and offsets of one block: query rows [q0, q0+Tq) of qkv (Tl rows per batch row) against
// key/value rows [k0, k0+Tk) of kv (Tkl rows per batch row). Query head h = g·rep + r.
struct Block {
  int B, Tl, q0, Tq, Tkl, k0, Tk, NH, KVH, hd, rep;
  bool causal;
  int hdp, Tp;  // hd rounded up to kPad, Tk to kTile
  int64_t qkv_row, kv_row, out_row;
  float scale, softcap;
  int window;
  const int32_t *qpos, *kpos;  // positions of qkv's and kv's rows (nullptr: the row)
  const int32_t* doc_begin;    // (B, seq) document starts by position, or nullptr
  int seq;
  Block(int Tl_, int q0_, int Tq_, int Tkl_, int k0_, int Tk_, int B_, int NH_, int KVH_, int hd_,
        bool causal_, const AttentionScores& sc)
      : B(B_),
        Tl(Tl_),
        q0(q0_),
        Tq(Tq_),
        Tkl(Tkl_),
        k0(k0_),
        Tk(Tk_),
        NH(NH_),
        KVH(KVH_),
        hd(hd_),
        rep(KVH_ > 0 ? NH_ / KVH_ : 0),
        causal(causal_),
        softcap(sc.softcap),
        window(sc.window),
        qpos(sc.pos),
        kpos(sc.kv_pos),
        doc_begin(sc.doc_begin),
        seq(sc.seq) {
    STRATA_CHECK(NH > 0 && KVH > 0 && NH % KVH == 0, "attention needs heads (", NH,
                 ") to be a multiple of kv heads (", KVH, ")");
    STRATA_CHECK(B > 0 && hd > 0, "attention block: empty shape B=", B, " hd=", hd);
    STRATA_CHECK(q0 >= 0 && Tq >= 0 && q0 + Tq <= Tl, "attention block: query rows [", q0, ", ",
                 q0 + Tq, ") are not inside the ", Tl, " local rows");
    STRATA_CHECK(k0 >= 0 && Tk >= 0 && k0 + Tk <= Tkl, "attention block: key rows [", k0, ", ",
                 k0 + Tk, ") are not inside the ", Tkl, " rows of kv");
    STRATA_CHECK(!causal || Tq == Tk, "attention block: a causal block is diagonal (the same ",
                 "positions), but has ", Tq, " query rows and ", Tk, " key rows");
    hdp = round_up(hd, kPad), Tp = round_up(std::max(Tk, 1), kTile);
    qkv_row = int64_t(KVH) * (rep + 2) * hd, kv_row = int64_t(KVH) * 2 * hd;
    out_row = int64_t(NH) * hd;
    scale = sc.scale_for(hd);
  }
  const int32_t* docs(int b) const {
    return doc_begin != nullptr ? doc_begin + int64_t(b) * seq : nullptr;
  }
  int64_t first_query() const {
    return qpos != nullptr ? *std::min_element(qpos + q0, qpos + q0 + Tq) : q0;
  }
  int64_t last_key() const {
    return kpos != nullptr ? *std::max_element(kpos + k0, kpos + k0 + Tk) : k0 + Tk - 1;
  }
  // Sequence b's queries see no key of the block: every key lies before the document of its
  // first query (whose document starts first).
  bool unseen(int b) const { return doc_begin != nullptr && docs(b)[first_query()] > last_key(); }
  // No query sees a key: an empty block, one wholly outside the window (every query position at
  // least `window` past every key position), or wholly across documents in every sequence.
  bool empty() const {
    if (Tq == 0 || Tk == 0) return true;
    if (window > 0 && first_query() - last_key() >= window) return true;
    if (doc_begin == nullptr) return false;
    for (int b = 0; b < B; ++b) {
      if (!unseen(b)) return false;
    }
    return true;
  }
  int64_t q_col(int g, int r) const { return (int64_t(g) * (rep + 2) + r) * hd; }
  int64_t stat(int b, int h) const { return (int64_t(b) * NH + h) * Tl + q0; }  // row q0
  int tiles() const { return (Tq + kTile - 1) / kTile; }
  // The keys query tile [i0, i1) of sequence b sees (tile_keys): at most [0, i1) causal, else
  // [0, Tk).
  TileKeys keys(int* lo, int* hi, int i0, int i1, int b) const {
    return tile_keys(lo, hi, i1 - i0, causal ? i1 : Tk, causal ? i0 : Tk, qpos, q0 + i0, kpos, k0,
                     window, docs(b));
  }
};

// Forward of query tiles it_last, it_last − step, … >= 0 of kv group g of batch row b, for the
// group's rep heads: the keys and values that any of them sees packed once, then per tile and
// head an online softmax over the key tiles it sees, merged into o and lse.
template <class Kern, typename S>
inline __attribute__((always_inline)) void forward_task(float* o, float* lse, const S* qkv,
                                                        const S* kv, const Block& s, int b, int g,
                                                        int it_last, int step, const Tiles& w) {
  constexpr int W = Kern::W;
  if (s.unseen(b)) return;
  int lo[kTile], hi[kTile];
  int first = s.Tk, last = 0;  // the keys the tiles see, first a multiple of kTile
  for (int it = it_last; it >= 0; it -= step) {
    const TileKeys keys = s.keys(lo, hi, it * kTile, std::min(s.Tq, (it + 1) * kTile), b);
    if (keys.first < keys.last) {
      first = std::min(first, keys.first), last = std::max(last, keys.last);
    }
  }
  if (first >= last) return;
  const int nk_all = last - first;
  const S* keys = kv + (int64_t(b) * s.Tkl + s.k0 + first) * s.kv_row + int64_t(g) * 2 * s.hd;
  float *Kt = w.Kt, *Vv = w.K;  // (hd, Tp) and (Tp, hdp): keys and values [first, last)
  float *acc = w.dQ, *m = w.stats, *l = w.stats + kTile;
  pack_transposed(Kt, s.Tp, keys, s.kv_row, nk_all, round_up(nk_all, W), s.hd);
  pack_rows(Vv, s.hdp, keys + s.hd, s.kv_row, nk_all, round_up(nk_all, W), s.hd);
  for (int it = it_last; it >= 0; it -= step) {
    const int i0 = it * kTile, i1 = std::min(s.Tq, i0 + kTile), mq = i1 - i0;
    const TileKeys tk = s.keys(lo, hi, i0, i1, b);
    if (tk.first >= tk.last) continue;
    // This tile's keys from the packed ones; they end at a multiple of kTile or at `last`, so
    // the tile reads no column past those packed.
    const int64_t off = tk.first - first;
    const S* queries = qkv + (int64_t(b) * s.Tl + s.q0 + i0) * s.qkv_row;  // (mq, qkv_row)
    for (int r = 0; r < s.rep; ++r) {
      const int h = g * s.rep + r;
      pack_rows(w.Q, s.hdp, queries + s.q_col(g, r), s.qkv_row, mq, mq, s.hd);
      forward_tile<Kern>(acc, m, l, w.P, w.Q, Kt + off, s.Tp, Vv + off * s.hdp, s.hdp, s.hd, mq,
                         tk.last - tk.first, lo, hi, s.scale, s.softcap);
      float* row_lse = lse + s.stat(b, h) + i0;
      float* out = o + (int64_t(b) * s.Tl + s.q0 + i0) * s.out_row + int64_t(h) * s.hd;
      for (int i = 0; i < mq; ++i) {
        if (l[i] == 0.0f) continue;  // no key of the block is inside this row's window
        const float* a = acc + i * s.hdp;
        float* oi = out + i * s.out_row;
        const float block_lse = m[i] + std::log(l[i]), old = row_lse[i];
        if (old == -INFINITY) {  // the first block of the row: attention_tiled_forward's bits
          const float inv = 1.0f / l[i];
#pragma omp simd
          for (int d = 0; d < s.hd; ++d) oi[d] = a[d] * inv;
          row_lse[i] = block_lse;
          continue;
        }
        const float lse_new =
            std::max(old, block_lse) + std::log1p(std::exp(-std::fabs(old - block_lse)));
        const float keep = std::exp(old - lse_new), add = std::exp(block_lse - lse_new) / l[i];
#pragma omp simd
        for (int d = 0; d < s.hd; ++d) oi[d] = oi[d] * keep + a[d] * add;
        row_lse[i] = lse_new;
      }
    }
  }
}

// Backward of kv group g of batch row b: this task owns the block's dk and dv of the group and dq
// of its rep heads, summed in a fixed order (heads, then query tiles, then key tiles).
template <class Kern, typename S>
inline __attribute__((always_inline)) void backward_task(float* dq, float* dkv, const S* dout,
                                                         const S* qkv, const float* lse,
                                                         const float* delta, const S* kv,
                                                         const Block& s, int b, int g,
                                                         const Tiles& w) {
  if (s.unseen(b)) return;
  const int64_t kv_off = (int64_t(b) * s.Tkl + s.k0) * s.kv_row + int64_t(g) * 2 * s.hd;
  const S* keys = kv + kv_off;  // (Tk, kv_row): key hd, then value hd
  const int64_t big = int64_t(s.Tp) * s.hdp;
  pack_rows(w.K, s.hdp, keys, s.kv_row, s.Tk, s.Tp, s.hd);
  pack_transposed(w.Kt, s.Tp, keys, s.kv_row, s.Tk, s.Tp, s.hd);
  pack_transposed(w.Vt, s.Tp, keys + s.hd, s.kv_row, s.Tk, s.Tp, s.hd);
  std::fill(w.dK, w.dK + 2 * big, 0.0f);  // dK and dV
  for (int r = 0; r < s.rep; ++r) {
    const int h = g * s.rep + r;
    for (int it = 0; it < s.tiles(); ++it) {
      const int i0 = it * kTile, i1 = std::min(s.Tq, i0 + kTile), mq = i1 - i0;
      int lo[kTile], hi[kTile];
      const TileKeys keys = s.keys(lo, hi, i0, i1, b);  // keys [first, last) of those packed
      if (keys.first >= keys.last) continue;
      const int64_t f = keys.first;
      const int64_t row0 = int64_t(b) * s.Tl + s.q0 + i0;  // the tile's first row of qkv
      pack_rows(w.Q, s.hdp, qkv + row0 * s.qkv_row + s.q_col(g, r), s.qkv_row, mq, mq, s.hd);
      pack_rows(w.dO, s.hdp, dout + row0 * s.out_row + int64_t(h) * s.hd, s.out_row, mq, mq, s.hd);
      backward_tile<Kern>(w.dQ, w.dK + f * s.hdp, w.dV + f * s.hdp, w.P, w.dP, w.Q, w.dO,
                          w.K + f * s.hdp, w.Kt + f, w.Vt + f, s.Tp, lse + s.stat(b, h) + i0,
                          delta + s.stat(b, h) + i0, s.hdp, s.hd, mq, keys.last - keys.first, lo,
                          hi, s.scale, s.softcap);
      float* dqt = dq + row0 * s.out_row + int64_t(h) * s.hd;
      for (int i = 0; i < mq; ++i) {
        const float* a = w.dQ + i * s.hdp;
        float* di = dqt + i * s.out_row;
#pragma omp simd
        for (int d = 0; d < s.hd; ++d) di[d] += a[d] * s.scale;
      }
    }
  }
  for (int t = 0; t < s.Tk; ++t) {
    float* o = dkv + kv_off + t * s.kv_row;  // dk (hd), then dv (hd)
    const float *dk = w.dK + int64_t(t) * s.hdp, *dv = w.dV + int64_t(t) * s.hdp;
#pragma omp simd
    for (int d = 0; d < s.hd; ++d) o[d] += dk[d] * s.scale;
#pragma omp simd
    for (int d = 0; d < s.hd; ++d) o[s.hd + d] += dv[d];
  }
}

template <typename S>
__attribute__((target("avx512f"))) void forward_task512(float* o, float* lse, const S* qkv,
                                                        const S* kv, const Block& s, int b, int g,
                                                        int it_last, int step, const Tiles& w) {
  forward_task<Avx512>(o, lse, qkv, kv, s, b, g, it_last, step, w);
}
template <typename S>
void forward_task256(float* o, float* lse, const S* qkv, const S* kv, const Block& s, int b, int g,
                     int it_last, int step, const Tiles& w) {
  forward_task<Avx2>(o, lse, qkv, kv, s, b, g, it_last, step, w);
}
template <typename S>
__attribute__((target("avx512f"))) void backward_task512(float* dq, float* dkv, const S* dout,
                                                         const S* qkv, const float* lse,
                                                         const float* delta, const S* kv,
                                                         const Block& s, int b, int g,
                                                         const Tiles& w) {
  backward_task<Avx512>(dq, dkv, dout, qkv, lse, delta, kv, s, b, g, w);
}
template <typename S>
void backward_task256(float* dq, float* dkv, const S* dout, const S* qkv, const float* lse,
                      const float* delta, const S* kv, const Block& s, int b, int g,
                      const Tiles& w) {
  backward_task<Avx2>(dq, dkv, dout, qkv, lse, delta, kv, s, b, g, w);
}

// Each thread's tiles: one workspace of threads × attention_block_workspace_floats, grown to the
// largest block's and reused (its own, apart from attention_tiled's).
float* workspace(const Block& s, int threads) {
  static Buffer buf;
  return reserve_floats(buf,
                        int64_t(threads) * int64_t(attention_block_workspace_floats(s.Tk, s.hd)));
}

}  // namespace

size_t attention_block_workspace_floats(int Tk, int hd) {
  return tiles_floats(std::max(Tk, 1), hd);
}

template <typename S>
void attention_pack_kv(S* kv, const S* qkv, int B, int Tl, int NH, int KVH, int hd) {
  STRATA_CHECK(NH > 0 && KVH > 0 && NH % KVH == 0, "attention needs heads (", NH,
               ") to be a multiple of kv heads (", KVH, ")");
  const int rep = NH / KVH;
  const int64_t rows = int64_t(B) * Tl, qkv_row = int64_t(KVH) * (rep + 2) * hd;
  const int64_t kv_row = int64_t(KVH) * 2 * hd;
#pragma omp parallel for schedule(static) if (rows * kv_row >= kParallelMinWork)
  for (int64_t t = 0; t < rows; ++t) {
    for (int g = 0; g < KVH; ++g) {
      std::copy_n(qkv + t * qkv_row + (int64_t(g) * (rep + 2) + rep) * hd, 2 * hd,
                  kv + t * kv_row + int64_t(g) * 2 * hd);
    }
  }
}

template <typename S>
void attention_block_forward(float* o, float* lse, const S* qkv, int Tl, int q0, int Tq,
                             const S* kv, int Tkl, int k0, int Tk, int B, int NH, int KVH, int hd,
                             bool causal, const AttentionScores& sc) {
  const Block s(Tl, q0, Tq, Tkl, k0, Tk, B, NH, KVH, hd, causal, sc);
  if (s.empty()) return;
  const int threads = omp_get_max_threads();
  float* ws = workspace(s, threads);
  const int64_t per = int64_t(attention_block_workspace_floats(Tk, hd));
  // Tasks (b, g, k): query tiles nt−1−k, nt−1−k−split, …, so that the keys are packed once for
  // several tiles, and still about 4 tasks a thread; the longest first when causal (tile it sees
  // it + 1 key tiles). Which task computes a row changes no bit of it.
  const int nt = s.tiles();
  const int64_t groups = int64_t(B) * KVH;
  const int split = int(std::min<int64_t>(nt, (4 * int64_t(threads) + groups - 1) / groups));
  const int64_t tasks = groups * split;
  const bool avx512 = wide();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int it_last = nt - 1 - int(task / groups);
    const int b = int(task % groups) / KVH, g = int(task % KVH);
    const Tiles w(ws + omp_get_thread_num() * per, s.Tp, s.hdp);
    if (avx512) {
      forward_task512(o, lse, qkv, kv, s, b, g, it_last, split, w);
    } else {
      forward_task256(o, lse, qkv, kv, s, b, g, it_last, split, w);
    }
  }
}

template <typename S>
void attention_delta(float* delta, const S* dout, const S* out, int B, int Tl, int NH, int hd) {
  const int64_t rows = int64_t(B) * Tl, row = int64_t(NH) * hd;
#pragma omp parallel for schedule(static) if (rows * row >= kParallelMinWork)
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t b = t / Tl, i = t % Tl;
    for (int h = 0; h < NH; ++h) {
      const S *dy = dout + t * row + int64_t(h) * hd, *y = out + t * row + int64_t(h) * hd;
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int d = 0; d < hd; ++d) sum += load(dy[d]) * load(y[d]);
      delta[(b * NH + h) * Tl + i] = sum;
    }
  }
}

template <typename S>
void attention_block_backward(float* dq, float* dkv, const S* dout, const S* qkv, const float* lse,
                              const float* delta, int Tl, int q0, int Tq, const S* kv, int Tkl,
                              int k0, int Tk, int B, int NH, int KVH, int hd, bool causal,
                              const AttentionScores& sc) {
  const Block s(Tl, q0, Tq, Tkl, k0, Tk, B, NH, KVH, hd, causal, sc);
  if (s.empty()) return;
  const int threads = omp_get_max_threads();
  float* ws = workspace(s, threads);
  const int64_t per = int64_t(attention_block_workspace_floats(Tk, hd));
  const int64_t tasks = int64_t(B) * KVH;
  const bool avx512 = wide();
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (tasks > 1)
  for (int64_t task = 0; task < tasks; ++task) {
    const int b = int(task / KVH), g = int(task % KVH);
    const Tiles w(ws + omp_get_thread_num() * per, s.Tp, s.hdp);
    if (avx512) {
      backward_task512(dq, dkv, dout, qkv, lse, delta, kv, s, b, g, w);
    } else {
      backward_task256(dq, dkv, dout, qkv, lse, delta, kv, s, b, g, w);
    }
  }
}

template <typename S>
void attention_unpack_dqkv(S* dqkv, const float* dq, const float* dkv, int B, int Tl, int NH,
                           int KVH, int hd) {
  STRATA_CHECK(NH > 0 && KVH > 0 && NH % KVH == 0, "attention needs heads (", NH,
               ") to be a multiple of kv heads (", KVH, ")");
  const int rep = NH / KVH;
  const int64_t rows = int64_t(B) * Tl, qkv_row = int64_t(KVH) * (rep + 2) * hd;
  const int64_t q_row = int64_t(NH) * hd, kv_row = int64_t(KVH) * 2 * hd;
#pragma omp parallel for schedule(static) if (rows * qkv_row >= kParallelMinWork)
  for (int64_t t = 0; t < rows; ++t) {
    for (int g = 0; g < KVH; ++g) {
      S* out = dqkv + t * qkv_row + int64_t(g) * (rep + 2) * hd;
      const float* q = dq + t * q_row + int64_t(g) * rep * hd;
      const float* kv = dkv + t * kv_row + int64_t(g) * 2 * hd;
      for (int64_t i = 0; i < int64_t(rep) * hd; ++i) out[i] = store<S>(q[i]);
      for (int64_t i = 0; i < 2 * int64_t(hd); ++i) out[int64_t(rep) * hd + i] = store<S>(kv[i]);
    }
  }
}

#define INSTANTIATE_S(S)                                                                           \
  template void attention_pack_kv<S>(S*, const S*, int, int, int, int, int);                       \
  template void attention_unpack_dqkv<S>(S*, const float*, const float*, int, int, int, int, int); \
  template void attention_block_forward<S>(float*, float*, const S*, int, int, int, const S*, int, \
                                           int, int, int, int, int, int, bool,                     \
                                           const AttentionScores&);                                \
  template void attention_delta<S>(float*, const S*, const S*, int, int, int, int);                \
  template void attention_block_backward<S>(float*, float*, const S*, const S*, const float*,      \
                                            const float*, int, int, int, const S*, int, int, int,  \
                                            int, int, int, int, bool, const AttentionScores&);
STRATA_FOR_EACH_S(INSTANTIATE_S)

}  // namespace strata::kernels
