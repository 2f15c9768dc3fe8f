// ops.h: a mixture of experts' routing, dispatch, combine and grouped linear layers (the
// dispatch: dispatch.h; the CUDA kernels: kernels/cuda/moe.cu). The grouped layers are one
// grouped product on the CPU (kernels::grouped_matmul), a gemm per group on a GPU.
#include <vector>

#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/matmul.h"
#include "strata/kernels/cpu/moe.h"
#include "strata/kernels/dispatch.h"
#include "strata/kernels/ops.h"

namespace strata::ops {

using namespace dispatch;

namespace {

void expect_i32(const char* op, const char* name, const Tensor& t) {
  STRATA_CHECK(t.dtype == DType::I32, op, ": ", name, " must be int32, got ", dtype_name(t.dtype));
}

// Rows [row, row + rows) of a (_, width) view.
Tensor rows_view(const Tensor& t, int64_t row, int64_t rows, int64_t width) {
  return Tensor(static_cast<char*>(t.data) + size_t(row * width) * dtype_size(t.dtype), t.dtype,
                {rows, width}, t.device);
}

}  // namespace

void moe_route_forward(Tensor probs, Tensor lse, Tensor top, Tensor gates, Tensor logits,
                       const MoeRoute& r, Tensor bias) {
  constexpr const char* op = "moe_route_forward";
  const Call access = on_device(op, {probs, lse, top, gates, logits, bias});
  if (access.dry) return;
  STRATA_CHECK(r.top_k >= 1 && r.top_k <= r.experts, op, ": top_k ", r.top_k, " of ", r.experts,
               " experts");
  const int64_t N = rows_of(op, "logits", logits, r.experts);
  for (const Tensor* t : {&probs, &lse, &gates, &logits}) expect_f32(op, "a router view", *t);
  expect_i32(op, "top", top);
  expect_numel(op, "probs", probs, N * r.experts);
  expect_numel(op, "lse", lse, N);
  expect_numel(op, "top", top, N * r.top_k);
  expect_numel(op, "gates", gates, N * r.top_k);
  if (bias.data != nullptr) {
    STRATA_CHECK(r.sigmoid, op, ": an expert bias is the sigmoid router's");
    expect_f32(op, "bias", bias);
    expect_numel(op, "bias", bias, r.experts);
  }
  if (r.sigmoid) {
    STRATA_CHECK(r.groups >= 1 && r.experts % r.groups == 0 && r.experts / r.groups >= 2 &&
                     r.topk_groups >= 1 && r.topk_groups <= r.groups &&
                     r.top_k <= r.topk_groups * (r.experts / r.groups),
                 op, ": ", r.groups, " groups of ", r.experts, " experts, top ", r.topk_groups,
                 " groups, top_k ", r.top_k);
  }
  STRATA_ON_CUDA(access, moe_route_forward(probs, lse, top, gates, logits, r, bias));
  if (r.sigmoid) {
    return kernels::moe_route_sigmoid_forward(
        p<float>(probs), p<float>(lse), p<int32_t>(top), p<float>(gates), p<const float>(logits),
        bias.data != nullptr ? p<const float>(bias) : nullptr, N, r.experts, r.top_k,
        r.norm_topk_prob, r.groups, r.topk_groups, r.scale);
  }
  kernels::moe_route_forward(p<float>(probs), p<float>(lse), p<int32_t>(top), p<float>(gates),
                             p<const float>(logits), N, r.experts, r.top_k, r.norm_topk_prob);
}

void moe_plan(Tensor counts, Tensor pos, Tensor rows, Tensor top, Tensor probs, int experts,
              const MoeCapacity& capacity) {
  constexpr const char* op = "moe_plan";
  const Call access = on_device(op, {counts, pos, rows, top, probs});
  if (access.dry) return;
  for (const Tensor* t : {&counts, &pos, &rows, &top}) expect_i32(op, "a plan view", *t);
  expect_numel(op, "counts", counts, experts);
  expect_numel(op, "pos", pos, top.numel());
  expect_numel(op, "rows", rows, top.numel());
  const int64_t k = top.ndim == 2 ? top.dim(1) : 1;
  const int64_t N = rows_of(op, "top", top, k);
  expect_f32(op, "probs", probs);
  expect_numel(op, "probs", probs, N * experts);
  STRATA_CHECK(capacity.capacity == 0 || (capacity.group > 0 && probs.data != nullptr), op,
               ": a capacity needs its group of rows and the probabilities");
  STRATA_ON_CUDA(access, moe_plan(counts, pos, rows, top, probs, experts, capacity));
  const int32_t* t = p<const int32_t>(top);
  for (int64_t i = 0; i < N * k; ++i) {
    STRATA_CHECK(t[i] >= 0 && t[i] < experts, op, ": expert ", t[i], " of ", experts);
  }
  kernels::moe_plan(p<int32_t>(counts), p<int32_t>(pos), p<int32_t>(rows), t, p<const float>(probs),
                    N, experts, int(k), capacity.capacity, capacity.group, capacity.by_probs);
}

void moe_balance_stats(Tensor stats, Tensor probs, Tensor top, int64_t T, bool normalized) {
  constexpr const char* op = "moe_balance_stats";
  const Call access = on_device(op, {stats, probs, top});
  if (access.dry) return;
  const int64_t E = last_dim(op, "probs", probs), N = rows_of(op, "probs", probs, E);
  const int64_t k = top.numel() / N;
  STRATA_CHECK(T > 0 && N % T == 0 && top.numel() == N * k, op, ": ", N,
               " rows are not whole sequences of ", T);
  expect_f32(op, "stats", stats);
  expect_f32(op, "probs", probs);
  expect_i32(op, "top", top);
  expect_numel(op, "stats", stats, N / T * 2 * E);
  STRATA_ON_CUDA(access, moe_balance_stats(stats, probs, top, T, normalized));
  kernels::moe_balance_stats(p<float>(stats), p<const float>(probs), p<const int32_t>(top), N,
                             int(E), int(k), T, normalized);
}

void moe_route_backward(Tensor dlogits, Tensor dgates, Tensor probs, Tensor lse, Tensor top,
                        Tensor gates, Tensor coef, int64_t T, float z, const MoeRoute& r) {
  constexpr const char* op = "moe_route_backward";
  const Call access = on_device(op, {dlogits, dgates, probs, lse, top, gates, coef});
  if (access.dry) return;
  const int64_t N = rows_of(op, "probs", probs, r.experts);
  for (const Tensor* t : {&dlogits, &dgates, &probs, &lse, &gates, &coef}) {
    expect_f32(op, "a router view", *t);
  }
  expect_i32(op, "top", top);
  expect_numel(op, "dlogits", dlogits, N * r.experts);
  expect_numel(op, "dgates", dgates, N * r.top_k);
  expect_numel(op, "top", top, N * r.top_k);
  STRATA_CHECK(T > 0 && N % T == 0, op, ": ", N, " rows are not whole sequences of ", T);
  expect_numel(op, "coef", coef, N / T * r.experts);
  STRATA_CHECK(!r.sigmoid || z == 0.0f, op, ": the sigmoid router takes no z-loss gradient");
  STRATA_ON_CUDA(access,
                 moe_route_backward(dlogits, dgates, probs, lse, top, gates, coef, T, z, r));
  if (r.sigmoid) {
    return kernels::moe_route_sigmoid_backward(
        p<float>(dlogits), p<const float>(dgates), p<const float>(probs), p<const int32_t>(top),
        p<const float>(coef), N, r.experts, r.top_k, r.norm_topk_prob, r.scale, T);
  }
  kernels::moe_route_backward(p<float>(dlogits), p<const float>(dgates), p<const float>(probs),
                              p<const float>(lse), p<const int32_t>(top), p<const float>(gates),
                              p<const float>(coef), N, r.experts, r.top_k, r.norm_topk_prob, T, z);
}

void gather_rows(Tensor out, Tensor x, Tensor rows) {
  constexpr const char* op = "gather_rows";
  const Call access = on_device(op, {out, x, rows});
  if (access.dry) return;
  same_dtype(op, {out, x});
  expect_i32(op, "rows", rows);
  const int64_t C = last_dim(op, "x", x), N = rows_of(op, "x", x, C), R = rows.numel();
  expect_numel(op, "out", out, R * C);
  STRATA_ON_CUDA(access, gather_rows(out, x, rows));
  const int32_t* r = p<const int32_t>(rows);
  for (int64_t i = 0; i < R; ++i) {
    STRATA_CHECK(r[i] >= 0 && r[i] < N, op, ": row ", r[i], " of ", N);
  }
  with_s(op, x.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::gather_rows(p<S>(out), p<const S>(x), r, R, C);
  });
}

