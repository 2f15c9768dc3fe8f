#include "strata/kernels/cpu/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "strata/core/check.h"
#include "strata/kernels/cpu/attention_tiled_kernels.h"
#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/matmul.h"
#include "strata/kernels/cpu/vec.h"

namespace strata::kernels {

namespace {

// Causality is exploited by splitting the queries into blocks of this many rows: block
// [i0, i1) only meets keys [0, i1), so the products skip most of the masked upper triangle.
constexpr int kQueryBlock = 64;

// Sizes shared by the products. Query head h = g·rep + r: g, the kv group, is a matmul batch
// dimension together with b, and r loops outside (head r of every group is one strided view).
struct Shape {
  int rep;          // query heads per kv head
  int64_t group;    // (rep+2)·hd: one group's columns of a qkv row
  int64_t qkv_row;  // KVH·(rep+2)·hd
  int64_t out_row;  // NH·hd
  int64_t TT;       // T·T, one head's score matrix
  int64_t batch[2];
  Shape(int B, int T, int NH, int KVH, int hd)
      : rep(KVH > 0 ? NH / KVH : 0),
        group(int64_t(rep + 2) * hd),
        qkv_row(KVH * group),
        out_row(int64_t(NH) * hd),
        TT(int64_t(T) * T),
        batch{B, KVH} {
    STRATA_CHECK(NH > 0 && KVH > 0 && NH % KVH == 0, "attention needs heads (", NH,
                 ") to be a multiple of kv heads (", KVH, ")");
  }
};

// The first key row t of sequence b sees: 0, or the first inside its window and its document
// (tile::earliest_key).
int first_key(const AttentionScores& sc, int b, int t) {
  const int32_t* docs = sc.docs(b);
  if (sc.window <= 0 && docs == nullptr) return 0;
  const int64_t qp = sc.pos != nullptr ? sc.pos[t] : t;
  return tile::first_key_at(sc.pos, 0, t + 1, tile::earliest_key(qp, sc.window, docs));
}

// The first key column the products of query rows [i0, …) compute: the first key of row i0's
// document, the earliest over the batch (the columns before it are masked for every row of the
// block, and the softmax writes their zeros); 0 without documents (a window's columns are masked
// only, as they always were).
int first_column(const AttentionScores& sc, int B, int i0) {
  if (sc.doc_begin == nullptr) return 0;
  const int64_t qp = sc.pos != nullptr ? sc.pos[i0] : i0;
  int k0 = i0;
  for (int b = 0; b < B; ++b) k0 = std::min(k0, tile::first_key_at(sc.pos, 0, i0, sc.docs(b)[qp]));
  return k0;
}

// Rows of one (b,h) score matrix: row t keeps columns [first_key(b, t), t], soft-capped (in S)
// where sc.softcap > 0; the rest are set to 0 (they may hold anything before). rows (nrows =
// B·NH·T, T): scores in, probabilities out.
template <typename S>
void causal_softmax(S* rows, int64_t nrows, int NH, int T, const AttentionScores& sc) {
  const float cap = sc.softcap;
#pragma omp parallel for schedule(static) if (parallel : nrows * T / 2 >= kParallelMinWork)
  for (int64_t row = 0; row < nrows; ++row) {
    const int t = int(row % T), a = first_key(sc, int(row / (int64_t(NH) * T)), t);
    S* x = rows + row * T + a;  // (t + 1 − a): the columns row t sees
    int n = t + 1 - a;
    if (cap > 0.0f) {
#pragma omp simd
      for (int j = 0; j < n; ++j) x[j] = store<S>(cap * tile::tanh_approx(load(x[j]) / cap));
    }
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < n; ++j) mx = std::max(mx, load(x[j]));
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < n; ++j) sum += exp_approx(load(x[j]) - mx);
    float inv = 1.0f / sum;
#pragma omp simd
    for (int j = 0; j < n; ++j) x[j] = store<S>(exp_approx(load(x[j]) - mx) * inv);
#pragma omp simd
    for (int j = n; j < T - a; ++j) x[j] = store<S>(0.0f);
    for (int j = 0; j < a; ++j) x[j - a] = store<S>(0.0f);
  }
}

