// Document masking (ops::AttentionShape::doc_begin): sequences that pack several documents give,
// row for row, what each document gives alone as a sequence of its own (positions restarting), in
// attention on both CPU paths (forward, its saved log-sum-exp, backward; with a window, a soft cap
// and a scale), in RoPE and in the learned position embedding (whole sequences, sequence-parallel
// shards of rows, context parallelism's positions). Without documents nothing changes, bit for
// bit.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "strata/core/check.h"
#include "strata/kernels/cpu/attention.h"
#include "strata/kernels/ops.h"

namespace strata::kernels {
namespace {

using test::rel_err;

// B = starts.size() sequences of T rows; starts[b]: where sequence b's documents start (the
// first at 0).
struct Case {
  int T, NH, KVH, hd;
  float scale, softcap;
  int window;
  std::vector<std::vector<int>> starts;
  int B() const { return int(starts.size()); }
  int64_t qkv_row() const { return int64_t(NH + 2 * KVH) * hd; }
  int64_t out_row() const { return int64_t(NH) * hd; }
  // Shape of `rows` rows of `seqs` sequences, with the case's scores.
  ops::AttentionShape shape(int seqs, int rows) const {
    ops::AttentionShape s{seqs, rows, KVH, NH / KVH, hd};
    s.scale = scale, s.softcap = softcap, s.window = window;
    return s;
  }
  // Sequence b's documents as [begin, end) rows.
  std::vector<std::pair<int, int>> documents(int b) const {
    std::vector<std::pair<int, int>> d;
    const std::vector<int>& s = starts[size_t(b)];
    for (size_t i = 0; i < s.size(); ++i) d.push_back({s[i], i + 1 < s.size() ? s[i + 1] : T});
    return d;
  }
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  os << "T=" << c.T << " NH=" << c.NH << " KVH=" << c.KVH << " hd=" << c.hd << " scale=" << c.scale
     << " softcap=" << c.softcap << " window=" << c.window << " starts";
  for (const auto& s : c.starts) {
    os << " {";
    for (int x : s) os << ' ' << x;
    os << " }";
  }
  return os;
}

// doc_begin (B, T): for each position, where its document starts.
std::vector<int32_t> doc_begin(const Case& c) {
  std::vector<int32_t> d;
  for (int b = 0; b < c.B(); ++b) {
    for (const auto& [begin, end] : c.documents(b)) d.insert(d.end(), size_t(end - begin), begin);
  }
  return d;
}

// Documents across and on tile boundaries (64 rows), one-row documents, a sequence that is one
// document beside one that is not; MHA and GQA (2 and 4 query heads per kv head); windows inside
// a document and wider than one, a soft cap and a scale.
const Case kCases[] = {
    {150, 4, 2, 16, 0.0f, 0.0f, 0, {{0, 37, 100}, {0, 64, 65, 149}}},
    {150, 4, 1, 16, 0.3f, 5.0f, 20, {{0, 10, 90}, {0}}},
    {70, 2, 2, 24, 0.0f, 0.0f, 3, {{0, 1, 2, 35}, {0, 50}}},
    {200, 4, 2, 16, 0.0f, 5.0f, 64, {{0, 128}, {0, 63, 127}}},
};

// One call's results through the op layer on the path in force: out and dqkv in S, and the saved
// state as fp32 where it is the tiled path's log-sum-exp (B, NH, T).
template <typename S>
struct Results {
  std::vector<S> out, dqkv;
  std::vector<float> lse;
};

template <typename S>
Results<S> attend(const ops::AttentionShape& s, const std::vector<S>& qkv,
                  const std::vector<S>& dy) {
  constexpr DType dt = dtype_of<S>();
  const int64_t rows = int64_t(s.B) * s.T, NH = int64_t(s.groups) * s.rep;
  const int64_t qkv_n = rows * s.groups * (s.rep + 2) * s.hd, out_n = rows * NH * s.hd;
  const ops::AttentionSaved a = ops::attention_saved(Device::CPU, dt, s);
  Results<S> r{std::vector<S>(size_t(out_n)), std::vector<S>(size_t(qkv_n)), {}};
  std::vector<float> att(size_t(a.numel));  // fp32 lse, or the probabilities in S (fewer bytes)
  std::vector<float> scratch(
      std::max<size_t>(1, ops::attention_backward_scratch_floats(Device::CPU, dt, s)));
  const Tensor ta(att.data(), a.dtype, {a.numel});
  const Tensor tq(const_cast<S*>(qkv.data()), dt, {qkv_n});
  ops::attention_forward(Tensor(r.out.data(), dt, {out_n}), ta, tq, s);
  ops::attention_backward(Tensor(r.dqkv.data(), dt, {qkv_n}),
                          Tensor(scratch.data(), DType::F32, {int64_t(scratch.size())}),
                          Tensor(const_cast<S*>(dy.data()), dt, {out_n}), tq, ta, s);
  if (attention_path(s.T, dt) == AttentionPath::Tiled) r.lse = att;
  return r;
}

// Packed (with doc_begin) and separate (each document alone, its results put back in place),
// as fp32.
struct Both {
  std::vector<float> out, dqkv, lse;
  std::vector<float> sep_out, sep_dqkv, sep_lse;
};

template <typename S>
Both packed_and_separate(AttentionPath path, const Case& c, const std::vector<float>& qkv32,
                         const std::vector<float>& dy32) {
  set_attention_path(path);
  const std::vector<S> qkv = test::to_dtype<S>(qkv32), dy = test::to_dtype<S>(dy32);
  const std::vector<int32_t> docs = doc_begin(c);
  ops::AttentionShape s = c.shape(c.B(), c.T);
  s.doc_begin = docs.data(), s.seq = c.T;
  const Results<S> p = attend(s, qkv, dy);
  Both r{test::to_float(p.out), test::to_float(p.dqkv), p.lse, {}, {}, {}};
  r.sep_out.resize(r.out.size()), r.sep_dqkv.resize(r.dqkv.size()), r.sep_lse.resize(r.lse.size());
  const int64_t row = c.qkv_row(), orow = c.out_row();
  for (int b = 0; b < c.B(); ++b) {
    for (const auto& [begin, end] : c.documents(b)) {
      const int n = end - begin;
      const int64_t first = int64_t(b) * c.T + begin;  // the document's first row
      const std::vector<S> q(qkv.begin() + first * row, qkv.begin() + (first + n) * row);
      const std::vector<S> d(dy.begin() + first * orow, dy.begin() + (first + n) * orow);
      const Results<S> one = attend(c.shape(1, n), q, d);
      const std::vector<float> o = test::to_float(one.out), dq = test::to_float(one.dqkv);
      std::copy(o.begin(), o.end(), r.sep_out.begin() + first * orow);
      std::copy(dq.begin(), dq.end(), r.sep_dqkv.begin() + first * row);
      for (int h = 0; h < c.NH && !one.lse.empty(); ++h) {
        std::copy_n(one.lse.begin() + int64_t(h) * n, n,
                    r.sep_lse.begin() + (int64_t(b) * c.NH + h) * c.T + begin);
      }
    }
  }
  set_attention_path(std::nullopt);
  return r;
}

// fp32: each packed row is its document's alone to within rounding (the products and sums meet
// the same terms in other tiles and orders), on both paths.
TEST(AttentionDocuments, Fp32EqualsEachDocumentAlone) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << c);
    const auto qkv = test::randn(size_t(c.B()) * c.T * c.qkv_row(), "qkv");
    const auto dy = test::randn(size_t(c.B()) * c.T * c.out_row(), "dy");
    for (AttentionPath path : {AttentionPath::Tiled, AttentionPath::Materialized}) {
      SCOPED_TRACE(attention_path_name(path));
      const Both r = packed_and_separate<float>(path, c, qkv, dy);
      EXPECT_LT(rel_err(r.out, r.sep_out), 1e-6);
      EXPECT_LT(rel_err(r.dqkv, r.sep_dqkv), 1e-6);
      EXPECT_LT(rel_err(r.lse, r.sep_lse), 1e-6);
    }
  }
}