namespace {

// (N, k, C, R) of a combine: out (N, C), y (R, C) of any rows the positions index, pos (N, k).
struct Combine {
  int64_t N, k, C, R;  // R: y's rows
};
Combine combine_size(const char* op, const Call& access, const Tensor& out, const Tensor& y,
                     const Tensor& pos, const Tensor& w) {
  const int64_t C = last_dim(op, "out", out), N = rows_of(op, "out", out, C);
  const int64_t k = pos.numel() / N;
  STRATA_CHECK(k >= 1 && pos.numel() == N * k, op, ": pos ", pos.shape_str(), " for ", N, " rows");
  expect_i32(op, "pos", pos);
  STRATA_CHECK(y.numel() % C == 0, op, ": y ", y.shape_str(), " is not rows of ", C);
  const int64_t R = y.numel() / C;
  expect_f32(op, "w", w);
  expect_numel(op, "w", w, N * k);
  if (access.cuda) return {N, k, C, R};  // the positions are the device's
  const int32_t* at = p<const int32_t>(pos);
  for (int64_t i = 0; i < N * k; ++i) {
    STRATA_CHECK(at[i] >= -1 && at[i] < R, op, ": position ", at[i], " of ", R, " rows of y");
  }
  return {N, k, C, R};
}

}  // namespace