// dp (nrows, T): gradient of the probabilities in, of the scaled scores (before the soft cap)
// out: ds = p ⊙ (dp − Σ_j p·dp), times 1 − tanh²(raw/cap) where raw (nrows, T), the recomputed
// scaled scores, is given (soft cap). Columns outside the row's keys are set to 0 (they are never
// read in, and may hold anything before).
template <typename S>
void causal_softmax_backward(float* dp, const S* p, const float* raw, int64_t nrows, int NH, int T,
                             const AttentionScores& sc) {
  const float cap = sc.softcap;
#pragma omp parallel for schedule(static) if (parallel : nrows * T / 2 >= kParallelMinWork)
  for (int64_t row = 0; row < nrows; ++row) {
    const int t = int(row % T), a = first_key(sc, int(row / (int64_t(NH) * T)), t);
    float* d = dp + row * T + a;    // (t + 1 − a): the columns row t sees
    const S* pr = p + row * T + a;  // (t + 1 − a)
    int n = t + 1 - a;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j < n; ++j) dot += load(pr[j]) * d[j];
#pragma omp simd
    for (int j = 0; j < n; ++j) d[j] = load(pr[j]) * (d[j] - dot);
    if (raw != nullptr) {
      const float* x = raw + row * T + a;  // (t + 1 − a)
#pragma omp simd
      for (int j = 0; j < n; ++j) {
        const float th = tile::tanh_approx(x[j] / cap);
        d[j] *= 1.0f - th * th;
      }
    }
#pragma omp simd
    for (int j = n; j < T - a; ++j) d[j] = 0.0f;
    for (int j = 0; j < a; ++j) d[j - a] = 0.0f;
  }
}

template <typename S, typename E>
void forward_with(S* out, S* att, const E* qkv, int B, int T, int NH, int KVH, int hd,
                  const AttentionScores& sc) {
  constexpr DType dt = dtype_of<S>(), et = dtype_of<E>();
  const Shape sh(B, T, NH, KVH, hd);
  const int64_t qkv_bs[2] = {T * sh.qkv_row, sh.group};  // batch strides of q, k and v heads
  const int64_t att_bs[2] = {NH * sh.TT, sh.rep * sh.TT};
  const int64_t out_bs[2] = {T * sh.out_row, int64_t(sh.rep) * hd};
  const E* k = qkv + int64_t(sh.rep) * hd;  // (B,T,KVH,hd) with strides (qkv_row, group)
  const E* v = k + hd;                      // (B,T,KVH,hd) with strides (qkv_row, group)
  const float scale = sc.scale_for(hd);
  for (int r = 0; r < sh.rep; ++r) {
    const E* q = qkv + int64_t(r) * hd;  // heads (g, r): (B,T,KVH,hd)
    S* a = att + r * sh.TT;              // (B,KVH,T,T) with strides att_bs
    for (int i0 = 0; i0 < T; i0 += kQueryBlock) {
      const int i1 = std::min(T, i0 + kQueryBlock), k0 = first_column(sc, B, i0);
      // a[i0:i1, k0:i1] = scale · q[i0:i1] · k[k0:i1]ᵀ
      matmul({a + int64_t(i0) * T + k0, dt, T, {att_bs[0], att_bs[1]}},
             {q + i0 * sh.qkv_row, et, sh.qkv_row, 1, {qkv_bs[0], qkv_bs[1]}},
             {k + k0 * sh.qkv_row, et, 1, sh.qkv_row, {qkv_bs[0], qkv_bs[1]}}, i1 - i0, i1 - k0, hd,
             sh.batch, scale);
    }
  }
  causal_softmax(att, int64_t(B) * NH * T, NH, T, sc);
  if (out == nullptr) return;  // the probabilities only (selective recompute)
  for (int r = 0; r < sh.rep; ++r) {
    const S* a = att + r * sh.TT;  // (B,KVH,T,T) with strides att_bs
    S* o = out + int64_t(r) * hd;  // heads (g, r): (B,T,KVH,hd)
    for (int i0 = 0; i0 < T; i0 += kQueryBlock) {
      const int i1 = std::min(T, i0 + kQueryBlock), k0 = first_column(sc, B, i0);
      // o[i0:i1] = a[i0:i1, k0:i1] · v[k0:i1]
      matmul({o + i0 * sh.out_row, dt, sh.out_row, {out_bs[0], out_bs[1]}},
             {a + int64_t(i0) * T + k0, dt, T, 1, {att_bs[0], att_bs[1]}},
             {v + k0 * sh.qkv_row, et, sh.qkv_row, 1, {qkv_bs[0], qkv_bs[1]}}, i1 - i0, hd, i1 - k0,
             sh.batch);
    }
  }
}