// bf16: the same within a rounding of the outputs (and, on the materialized path, of the scores
// and probabilities, which the kernel stores in bf16): 1e-2 of the largest value.
TEST(AttentionDocuments, Bf16EqualsEachDocumentAlone) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(testing::Message() << c);
    const auto qkv = test::rounded<bf16>(test::randn(size_t(c.B()) * c.T * c.qkv_row(), "qkv"));
    const auto dy = test::rounded<bf16>(test::randn(size_t(c.B()) * c.T * c.out_row(), "dy"));
    for (AttentionPath path : {AttentionPath::Tiled, AttentionPath::Materialized}) {
      SCOPED_TRACE(attention_path_name(path));
      const Both r = packed_and_separate<bf16>(path, c, qkv, dy);
      EXPECT_LT(rel_err(r.out, r.sep_out), 1e-2);
      EXPECT_LT(rel_err(r.dqkv, r.sep_dqkv), 1e-2);
      EXPECT_LT(rel_err(r.lse, r.sep_lse), 1e-5);
    }
  }
}

// Documents change the results: the same batch as one document per sequence differs (so the
// tests above could fail), and doc_begin all zeros is no documents, bit for bit.
TEST(AttentionDocuments, OneDocumentIsNoDocuments) {
  const Case& c = kCases[1];
  const auto qkv = test::randn(size_t(c.B()) * c.T * c.qkv_row(), "qkv");
  const auto dy = test::randn(size_t(c.B()) * c.T * c.out_row(), "dy");
  const std::vector<int32_t> zeros(size_t(c.B()) * c.T, 0), docs = doc_begin(c);
  for (AttentionPath path : {AttentionPath::Tiled, AttentionPath::Materialized}) {
    SCOPED_TRACE(attention_path_name(path));
    set_attention_path(path);
    ops::AttentionShape s = c.shape(c.B(), c.T);
    const Results<float> plain = attend(s, qkv, dy);
    s.doc_begin = zeros.data(), s.seq = c.T;
    const Results<float> one = attend(s, qkv, dy);
    EXPECT_TRUE(test::bit_equal(one.out, plain.out));
    EXPECT_TRUE(test::bit_equal(one.dqkv, plain.dqkv));
    s.doc_begin = docs.data();
    const Results<float> packed = attend(s, qkv, dy);
    EXPECT_GT(rel_err(packed.out, plain.out), 1e-2);
    EXPECT_GT(rel_err(packed.dqkv, plain.dqkv), 1e-2);
  }
  set_attention_path(std::nullopt);
}