void moe_combine(Tensor out, Tensor y, Tensor pos, Tensor w) {
  constexpr const char* op = "moe_combine";
  const Call access = on_device(op, {out, y, pos, w});
  if (access.dry) return;
  same_dtype(op, {out, y});
  const auto [N, k, C, R] = combine_size(op, access, out, y, pos, w);
  STRATA_ON_CUDA(access, moe_combine(out, y, pos, w));
  with_s(op, y.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::moe_combine(p<S>(out), p<const S>(y), p<const int32_t>(pos), p<const float>(w), N,
                         int(k), C);
  });
}

void moe_combine_backward(Tensor dy, Tensor dw, Tensor dout, Tensor y, Tensor pos, Tensor w) {
  constexpr const char* op = "moe_combine_backward";
  const Call access = on_device(op, {dy, dw, dout, y, pos, w});
  if (access.dry) return;
  same_dtype(op, {dy, dout, y});
  STRATA_CHECK(w.data != nullptr && dw.data != nullptr, op, ": needs the weights and dw");
  const auto [N, k, C, R] = combine_size(op, access, dout, y, pos, w);
  expect_numel(op, "dy", dy, R * C);
  expect_f32(op, "dw", dw);
  expect_numel(op, "dw", dw, N * k);
  STRATA_ON_CUDA(access, moe_combine_backward(dy, dw, dout, y, pos, w));
  with_s(op, y.dtype, [&](auto s) {
    using S = decltype(s);
    kernels::moe_combine_backward(p<S>(dy), p<float>(dw), p<const S>(dout), p<const S>(y),
                                  p<const int32_t>(pos), p<const float>(w), N, int(k), C);
  });
}