template <typename S, typename E>
void backward_with(S* dqkv, float* scratch, const E* dout, const E* qkv, const S* att, int B, int T,
                   int NH, int KVH, int hd, const AttentionScores& sc) {
  constexpr DType dt = dtype_of<S>(), et = dtype_of<E>();
  const Shape sh(B, T, NH, KVH, hd);
  const int64_t qkv_bs[2] = {T * sh.qkv_row, sh.group};  // batch strides of q, k and v heads
  const int64_t att_bs[2] = {NH * sh.TT, sh.rep * sh.TT};
  const int64_t out_bs[2] = {T * sh.out_row, int64_t(sh.rep) * hd};
  const E* k = qkv + int64_t(sh.rep) * hd;  // (B,T,KVH,hd) with strides (qkv_row, group)
  const E* v = k + hd;                      // (B,T,KVH,hd) with strides (qkv_row, group)
  const float scale = sc.scale_for(hd);
  float* ds = scratch;  // (B,NH,T,T): dprobs, then dscores
  // With a soft cap, the scaled scores before it, recomputed as the forward computed them (fp32).
  float* raw = sc.softcap > 0.0f ? scratch + B * int64_t(NH) * sh.TT : nullptr;  // (B,NH,T,T)
  for (int r = 0; r < sh.rep; ++r) {
    const E* dy = dout + int64_t(r) * hd;  // heads (g, r): (B,T,KVH,hd)
    float* d = ds + r * sh.TT;             // (B,KVH,T,T) with strides att_bs
    for (int i0 = 0; i0 < T; i0 += kQueryBlock) {
      const int i1 = std::min(T, i0 + kQueryBlock), k0 = first_column(sc, B, i0);
      // d[i0:i1, k0:i1] = dy[i0:i1] · v[k0:i1]ᵀ
      matmul({d + int64_t(i0) * T + k0, DType::F32, T, {att_bs[0], att_bs[1]}},
             {dy + i0 * sh.out_row, et, sh.out_row, 1, {out_bs[0], out_bs[1]}},
             {v + k0 * sh.qkv_row, et, 1, sh.qkv_row, {qkv_bs[0], qkv_bs[1]}}, i1 - i0, i1 - k0, hd,
             sh.batch);
      if (raw == nullptr) continue;
      // raw[i0:i1, k0:i1] = scale · q[i0:i1] · k[k0:i1]ᵀ
      matmul({raw + r * sh.TT + int64_t(i0) * T + k0, DType::F32, T, {att_bs[0], att_bs[1]}},
             {qkv + int64_t(r) * hd + i0 * sh.qkv_row, et, sh.qkv_row, 1, {qkv_bs[0], qkv_bs[1]}},
             {k + k0 * sh.qkv_row, et, 1, sh.qkv_row, {qkv_bs[0], qkv_bs[1]}}, i1 - i0, i1 - k0, hd,
             sh.batch, scale);
    }
  }
  causal_softmax_backward(ds, att, raw, int64_t(B) * NH * T, NH, T, sc);

  // With several query heads per kv head, dk/dv sum over r: in place when S is fp32, else in
  // an fp32 copy (B,T,KVH,2,hd) so the sum is not rounded to S after every head.
  const bool via_scratch = sh.rep > 1 && dt != DType::F32;
  const int64_t dkv_row = via_scratch ? 2 * int64_t(KVH) * hd : sh.qkv_row;
  const int64_t dkv_group = via_scratch ? 2 * int64_t(hd) : sh.group;
  const DType dkv_type = via_scratch ? DType::F32 : dt;
  const size_t dkv_size = via_scratch ? sizeof(float) : sizeof(S);
  const int64_t scores = (raw != nullptr ? 2 : 1) * B * int64_t(NH) * sh.TT;  // ds and raw
  char* dk = via_scratch ? reinterpret_cast<char*>(scratch + scores)
                         : reinterpret_cast<char*>(dqkv + int64_t(sh.rep) * hd);  // (B,T,KVH,hd)
  char* dv = dk + dkv_size * hd;                                                  // (B,T,KVH,hd)
  const int64_t dkv_bs[2] = {T * dkv_row, dkv_group};
  for (int r = 0; r < sh.rep; ++r) {
    const E* q = qkv + int64_t(r) * hd;    // heads (g, r): (B,T,KVH,hd)
    const E* dy = dout + int64_t(r) * hd;  // (B,T,KVH,hd)
    const S* a = att + r * sh.TT;          // (B,KVH,T,T) with strides att_bs
    const float* d = ds + r * sh.TT;       // (B,KVH,T,T) with strides att_bs
    S* dq = dqkv + int64_t(r) * hd;        // (B,T,KVH,hd)
    for (int i0 = 0; i0 < T; i0 += kQueryBlock) {
      const int i1 = std::min(T, i0 + kQueryBlock), k0 = first_column(sc, B, i0);
      // dq[i0:i1] = scale · ds[i0:i1, k0:i1] · k[k0:i1]
      matmul({dq + i0 * sh.qkv_row, dt, sh.qkv_row, {qkv_bs[0], qkv_bs[1]}},
             {d + int64_t(i0) * T + k0, DType::F32, T, 1, {att_bs[0], att_bs[1]}},
             {k + k0 * sh.qkv_row, et, sh.qkv_row, 1, {qkv_bs[0], qkv_bs[1]}}, i1 - i0, hd, i1 - k0,
             sh.batch, scale);
      // Keys/values [i0, i1) are seen by queries [i0, T):
      // dk[i0:i1] (+)= scale · ds[i0:T, i0:i1]ᵀ · q[i0:T]
      // dv[i0:i1] (+)= a[i0:T, i0:i1]ᵀ · dy[i0:T]
      int64_t corner = int64_t(i0) * T + i0;
      matmul({dk + dkv_size * i0 * dkv_row, dkv_type, dkv_row, {dkv_bs[0], dkv_bs[1]}},
             {d + corner, DType::F32, 1, T, {att_bs[0], att_bs[1]}},
             {q + i0 * sh.qkv_row, et, sh.qkv_row, 1, {qkv_bs[0], qkv_bs[1]}}, i1 - i0, hd, T - i0,
             sh.batch, scale, r > 0);
      matmul({dv + dkv_size * i0 * dkv_row, dkv_type, dkv_row, {dkv_bs[0], dkv_bs[1]}},
             {a + corner, dt, 1, T, {att_bs[0], att_bs[1]}},
             {dy + i0 * sh.out_row, et, sh.out_row, 1, {out_bs[0], out_bs[1]}}, i1 - i0, hd, T - i0,
             sh.batch, 1.0f, r > 0);
    }
  }
  if (via_scratch) {
    const float* src = reinterpret_cast<const float*>(dk);  // (B,T,KVH,2·hd)
    const int64_t work = int64_t(B) * T * dkv_row;
#pragma omp parallel for schedule(static) if (parallel : work >= kParallelMinWork)
    for (int64_t bt = 0; bt < int64_t(B) * T; ++bt) {
      for (int g = 0; g < KVH; ++g) {
        S* dst = dqkv + bt * sh.qkv_row + g * sh.group + int64_t(sh.rep) * hd;  // (2·hd)
        const float* s = src + bt * dkv_row + g * dkv_group;                    // (2·hd)
#pragma omp simd
        for (int64_t c = 0; c < dkv_group; ++c) dst[c] = store<S>(s[c]);
      }
    }
  }
}