// The work across documents is skipped, not computed and masked: keys and values 0..63 set to
// NaN reach no query of a tile (64 rows) whose document starts at 64 or later. Queries 128..255
// of a sequence whose second document starts at 100 stay finite and equal that document alone, on
// both paths; a kernel that multiplied the masked columns would spread the NaN (0·NaN).
TEST(AttentionDocuments, KeyTilesBeforeADocumentAreSkipped) {
  const Case c{256, 2, 1, 16, 0.0f, 0.0f, 0, {{0, 100}}};
  auto qkv = test::randn(size_t(c.T) * c.qkv_row(), "qkv");
  const auto dy = test::randn(size_t(c.T) * c.out_row(), "dy");
  const int64_t row = c.qkv_row(), orow = c.out_row();
  const Both ref = packed_and_separate<float>(AttentionPath::Tiled, c, qkv, dy);
  for (int t = 0; t < 64; ++t) {
    for (int e = 0; e < 2 * c.hd; ++e) {
      qkv[size_t(t * row + c.NH * c.hd + e)] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  const std::vector<int32_t> docs = doc_begin(c);
  ops::AttentionShape s = c.shape(1, c.T);
  s.doc_begin = docs.data(), s.seq = c.T;
  for (AttentionPath path : {AttentionPath::Tiled, AttentionPath::Materialized}) {
    SCOPED_TRACE(attention_path_name(path));
    set_attention_path(path);
    std::vector<float> out(size_t(c.T * orow)),
        att(size_t(ops::attention_saved(Device::CPU, DType::F32, s).numel));
    ops::attention_forward(Tensor(out.data(), DType::F32, {c.T * orow}),
                           Tensor(att.data(), DType::F32, {int64_t(att.size())}),
                           Tensor(qkv.data(), DType::F32, {c.T * row}), s);
    const std::vector<float> late(out.begin() + 128 * orow, out.end());
    const std::vector<float> want(ref.sep_out.begin() + 128 * orow, ref.sep_out.end());
    for (float x : late) ASSERT_TRUE(std::isfinite(x));
    EXPECT_LT(rel_err(late, want), 1e-6);
  }
  set_attention_path(std::nullopt);
}

TEST(AttentionDocuments, RejectsBadStarts) {
  const Case c{8, 2, 1, 8, 0.0f, 0.0f, 0, {{0}}};
  std::vector<float> qkv(size_t(c.T) * c.qkv_row()), out(size_t(c.T) * c.out_row()), lse(16);
  set_attention_path(AttentionPath::Tiled);
  ops::AttentionShape s = c.shape(1, c.T);
  const auto run = [&] {
    ops::attention_forward(Tensor(out.data(), DType::F32, {int64_t(out.size())}),
                           Tensor(lse.data(), DType::F32, {16}),
                           Tensor(qkv.data(), DType::F32, {int64_t(qkv.size())}), s);
  };
  const int32_t after[8] = {0, 0, 3, 3, 3, 3, 3, 3};       // position 2's document starts at 3
  const int32_t decreasing[8] = {0, 0, 2, 2, 1, 5, 5, 5};  // a start before the previous one's
  const int32_t fine[8] = {0, 0, 2, 2, 2, 5, 5, 5};
  s.seq = c.T;
  for (const int32_t* bad : {after, decreasing}) {
    s.doc_begin = bad;
    EXPECT_THROW(run(), Error);
  }
  s.doc_begin = fine;
  EXPECT_NO_THROW(run());
  s.seq = c.T - 1;  // row 7 lies outside the sequences
  EXPECT_THROW(run(), Error);
  set_attention_path(std::nullopt);
}

// --- RoPE --------------------------------------------------------------------------------------

// Each row rotates by its position in its document: packed, the rows are what each document
// gives alone (bit for bit: the same angles), forward and backward; and with context
// parallelism's positions (rows at positions pos of a longer sequence), what rows at the
// documents' own positions give.
TEST(RopeDocuments, RotatesByThePositionInTheDocument) {
  const Case c{40, 4, 2, 16, 0.0f, 0.0f, 0, {{0, 7, 30}, {0, 1, 39}}};
  const ops::Rope rope = ops::rope_default(c.hd, 10000.0f);
  const std::vector<int32_t> docs = doc_begin(c);
  const int64_t row = c.qkv_row();
  const auto x = test::randn(size_t(c.B()) * c.T * row, "x");
  for (bool forward : {true, false}) {
    SCOPED_TRACE(forward ? "forward" : "backward");
    const auto rotate = [&](std::vector<float>& v, const ops::AttentionShape& s) {
      const Tensor t(v.data(), DType::F32, {int64_t(v.size())});
      forward ? ops::rope_forward(t, s, rope) : ops::rope_backward(t, s, rope);
    };
    std::vector<float> packed = x, separate = x;
    ops::AttentionShape s = c.shape(c.B(), c.T);
    s.doc_begin = docs.data(), s.seq = c.T;
    rotate(packed, s);
    for (int b = 0; b < c.B(); ++b) {
      for (const auto& [begin, end] : c.documents(b)) {
        const int64_t first = int64_t(b) * c.T + begin;
        std::vector<float> one(x.begin() + first * row, x.begin() + (first + end - begin) * row);
        rotate(one, c.shape(1, end - begin));
        std::copy(one.begin(), one.end(), separate.begin() + first * row);
      }
    }
    EXPECT_TRUE(test::bit_equal(packed, separate));
    std::vector<float> plain = x;
    rotate(plain, c.shape(c.B(), c.T));
    EXPECT_FALSE(test::bit_equal(packed, plain));

    // 16 rows of each sequence at positions 2, 4, …, 32 (a rank's share under context
    // parallelism): sequence b's rows rotate as rows at positions p − doc_begin[b][p].
    const int Tl = 16;
    std::vector<int32_t> pos(Tl);
    for (int t = 0; t < Tl; ++t) pos[size_t(t)] = 2 * (t + 1);
    std::vector<float> shard(x.begin(), x.begin() + int64_t(c.B()) * Tl * row);
    ops::AttentionShape ss = c.shape(c.B(), Tl);
    ss.pos = pos.data(), ss.doc_begin = docs.data(), ss.seq = c.T;
    rotate(shard, ss);
    for (int b = 0; b < c.B(); ++b) {
      std::vector<int32_t> in_doc(Tl);
      for (int t = 0; t < Tl; ++t)
        in_doc[size_t(t)] = pos[size_t(t)] - docs[size_t(b * c.T + pos[size_t(t)])];
      std::vector<float> want(x.begin() + int64_t(b) * Tl * row,
                              x.begin() + int64_t(b + 1) * Tl * row);
      ops::AttentionShape one = c.shape(1, Tl);
      one.pos = in_doc.data();
      rotate(want, one);
      EXPECT_TRUE(test::bit_equal(std::vector<float>(shard.begin() + int64_t(b) * Tl * row,
                                                     shard.begin() + int64_t(b + 1) * Tl * row),
                                  want))
          << "sequence " << b;
    }
  }
}

// --- learned position embedding ------------------------------------------------------------------

// A row takes the table's row of its position in its document: packed, the forward gives each
// document's alone bit for bit and the backward their sum (fp32, to rounding: the packed sum adds
// every row of a table row in fp32 once); sequence-parallel shards of the rows (pos0) give the
// whole's rows and, summed, its gradient; context parallelism's rows (pos) the rows of the whole
// at their positions. C = 70 spans two channel blocks of the backward.
TEST(PositionDocuments, TakesThePositionInTheDocument) {
  const Case c{24, 1, 1, 1, 0.0f, 0.0f, 0, {{0, 5, 17}, {0, 1, 2, 23}}};
  const int64_t B = c.B(), T = c.T, C = 70, N = B * T;
  const std::vector<int32_t> docs = doc_begin(c);
  const auto wpe = test::randn(size_t(T * C), "wpe"), tok = test::randn(size_t(N * C), "tok");
  const auto dout = test::randn(size_t(N * C), "dout"), dw0 = test::randn(size_t(T * C), "dw0");
  auto view = [](const std::vector<float>& v, int64_t rows, int64_t cols, int64_t at = 0) {
    return Tensor(const_cast<float*>(v.data()) + at * cols, DType::F32, {rows, cols});
  };

  std::vector<float> out = tok, dwpe = dw0;
  ops::position_forward(view(out, N, C), view(wpe, T, C), T, 0, nullptr, docs.data(), T);
  ops::position_backward(view(dwpe, T, C), view(dout, N, C), T, 0, nullptr, docs.data(), T);
  std::vector<float> sep_out = tok, sep_dwpe = dw0;
  for (int b = 0; b < B; ++b) {
    for (const auto& [begin, end] : c.documents(b)) {
      const int64_t first = b * T + begin, n = end - begin;
      ops::position_forward(view(sep_out, n, C, first), view(wpe, T, C), n, 0);
      ops::position_backward(view(sep_dwpe, T, C), view(dout, n, C, first), n, 0);
    }
  }
  EXPECT_TRUE(test::bit_equal(out, sep_out));
  EXPECT_LT(rel_err(dwpe, sep_dwpe), 1e-6);
  std::vector<float> plain = tok;
  ops::position_forward(view(plain, N, C), view(wpe, T, C), T, 0);
  EXPECT_FALSE(test::bit_equal(out, plain));

  // Three sequence-parallel shards of 16 rows: shard k holds rows [16k, 16k + 16) of the 48.
  std::vector<float> sp_out = tok, sp_dwpe = dw0;
  for (int64_t k = 0; k < 3; ++k) {
    ops::position_forward(view(sp_out, 16, C, 16 * k), view(wpe, T, C), T, 16 * k, nullptr,
                          docs.data(), T);
    ops::position_backward(view(sp_dwpe, T, C), view(dout, 16, C, 16 * k), T, 16 * k, nullptr,
                           docs.data(), T);
  }
  EXPECT_TRUE(test::bit_equal(sp_out, out));
  EXPECT_LT(rel_err(sp_dwpe, dwpe), 1e-6);

  // Context parallelism: each sequence's rows at positions 1, 3, …, 23 (12 of the 24).
  const int64_t Tl = 12;
  std::vector<int32_t> pos(Tl);
  for (int t = 0; t < Tl; ++t) pos[size_t(t)] = 2 * t + 1;
  std::vector<float> cp_out(size_t(B * Tl * C)), want;
  for (int b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tl; ++t) {
      const int64_t at = (b * T + pos[size_t(t)]) * C;
      std::copy_n(tok.begin() + at, C, cp_out.begin() + (b * Tl + t) * C);
      want.insert(want.end(), out.begin() + at, out.begin() + at + C);
    }
  }
  ops::position_forward(view(cp_out, B * Tl, C), view(wpe, T, C), Tl, 0, pos.data(), docs.data(),
                        T);
  EXPECT_TRUE(test::bit_equal(cp_out, want));
}

}  // namespace
}  // namespace strata::kernels