void moe_gate_forward(Tensor out, Tensor s, Tensor g) {
  constexpr const char* op = "moe_gate_forward";
  const Call access = on_device(op, {out, s, g});
  if (access.dry) return;
  same_dtype(op, {out, s});
  expect_f32(op, "g", g);
  const int64_t C = last_dim(op, "s", s), N = rows_of(op, "s", s, C);
  expect_numel(op, "out", out, N * C);
  expect_numel(op, "g", g, N);
  STRATA_ON_CUDA(access, moe_gate_forward(out, s, g));
  with_s(op, s.dtype, [&](auto v) {
    using S = decltype(v);
    kernels::moe_gate_forward(p<S>(out), p<const S>(s), p<float>(g), N, C);
  });
}

void moe_gate_backward(Tensor ds, Tensor dg, Tensor dout, Tensor s, Tensor g) {
  constexpr const char* op = "moe_gate_backward";
  const Call access = on_device(op, {ds, dg, dout, s, g});
  if (access.dry) return;
  same_dtype(op, {ds, dout, s});
  expect_f32(op, "g", g);
  expect_f32(op, "dg", dg);
  const int64_t C = last_dim(op, "s", s), N = rows_of(op, "s", s, C);
  for (const Tensor* t : {&ds, &dout}) expect_numel(op, "a row view", *t, N * C);
  expect_numel(op, "g", g, N);
  expect_numel(op, "dg", dg, N);
  STRATA_ON_CUDA(access, moe_gate_backward(ds, dg, dout, s, g));
  with_s(op, s.dtype, [&](auto v) {
    using S = decltype(v);
    kernels::moe_gate_backward(p<S>(ds), p<float>(dg), p<const S>(dout), p<const S>(s),
                               p<const float>(g), N, C);
  });
}

namespace {

// The groups' rows: counts (host) summing to `rows`.
void check_groups(const char* op, const int64_t* counts, int groups, int64_t rows) {
  int64_t sum = 0;
  for (int g = 0; g < groups; ++g) {
    STRATA_CHECK(counts[g] >= 0, op, ": group ", g, " has ", counts[g], " rows");
    sum += counts[g];
  }
  STRATA_CHECK(sum == rows, op, ": the groups hold ", sum, " rows, the views ", rows);
}

}  // namespace

namespace {

// A grouped layer's sizes: K inputs and N outputs a row (w: groups·N rows of K), R rows in all
// (x: R rows of K), the groups' counts checked against R.
struct Grouped {
  int64_t K, N, R;
};
Grouped grouped_size(const char* op, const Tensor& w, const Tensor& x, const int64_t* counts,
                     int groups) {
  const int64_t K = last_dim(op, "weight", w), N = rows_of(op, "weight", w, K) / groups;
  const int64_t R = rows_of(op, "rows", x, K);
  check_groups(op, counts, groups, R);
  return {K, N, R};
}

// f(group, its first row, its rows) for each group that has rows.
template <typename F>
void for_each_group(const int64_t* counts, int groups, F&& f) {
  for (int64_t e = 0, r = 0; e < groups; r += counts[e++]) {
    if (counts[e] > 0) f(e, r, counts[e]);
  }
}

// Element offset of row `row` of a (_, width) view.
template <typename T>
T* at_row(const Tensor& t, int64_t row, int64_t width) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data) +
                              size_t(row * width) * dtype_size(t.dtype));
}

// One grouped product, inside the call `on`: on a GPU cuda(e, r, m) runs a gemm per group with
// rows (group e, first row r, m rows); on the CPU the groups' products go in one call
// (kernels::grouped_matmul), product(e, r, m) giving group e's MatGroup.
template <typename Cuda, typename Cpu>
void grouped(const Call& on, const int64_t* counts, int groups, int64_t N, float alpha,
             bool accumulate, Cuda&& cuda, Cpu&& product) {
  if (on.cuda) {
    for_each_group(counts, groups, cuda);
    return;
  }
  static thread_local std::vector<kernels::MatGroup> batch;  // kept: a step allocates nothing
  batch.clear();
  for_each_group(counts, groups,
                 [&](int64_t e, int64_t r, int64_t m) { batch.push_back(product(e, r, m)); });
  kernels::grouped_matmul(batch, N, alpha, accumulate);
}

}  // namespace