// Unset STRATA_ATTENTION: half storage always tiled; fp32 tiled from this T on, materialized
// below it. Measured with bench/attention_paths on bench-23M's attention (B 8, 8 heads, hd 64;
// forward + backward, minimum of interleaved runs, 2 threads) on an Intel Xeon with AVX-512,
// AVX512_BF16 and AMX (bench/results_attention_2026-12-05.txt), materialized/tiled ms:
// fp32 1.22/1.34 at T 64, 3.73/3.63 at 128, 12.8/11.2 at 256, 68/42 at 512, 336/172 at 1024;
// bf16 1.74/1.31 at 64, 48.9/16.1 at 256; fp16 2.19/1.64 at 64, 24.1/15.4 at 256. At T 64 in
// fp32 the tiled backward's recomputed scores (five products to the materialized path's four)
// cost more than its saved softmax passes.
constexpr int kTiledFromT = 128;

AttentionPath env_path() {
  const char* env = std::getenv("STRATA_ATTENTION");
  if (env == nullptr || *env == '\0') return AttentionPath(-1);
  if (std::strcmp(env, "tiled") == 0) return AttentionPath::Tiled;
  if (std::strcmp(env, "materialized") == 0) return AttentionPath::Materialized;
  STRATA_INPUT_FAIL("STRATA_ATTENTION=", env,
                    " is not an attention path; use tiled, materialized, or leave it unset for the "
                    "measured default");
}

