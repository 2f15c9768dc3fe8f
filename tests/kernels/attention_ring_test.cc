#include "strata/kernels/cpu/attention_ring.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>

#include "kernel_test_util.h"
#include "strata/core/check.h"
#include "strata/kernels/cpu/attention_tiled.h"
#include "strata/kernels/ops.h"

namespace strata::kernels {
namespace {

using test::doc_begin;
using test::rel_err;

// A causal sequence of T split over cp ranks zig-zag: 2·cp chunks of T/(2·cp); rank r holds chunks
// r and 2·cp−1−r, in that order, as its Tl = 2·T/(2·cp) local rows.
struct RingConfig {
  int B, T, NH, KVH, hd, cp;
  int chunk() const { return T / (2 * cp); }
  int Tl() const { return 2 * chunk(); }
  int rep() const { return NH / KVH; }
  int64_t qkv_row() const { return int64_t(NH + 2 * KVH) * hd; }
  int64_t qkv_size() const { return int64_t(B) * T * qkv_row(); }
  int64_t out_size() const { return int64_t(B) * T * NH * hd; }
  int64_t lse_size() const { return int64_t(B) * NH * T; }
  // The sequence chunk in slot k (0 or 1) of rank r.
  int chunk_of(int r, int k) const { return k == 0 ? r : 2 * cp - 1 - r; }
  // The global position of local row i of rank r.
  int pos(int r, int i) const { return chunk_of(r, i / chunk()) * chunk() + i % chunk(); }
};

std::ostream& operator<<(std::ostream& os, const RingConfig& c) {
  return os << "B=" << c.B << " T=" << c.T << " NH=" << c.NH << " KVH=" << c.KVH << " hd=" << c.hd
            << " cp=" << c.cp;
}

// MHA and GQA (rep 2, 3, 4), chunks shorter than, equal to and longer than a 64-row tile, none of
// T a multiple of 64 but the first, and one-row chunks.
const RingConfig kRingConfigs[] = {{2, 256, 4, 4, 16, 2}, {2, 200, 8, 2, 20, 2},
                                   {1, 520, 4, 2, 64, 4}, {2, 264, 6, 2, 32, 4},
                                   {1, 8, 4, 1, 8, 4},    {1, 300, 4, 2, 64, 2}};

// The whole sequence's results, assembled from the ranks' in global order: out (B,T,NH·hd),
// lse (B,NH,T), dqkv (B,T,qkv_row) as attention_tiled's.
struct Assembled {
  std::vector<float> out, lse, dqkv;
};

// A block call of the ring: rank r's local query rows [q0, q0+Tq) against rank s's local key rows
// [k0, k0+Tk).
struct BlockCall {
  int q0, Tq, k0, Tk;
  bool causal;
};

// The blocks rank r computes against the kv of rank s. Per chunk pair: its own chunk's keys
// causal, an earlier chunk's full, a later chunk's skipped. merged: the full pairs that share a
// query or key range as one call (s < r: both query chunks against s's first; s > r: r's second
// against all of s's), as a model would issue them.
std::vector<BlockCall> ring_blocks(const RingConfig& c, int r, int s, bool merged) {
  const int n = c.chunk();
  std::vector<BlockCall> calls;
  if (merged && s < r) return {{0, 2 * n, 0, n, false}};
  if (merged && s > r) return {{n, n, 0, 2 * n, false}};
  for (int qk = 0; qk < 2; ++qk) {
    for (int kk = 0; kk < 2; ++kk) {
      const int a = c.chunk_of(r, qk), b = c.chunk_of(s, kk);
      if (b > a) continue;
      calls.push_back({qk * n, n, kk * n, n, a == b});
    }
  }
  return calls;
}

// Ring attention over the ranks, simulated in one process: each rank's forward steps (its own kv
// first, then rank r−1's, r−2's, … as a ring passes them), then the backward's (the dkv of each
// kv accumulated where it travels, here in one buffer per owner). sc's scale, cap and window
// apply to every block, with the positions of rank r's rows (pos) and of rank s's (kv_pos).
template <typename S>
Assembled run_ring(const RingConfig& c, const std::vector<S>& qkv, const std::vector<S>& dy,
                   bool merged, const AttentionScores& sc = {}) {
  const int Tl = c.Tl(), rep = c.rep();
  std::vector<std::vector<int32_t>> pos(c.cp, std::vector<int32_t>(Tl));
  for (int r = 0; r < c.cp; ++r) {
    for (int i = 0; i < Tl; ++i) pos[r][i] = c.pos(r, i);
  }
  auto block_scores = [&](int r, int s) {
    AttentionScores b = sc;
    b.pos = pos[r].data(), b.kv_pos = pos[s].data();
    return b;
  };
  const int64_t row = c.qkv_row(), orow = int64_t(c.NH) * c.hd, kvrow = int64_t(c.KVH) * 2 * c.hd;
  std::vector<std::vector<S>> lqkv(c.cp), ldy(c.cp), kv(c.cp);
  for (int r = 0; r < c.cp; ++r) {
    lqkv[r].resize(int64_t(c.B) * Tl * row);
    ldy[r].resize(int64_t(c.B) * Tl * orow);
    for (int b = 0; b < c.B; ++b)
      for (int i = 0; i < Tl; ++i) {
        const int64_t gt = int64_t(b) * c.T + c.pos(r, i), lt = int64_t(b) * Tl + i;
        std::copy_n(&qkv[gt * row], row, &lqkv[r][lt * row]);
        std::copy_n(&dy[gt * orow], orow, &ldy[r][lt * orow]);
      }
    kv[r].resize(int64_t(c.B) * Tl * kvrow);
    attention_pack_kv(kv[r].data(), lqkv[r].data(), c.B, Tl, c.NH, c.KVH, c.hd);
  }
  Assembled a{std::vector<float>(c.out_size()), std::vector<float>(c.lse_size()),
              std::vector<float>(c.qkv_size())};
  std::vector<std::vector<float>> dkv(c.cp, std::vector<float>(int64_t(c.B) * Tl * kvrow, 0.0f));
  for (int r = 0; r < c.cp; ++r) {
    std::vector<float> o(int64_t(c.B) * Tl * orow, 0.0f), lse(int64_t(c.B) * c.NH * Tl, -INFINITY);
    for (int step = 0; step < c.cp; ++step) {
      const int s = (r - step + c.cp) % c.cp;
      for (const BlockCall& k : ring_blocks(c, r, s, merged)) {
        attention_block_forward(o.data(), lse.data(), lqkv[r].data(), Tl, k.q0, k.Tq, kv[s].data(),
                                Tl, k.k0, k.Tk, c.B, c.NH, c.KVH, c.hd, k.causal,
                                block_scores(r, s));
      }
    }
    const std::vector<S> out = test::to_dtype<S>(o);
    std::vector<float> delta(lse.size()), dq(o.size(), 0.0f);
    attention_delta(delta.data(), ldy[r].data(), out.data(), c.B, Tl, c.NH, c.hd);
    for (int step = 0; step < c.cp; ++step) {
      const int s = (r - step + c.cp) % c.cp;
      for (const BlockCall& k : ring_blocks(c, r, s, merged)) {
        attention_block_backward(dq.data(), dkv[s].data(), ldy[r].data(), lqkv[r].data(),
                                 lse.data(), delta.data(), Tl, k.q0, k.Tq, kv[s].data(), Tl, k.k0,
                                 k.Tk, c.B, c.NH, c.KVH, c.hd, k.causal, block_scores(r, s));
      }
    }
    for (int b = 0; b < c.B; ++b)
      for (int i = 0; i < Tl; ++i) {
        const int64_t gt = int64_t(b) * c.T + c.pos(r, i), lt = int64_t(b) * Tl + i;
        std::copy_n(&o[lt * orow], orow, &a.out[gt * orow]);
        for (int h = 0; h < c.NH; ++h) {
          a.lse[(int64_t(b) * c.NH + h) * c.T + c.pos(r, i)] =
              lse[(int64_t(b) * c.NH + h) * Tl + i];
          const int g = h / rep;
          std::copy_n(&dq[lt * orow + h * c.hd], c.hd,
                      &a.dqkv[gt * row + (g * (rep + 2) + h % rep) * c.hd]);
        }
      }
  }
  for (int s = 0; s < c.cp; ++s)
    for (int b = 0; b < c.B; ++b)
      for (int i = 0; i < Tl; ++i) {
        const int64_t gt = int64_t(b) * c.T + c.pos(s, i), lt = int64_t(b) * Tl + i;
        for (int g = 0; g < c.KVH; ++g) {
          std::copy_n(&dkv[s][lt * kvrow + g * 2 * c.hd], 2 * c.hd,
                      &a.dqkv[gt * row + (g * (rep + 2) + rep) * c.hd]);
        }
      }
  return a;
}

// attention_tiled on the whole sequence, in fp32.
template <typename S>
Assembled run_tiled(const RingConfig& c, const std::vector<S>& qkv, const std::vector<S>& dy,
                    const AttentionScores& sc = {}) {
  std::vector<S> out(c.out_size()), dqkv(c.qkv_size());
  std::vector<float> lse(c.lse_size());
  attention_tiled_forward(out.data(), lse.data(), qkv.data(), c.B, c.T, c.NH, c.KVH, c.hd, sc);
  attention_tiled_backward(dqkv.data(), dy.data(), qkv.data(), lse.data(), c.B, c.T, c.NH, c.KVH,
                           c.hd, sc);
  return {test::to_float(out), lse, test::to_float(dqkv)};
}

// Both instruction sets' kernels: AVX-512 where the CPU has it, and AVX2.
template <typename F>
void on_each_isa(F&& f) {
  for (bool avx2 : {false, true}) {
    SCOPED_TRACE(avx2 ? "avx2" : "widest");
    attention_tiled_force_avx2(avx2);
    f();
  }
  attention_tiled_force_avx2(false);
}

TEST(AttentionRing, ZigZagMatchesTiled) {
  on_each_isa([] {
    for (const RingConfig& c : kRingConfigs) {
      for (bool merged : {false, true}) {
        SCOPED_TRACE(testing::Message() << c << (merged ? " merged" : " per chunk pair"));
        auto qkv = test::randn(c.qkv_size(), "qkv"), dy = test::randn(c.out_size(), "dy");
        const Assembled ring = run_ring(c, qkv, dy, merged), ref = run_tiled(c, qkv, dy);
        EXPECT_LT(rel_err(ring.out, ref.out), 1e-5);
        EXPECT_LT(rel_err(ring.lse, ref.lse), 1e-5);
        EXPECT_LT(rel_err(ring.dqkv, ref.dqkv), 1e-5);
      }
    }
  });
}

// Sliding windows (with a soft cap and a scale) over the zig-zag ring: windows inside one chunk,
// across the boundary between chunks that live on different ranks (the first rows of a chunk see
// the last keys of the one before it), several chunks wide, and so short that whole blocks fall
// outside them (skipped), per chunk pair and merged; the whole sequence's tiled result, which
// attention_window_test checks against a reference, is the one-piece result.
TEST(AttentionRing, WindowsMatchTiled) {
  struct WindowCase {
    RingConfig c;
    AttentionScores sc;
  };
  const WindowCase cases[] = {
      {{2, 256, 4, 2, 16, 2}, {0.0f, 0.0f, 3}},      // chunks of 64: across the boundaries
      {{2, 256, 4, 2, 16, 2}, {0.3f, 5.0f, 100}},    // wider than a chunk, capped
      {{1, 520, 4, 2, 64, 4}, {0.0f, 5.0f, 70}},     // chunks of 65: whole blocks outside it
      {{2, 200, 8, 2, 20, 2}, {0.3f, 0.0f, 51}},     // chunks of 50, one key past a chunk
      {{1, 8, 4, 1, 8, 4}, {0.0f, 0.0f, 2}},         // one-row chunks
      {{1, 300, 4, 2, 64, 2}, {0.0f, 0.0f, 1000}}};  // window past T: the plain ring
  on_each_isa([&] {
    for (const WindowCase& w : cases) {
      for (bool merged : {false, true}) {
        SCOPED_TRACE(testing::Message()
                     << w.c << " window=" << w.sc.window << " softcap=" << w.sc.softcap
                     << " scale=" << w.sc.scale << (merged ? " merged" : " per chunk pair"));
        auto qkv = test::randn(w.c.qkv_size(), "qkv", 2.0f), dy = test::randn(w.c.out_size(), "dy");
        const Assembled ring = run_ring(w.c, qkv, dy, merged, w.sc);
        const Assembled ref = run_tiled(w.c, qkv, dy, w.sc);
        EXPECT_LT(rel_err(ring.out, ref.out), 1e-5);
        EXPECT_LT(rel_err(ring.lse, ref.lse), 1e-5);
        EXPECT_LT(rel_err(ring.dqkv, ref.dqkv), 1e-5);
        // The window matters here: the plain ring gives another result.
        if (w.sc.window < w.c.T) {
          AttentionScores plain = w.sc;
          plain.window = 0;
          EXPECT_GT(rel_err(run_ring(w.c, qkv, dy, merged, plain).out, ring.out), 1e-2);
        }
      }
    }
  });
}

// A block wholly outside the window reads nothing: NaN keys and values leave the running output,
// lse and gradients as they were, bit for bit.
TEST(AttentionRing, BlockOutsideTheWindowIsSkipped) {
  const RingConfig c{1, 256, 4, 2, 16, 2};  // chunks of 64
  const int n = c.chunk(), Tl = c.Tl();
  // Queries of chunk 2 (positions 128…) against keys of chunk 0 (…63): 65 apart at the nearest.
  const int32_t qpos[2] = {2 * 64, 3 * 64}, kpos[2] = {0, 64};
  std::vector<int32_t> pos(Tl), kv_pos(Tl);
  for (int i = 0; i < Tl; ++i) pos[i] = qpos[i / n] + i % n, kv_pos[i] = kpos[i / n] + i % n;
  const AttentionScores sc{0.0f, 0.0f, 65, pos.data(), kv_pos.data()};
  auto qkv = test::randn(int64_t(c.B) * Tl * c.qkv_row(), "qkv");
  std::vector<float> kv(int64_t(c.B) * Tl * c.KVH * 2 * c.hd,
                        std::numeric_limits<float>::quiet_NaN());
  auto o = test::randn(int64_t(c.B) * Tl * c.NH * c.hd, "o"), lse = test::randn(c.NH * Tl, "lse");
  auto dq = o, dkv = test::randn(kv.size(), "dkv");
  const auto o0 = o, lse0 = lse, dq0 = dq, dkv0 = dkv;
  attention_block_forward(o.data(), lse.data(), qkv.data(), Tl, 0, n, kv.data(), Tl, 0, n, c.B,
                          c.NH, c.KVH, c.hd, false, sc);
  attention_block_backward(dq.data(), dkv.data(), o.data(), qkv.data(), lse.data(), lse.data(), Tl,
                           0, n, kv.data(), Tl, 0, n, c.B, c.NH, c.KVH, c.hd, false, sc);
  EXPECT_TRUE(test::bit_equal(o, o0));
  EXPECT_TRUE(test::bit_equal(lse, lse0));
  EXPECT_TRUE(test::bit_equal(dq, dq0));
  EXPECT_TRUE(test::bit_equal(dkv, dkv0));
  // One position nearer, the window reaches the last key: the block is computed (NaN everywhere).
  std::vector<int32_t> nearer = pos;
  for (int i = 0; i < n; ++i) nearer[i] -= 1;
  const AttentionScores in{0.0f, 0.0f, 65, nearer.data(), kv_pos.data()};
  attention_block_forward(o.data(), lse.data(), qkv.data(), Tl, 0, n, kv.data(), Tl, 0, n, c.B,
                          c.NH, c.KVH, c.hd, false, in);
  EXPECT_TRUE(std::isnan(o[0]));
}

// Documents over the zig-zag ring: documents inside a chunk, starting on a chunk boundary or one
// past it, spanning chunks of different ranks, of one row; alone and with a window, a soft cap and
// a scale; per chunk pair and merged: the whole sequence's tiled result with the same documents
// (attention_documents_test holds that to each document alone).
TEST(AttentionRing, DocumentsMatchTiled) {
  struct DocCase {
    RingConfig c;
    AttentionScores sc;
    std::vector<std::vector<int>> starts;  // per batch row
  };
  const DocCase cases[] = {{{2, 256, 4, 2, 16, 2}, {}, {{0, 50, 64, 200}, {0, 128}}},
                           {{2, 256, 4, 2, 16, 2}, {0.3f, 5.0f, 100}, {{0, 3, 190}, {0, 255}}},
                           {{1, 520, 4, 2, 64, 4}, {0.0f, 5.0f, 70}, {{0, 65, 66, 300, 519}}},
                           {{2, 200, 8, 2, 20, 2}, {}, {{0, 100}, {0, 1, 2, 150}}},
                           {{1, 8, 4, 1, 8, 4}, {}, {{0, 3, 4, 7}}}};
  on_each_isa([&] {
    for (const DocCase& d : cases) {
      const std::vector<int32_t> docs = doc_begin(d.c.T, d.starts);
      AttentionScores sc = d.sc;
      sc.doc_begin = docs.data(), sc.seq = d.c.T;
      for (bool merged : {false, true}) {
        SCOPED_TRACE(testing::Message() << d.c << " window=" << sc.window << " softcap="
                                        << sc.softcap << (merged ? " merged" : " per chunk pair"));
        auto qkv = test::randn(d.c.qkv_size(), "qkv", 2.0f), dy = test::randn(d.c.out_size(), "dy");
        const Assembled ring = run_ring(d.c, qkv, dy, merged, sc);
        const Assembled ref = run_tiled(d.c, qkv, dy, sc);
        EXPECT_LT(rel_err(ring.out, ref.out), 1e-5);
        EXPECT_LT(rel_err(ring.lse, ref.lse), 1e-5);
        EXPECT_LT(rel_err(ring.dqkv, ref.dqkv), 1e-5);
        EXPECT_GT(rel_err(run_ring(d.c, qkv, dy, merged, d.sc).out, ring.out), 1e-2)
            << "the documents matter";
      }
    }
  });
}

// A block whose keys all lie before the documents of a batch row's queries reads nothing of that
// row: its NaN keys and values leave the row's running output, lse and gradients as they were, bit
// for bit, while the other row, one document, is computed; where no row sees the block, nothing
// changes at all.
TEST(AttentionRing, BlockAcrossDocumentsIsSkipped) {
  const RingConfig c{2, 256, 4, 2, 16, 2};  // chunks of 64
  const int n = c.chunk(), Tl = c.Tl();
  // Queries of chunk 2 (positions 128…) against keys of chunk 0 (…63).
  std::vector<int32_t> pos(Tl), kv_pos(Tl);
  for (int i = 0; i < Tl; ++i) pos[i] = 2 * 64 + i, kv_pos[i] = i;
  const int64_t orow = int64_t(c.NH) * c.hd, kvrow = int64_t(c.KVH) * 2 * c.hd;
  auto qkv = test::randn(int64_t(c.B) * Tl * c.qkv_row(), "qkv");
  auto kv = test::randn(int64_t(c.B) * Tl * kvrow, "kv");
  std::fill(kv.begin(), kv.begin() + Tl * kvrow, std::numeric_limits<float>::quiet_NaN());
  for (const auto& starts : {std::vector<std::vector<int>>{{0, 100}, {0}},
                             std::vector<std::vector<int>>{{0, 100}, {0, 64}}}) {
    const bool second_sees = starts[1].size() == 1;
    SCOPED_TRACE(second_sees ? "row 1 sees the block" : "no row sees the block");
    const std::vector<int32_t> docs = doc_begin(c.T, starts);
    AttentionScores sc;
    sc.pos = pos.data(), sc.kv_pos = kv_pos.data(), sc.doc_begin = docs.data(), sc.seq = c.T;
    auto o = test::randn(int64_t(c.B) * Tl * orow, "o");
    std::vector<float> lse(int64_t(c.B) * c.NH * Tl, -INFINITY), dq(o.size(), 0.0f);
    std::vector<float> dkv(kv.size(), 0.0f);
    const auto o0 = o, lse0 = lse;
    attention_block_forward(o.data(), lse.data(), qkv.data(), Tl, 0, n, kv.data(), Tl, 0, n, c.B,
                            c.NH, c.KVH, c.hd, false, sc);
    std::vector<float> delta(lse.size(), 0.5f);
    attention_block_backward(dq.data(), dkv.data(), o0.data(), qkv.data(), lse.data(), delta.data(),
                             Tl, 0, n, kv.data(), Tl, 0, n, c.B, c.NH, c.KVH, c.hd, false, sc);
    auto half = [](const std::vector<float>& v, int b) {
      const size_t h = v.size() / 2;
      return std::vector<float>(v.begin() + b * h, v.begin() + (b + 1) * h);
    };
    EXPECT_TRUE(test::bit_equal(half(o, 0), half(o0, 0)));
    EXPECT_TRUE(test::bit_equal(half(lse, 0), half(lse0, 0)));
    EXPECT_TRUE(test::bit_equal(half(dq, 0), std::vector<float>(dq.size() / 2, 0.0f)));
    EXPECT_TRUE(test::bit_equal(half(dkv, 0), std::vector<float>(dkv.size() / 2, 0.0f)));
    EXPECT_EQ(test::bit_equal(half(o, 1), half(o0, 1)), !second_sees);
    EXPECT_EQ(test::bit_equal(half(dkv, 1), std::vector<float>(dkv.size() / 2, 0.0f)),
              !second_sees);
    for (float x : o) ASSERT_TRUE(std::isfinite(x));
    for (float x : dkv) ASSERT_TRUE(std::isfinite(x));
  }
}

// The op layer's ring pieces: one sequence held whole, its chunks' blocks at positions q0 and k0
// (window, cap and scale passed through), give the op layer's tiled attention; with a rank's
// positions (pos), whose visiting keys' positions the shape cannot say, a window is refused.
TEST(AttentionRing, OpsBlocksWithWindow) {
  ops::AttentionShape s{1, 192, 2, 2, 16};  // 4 heads over 2 groups; 3 chunks of 64
  s.scale = 0.3f, s.softcap = 5.0f, s.window = 70;
  const int c = 64, NH = 4;
  const int64_t qkv_n = int64_t(s.T) * 2 * 4 * s.hd, out_n = int64_t(s.T) * NH * s.hd;
  const int64_t kv_n = int64_t(s.T) * 2 * 2 * s.hd, lse_n = int64_t(NH) * s.T;
  auto qkv = test::randn(qkv_n, "qkv", 2.0f), dy = test::randn(out_n, "dy");
  std::vector<float> kv(kv_n), o(out_n), lse(lse_n), delta(lse_n), dq(out_n, 0.0f), dkv(kv_n, 0.0f),
      dqkv(qkv_n);
  auto T = [](std::vector<float>& v) { return Tensor(v.data(), DType::F32, {int64_t(v.size())}); };
  ops::attention_pack_kv(T(kv), T(qkv), s);
  ops::attention_lse_clear(T(lse));
  for (int a = 0; a < 3; ++a) {
    for (int b = a; b >= 0; --b) {
      ops::attention_block_forward(T(o), T(lse), T(qkv), a * c, c, T(kv), b * c, c, s, a == b);
    }
  }
  ops::attention_delta(T(delta), T(dy), T(o), s);
  for (int a = 0; a < 3; ++a) {
    for (int b = a; b >= 0; --b) {
      ops::attention_block_backward(T(dq), T(dkv), T(dy), T(qkv), T(lse), T(delta), a * c, c, T(kv),
                                    b * c, c, s, a == b);
    }
  }
  ops::attention_unpack_dqkv(T(dqkv), T(dq), T(dkv), s);
  set_attention_path(AttentionPath::Tiled);
  std::vector<float> out(out_n), tlse(lse_n), tdqkv(qkv_n);
  ops::attention_forward(T(out), T(tlse), T(qkv), s);
  std::vector<float> scratch(1);
  ops::attention_backward(T(tdqkv), T(scratch), T(dy), T(qkv), T(tlse), s);
  set_attention_path(std::nullopt);
  EXPECT_LT(rel_err(o, out), 1e-5);
  EXPECT_LT(rel_err(lse, tlse), 1e-5);
  EXPECT_LT(rel_err(dqkv, tdqkv), 1e-5);
  std::vector<int32_t> pos(s.T);
  for (int t = 0; t < s.T; ++t) pos[t] = t;
  s.pos = pos.data();
  EXPECT_THROW(ops::attention_block_forward(T(o), T(lse), T(qkv), 0, c, T(kv), 0, c, s, true),
               Error);
}

// Half storage: q, k, v widen exactly and everything inside is fp32, as the tiled kernel; the
// tiled output is rounded once (u/2) and the ring's fp32 output not at all, so 2u covers it; the
// lse is the same fp32 math in another order. Backward: the ring's delta is from the output
// rounded to S (the tiled kernel's from fp32 P·dP), an error of about u in delta that dS = P ∘
// (dP − delta) carries to the gradients, and the tiled gradients are rounded once (u/2):
// measured under 0.8u for both types, so 2u.
template <typename S>
void check_ring_half(double u) {
  for (const RingConfig& c : kRingConfigs) {
    SCOPED_TRACE(testing::Message() << c);
    auto qkv = test::to_dtype<S>(test::randn(c.qkv_size(), "qkv"));
    auto dy = test::to_dtype<S>(test::randn(c.out_size(), "dy"));
    const Assembled ring = run_ring(c, qkv, dy, false), ref = run_tiled(c, qkv, dy);
    EXPECT_LT(rel_err(ring.out, ref.out), 2 * u);
    EXPECT_LT(rel_err(ring.lse, ref.lse), 1e-5);
    EXPECT_LT(rel_err(ring.dqkv, ref.dqkv), 2 * u);
  }
}

TEST(AttentionRing, HalfMatchesTiled) {
  check_ring_half<bf16>(0x1p-8);
  check_ring_half<f16>(0x1p-11);
}

// A ring of one rank: one causal block over the whole sequence is the tiled forward, bit for bit
// (the first block of a row is written as attention_tiled_forward writes it).
TEST(AttentionRing, OneCausalBlockIsTheTiledForward) {
  on_each_isa([] {
    for (const RingConfig& c : kRingConfigs) {
      SCOPED_TRACE(testing::Message() << c);
      auto qkv = test::randn(c.qkv_size(), "qkv");
      std::vector<float> kv(int64_t(c.B) * c.T * c.KVH * 2 * c.hd);
      attention_pack_kv(kv.data(), qkv.data(), c.B, c.T, c.NH, c.KVH, c.hd);
      std::vector<float> o(c.out_size(), 7.0f), lse(c.lse_size(), -INFINITY);
      attention_block_forward(o.data(), lse.data(), qkv.data(), c.T, 0, c.T, kv.data(), c.T, 0, c.T,
                              c.B, c.NH, c.KVH, c.hd, true);
      std::vector<float> out(c.out_size()), tlse(c.lse_size());
      attention_tiled_forward(out.data(), tlse.data(), qkv.data(), c.B, c.T, c.NH, c.KVH, c.hd);
      EXPECT_TRUE(test::bit_equal(o, out));
      EXPECT_TRUE(test::bit_equal(lse, tlse));
    }
  });
}

// Every output element is one thread's, in a fixed order: 1, 2 and 3 threads give the same bits.
template <typename S>
void check_thread_counts() {
  const RingConfig c{2, 300, 8, 4, 64, 2};  // chunks of 75: two query tiles, a partial one
  auto qkv = test::to_dtype<S>(test::randn(c.qkv_size(), "qkv"));
  auto dy = test::to_dtype<S>(test::randn(c.out_size(), "dy"));
  auto run = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    Assembled a = run_ring(c, qkv, dy, true);
    omp_set_num_threads(saved);
    a.out.insert(a.out.end(), a.lse.begin(), a.lse.end());
    a.out.insert(a.out.end(), a.dqkv.begin(), a.dqkv.end());
    return a.out;
  };
  const std::vector<float> one = run(1);
  EXPECT_TRUE(test::bit_equal(one, run(2)));
  EXPECT_TRUE(test::bit_equal(one, run(3)));
}

TEST(AttentionRing, BitIdenticalAcrossThreadCounts) {
  on_each_isa([] {
    check_thread_counts<float>();
    check_thread_counts<bf16>();
    check_thread_counts<f16>();
  });
}

TEST(AttentionRing, RejectsBadBlocks) {
  std::vector<float> buf(10000);
  float* p = buf.data();
  // A causal block is diagonal.
  EXPECT_THROW(attention_block_forward(p, p, p, 8, 0, 4, p, 8, 0, 3, 1, 2, 1, 4, true), Error);
  // Rows outside the buffers.
  EXPECT_THROW(attention_block_forward(p, p, p, 8, 6, 4, p, 8, 0, 4, 1, 2, 1, 4, false), Error);
  EXPECT_THROW(attention_block_backward(p, p, p, p, p, p, 8, 0, 4, p, 8, 5, 4, 1, 2, 1, 4, false),
               Error);
  EXPECT_THROW(attention_block_forward(p, p, p, 8, 0, 4, p, 8, 0, 4, 1, 3, 2, 4, false), Error);
}

// The per-thread workspace is linear in the block's keys.
TEST(AttentionRing, WorkspaceIsLinearInTheBlock) {
  const size_t w1 = attention_block_workspace_floats(256, 64);
  const size_t w2 = attention_block_workspace_floats(512, 64);
  const size_t w4 = attention_block_workspace_floats(1024, 64);
  EXPECT_EQ(w4 - w2, 2 * (w2 - w1));
}

}  // namespace
}  // namespace strata::kernels