void grouped_linear_forward(Tensor y, Tensor x, Tensor w, const int64_t* counts, int groups) {
  constexpr const char* op = "grouped_linear_forward";
  const Call access = on_device(op, {y, x, w});
  if (access.dry) return;
  const auto [K, N, R] = grouped_size(op, w, x, counts, groups);
  expect_numel(op, "y", y, R * N);
  Gemm g;
  g.N = N, g.K = K, g.trans_b = true, g.lda = K, g.ldb = K, g.ldc = N;
  grouped(
      access, counts, groups, N, 1.0f, false,
      [&](int64_t e, int64_t r, int64_t m) {
        g.M = m;
        gemm(rows_view(y, r, m, N), rows_view(x, r, m, K), rows_view(w, e * N, N, K), g);
      },
      [&](int64_t e, int64_t r, int64_t m) {
        return kernels::MatGroup{{at_row<void>(y, r, N), y.dtype, N},
                                 {at_row<const void>(x, r, K), x.dtype, K, 1},
                                 {at_row<const void>(w, e * N, K), w.dtype, 1, K},
                                 m,
                                 K};
      });
}

void grouped_linear_backward_input(Tensor dx, Tensor dy, Tensor w, const int64_t* counts,
                                   int groups) {
  constexpr const char* op = "grouped_linear_backward_input";
  const Call access = on_device(op, {dx, dy, w});
  if (access.dry) return;
  const auto [K, N, R] = grouped_size(op, w, dx, counts, groups);
  expect_numel(op, "dy", dy, R * N);
  Gemm g;
  g.N = K, g.K = N, g.lda = N, g.ldb = K, g.ldc = K;
  grouped(
      access, counts, groups, K, 1.0f, false,
      [&](int64_t e, int64_t r, int64_t m) {
        g.M = m;
        gemm(rows_view(dx, r, m, K), rows_view(dy, r, m, N), rows_view(w, e * N, N, K), g);
      },
      [&](int64_t e, int64_t r, int64_t m) {
        return kernels::MatGroup{{at_row<void>(dx, r, K), dx.dtype, K},
                                 {at_row<const void>(dy, r, N), dy.dtype, N, 1},
                                 {at_row<const void>(w, e * N, K), w.dtype, K, 1},
                                 m,
                                 N};
      });
}

void grouped_linear_backward_weight(Tensor dw, Tensor dy, Tensor x, const int64_t* counts,
                                    int groups) {
  constexpr const char* op = "grouped_linear_backward_weight";
  const Call access = on_device(op, {dw, dy, x});
  if (access.dry) return;
  const auto [K, N, R] = grouped_size(op, dw, x, counts, groups);
  expect_numel(op, "dy", dy, R * N);
  Gemm g;
  g.M = N, g.N = K, g.trans_a = true, g.lda = N, g.ldb = K, g.ldc = K, g.accumulate = true;
  grouped(
      access, counts, groups, K, 1.0f, true,
      [&](int64_t e, int64_t r, int64_t m) {
        g.K = m;
        gemm(rows_view(dw, e * N, N, K), rows_view(dy, r, m, N), rows_view(x, r, m, K), g);
      },
      [&](int64_t e, int64_t r, int64_t m) {
        return kernels::MatGroup{{at_row<void>(dw, e * N, K), dw.dtype, K},
                                 {at_row<const void>(dy, r, N), dy.dtype, 1, N},
                                 {at_row<const void>(x, r, K), x.dtype, K, 1},
                                 N,
                                 m};
      });
}

}  // namespace strata::ops