std::atomic<int>& forced_path() {
  static std::atomic<int> p{-1};
  return p;
}

}  // namespace

AttentionPath attention_path(int T, DType act) {
  static const AttentionPath env = env_path();
  const int forced = forced_path().load(std::memory_order_relaxed);
  if (forced >= 0) return AttentionPath(forced);
  if (int(env) >= 0) return env;
  return act != DType::F32 || T >= kTiledFromT ? AttentionPath::Tiled : AttentionPath::Materialized;
}

void set_attention_path(std::optional<AttentionPath> path) {
  forced_path().store(path ? int(*path) : -1, std::memory_order_relaxed);
}

const char* attention_path_name(AttentionPath path) {
  return path == AttentionPath::Tiled ? "tiled" : "materialized";
}

size_t attention_backward_scratch_floats(int B, int T, int NH, int KVH, int hd,
                                         const AttentionScores& sc) {
  size_t dscores = size_t(B) * NH * T * T;
  size_t raw = sc.softcap > 0.0f ? dscores : 0;
  size_t dkv = NH != KVH ? size_t(B) * T * 2 * KVH * hd : 0;
  return dscores + raw + dkv;
}

// Where matmul would widen half-precision operands, the products read q, k, v (and the output
// gradient) from one fp32 copy made per call instead: matmul would copy every key and value
// block once per query block that reads it, about T / (2·kQueryBlock) times each.
template <typename S>
void attention_forward(S* out, S* att, const S* qkv, int B, int T, int NH, int KVH, int hd,
                       const AttentionScores& sc) {
  constexpr DType dt = dtype_of<S>();
  if (dt != DType::F32 && matmul_widens(dt)) {
    const int64_t rows = int64_t(B) * T, qkv_row = Shape(B, T, NH, KVH, hd).qkv_row;
    forward_with(out, att, widen_input(0, qkv, dt, rows, qkv_row), B, T, NH, KVH, hd, sc);
  } else {
    forward_with(out, att, qkv, B, T, NH, KVH, hd, sc);
  }
}

template <typename S>
void attention_backward(S* dqkv, float* scratch, const S* dout, const S* qkv, const S* att, int B,
                        int T, int NH, int KVH, int hd, const AttentionScores& sc) {
  constexpr DType dt = dtype_of<S>();
  if (dt != DType::F32 && matmul_widens(dt)) {
    const Shape sh(B, T, NH, KVH, hd);
    const int64_t rows = int64_t(B) * T;
    backward_with(dqkv, scratch, widen_input(1, dout, dt, rows, sh.out_row),
                  widen_input(0, qkv, dt, rows, sh.qkv_row), att, B, T, NH, KVH, hd, sc);
  } else {
    backward_with(dqkv, scratch, dout, qkv, att, B, T, NH, KVH, hd, sc);
  }
}

#define INSTANTIATE_S(S)                                                                       \
  template void attention_forward<S>(S*, S*, const S*, int, int, int, int, int,                \
                                     const AttentionScores&);                                  \
  template void attention_backward<S>(S*, float*, const S*, const S*, const S*, int, int, int, \
                                      int, int, const AttentionScores&);
STRATA_FOR_EACH_S(INSTANTIATE_S)

}  // namespace strata::kernels
