#include "strata/kernels/cpu/matmul.h"

#include <algorithm>
#include <array>
#include <bit>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "strata/core/check.h"
#include "strata/core/memory.h"
#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/cpu_features.h"
#include "strata/kernels/cpu/elementwise.h"
#include "strata/kernels/cpu/pack_gemm.h"
#include "strata/kernels/cpu/vec.h"

namespace strata::kernels {

namespace {

dnnl::engine& cpu_engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

dnnl::stream& cpu_stream() {
  static dnnl::stream s(cpu_engine());
  return s;
}

dnnl::memory::data_type to_dnnl(DType t) {
  switch (t) {
    case DType::F32:
      return dnnl::memory::data_type::f32;
    case DType::BF16:
      return dnnl::memory::data_type::bf16;
    case DType::F16:
      return dnnl::memory::data_type::f16;
    case DType::I32:
      break;
  }
  STRATA_FAIL("matmul operands are fp32, bf16 or fp16, not ", dtype_name(t));
}

// Everything a primitive depends on; a fixed-size array so a lookup allocates nothing.
struct Key {
  std::array<int64_t, 21> v;
  bool operator<(const Key& o) const { return v < o.v; }
};

struct Plan {
  dnnl::matmul prim;
  dnnl::memory a, b, c;
  std::array<dnnl_exec_arg_t, 3> args;  // built once: the C call allocates nothing per run
};

bool batched(const int64_t batch[2]) {
  return batch[0] != 1 || batch[1] != 1;
}

dnnl::memory::desc operand_md(DType t, int64_t rows, int64_t cols, int64_t rs, int64_t cs,
                              const int64_t batch[2], const int64_t bstride[2]) {
  if (!batched(batch)) return dnnl::memory::desc({rows, cols}, to_dnnl(t), {rs, cs});
  return dnnl::memory::desc({batch[0], batch[1], rows, cols}, to_dnnl(t),
                            {bstride[0], bstride[1], rs, cs});
}

// Builds (or finds) the primitive for this exact shape, layout, dtype and post-op.
Plan& get_plan(const MatOut& c, const MatOperand& a, const MatOperand& b, int64_t M, int64_t N,
               int64_t K, const int64_t batch[2], float alpha, bool accumulate) {
  static std::map<Key, std::unique_ptr<Plan>> cache;
  static std::mutex mu;
  Key key{{M,
           N,
           K,
           batch[0],
           batch[1],
           int64_t(a.dtype),
           a.row_stride,
           a.col_stride,
           a.batch_stride[0],
           a.batch_stride[1],
           int64_t(b.dtype),
           b.row_stride,
           b.col_stride,
           b.batch_stride[0],
           b.batch_stride[1],
           int64_t(c.dtype),
           c.row_stride,
           c.batch_stride[0],
           c.batch_stride[1],
           int64_t(accumulate),
           int64_t(std::bit_cast<uint32_t>(alpha))}};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;

  auto a_md = operand_md(a.dtype, M, K, a.row_stride, a.col_stride, batch, a.batch_stride);
  auto b_md = operand_md(b.dtype, K, N, b.row_stride, b.col_stride, batch, b.batch_stride);
  auto c_md = operand_md(c.dtype, M, N, c.row_stride, 1, batch, c.batch_stride);
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  auto plan = std::make_unique<Plan>();
  try {
    dnnl::matmul::desc desc(a_md, b_md, c_md);
    dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
    plan->prim = dnnl::matmul(pd);
  } catch (const dnnl::error& e) {
    STRATA_FAIL("oneDNN has no matmul for M=", M, " N=", N, " K=", K, " a:", dtype_name(a.dtype),
                " b:", dtype_name(b.dtype), " c:", dtype_name(c.dtype), ": ", e.what());
  }
  plan->a = dnnl::memory(a_md, cpu_engine(), DNNL_MEMORY_NONE);
  plan->b = dnnl::memory(b_md, cpu_engine(), DNNL_MEMORY_NONE);
  plan->c = dnnl::memory(c_md, cpu_engine(), DNNL_MEMORY_NONE);
  plan->args = {dnnl_exec_arg_t{DNNL_ARG_SRC, plan->a.get()},
                dnnl_exec_arg_t{DNNL_ARG_WEIGHTS, plan->b.get()},
                dnnl_exec_arg_t{DNNL_ARG_DST, plan->c.get()}};
  return *cache.emplace(key, std::move(plan)).first->second;
}

void run_native(const MatOut& c, const MatOperand& a, const MatOperand& b, int64_t M, int64_t N,
                int64_t K, const int64_t batch[2], float alpha, bool accumulate) {
  Plan& p = get_plan(c, a, b, M, N, K, batch, alpha, accumulate);
  p.a.set_data_handle(const_cast<void*>(a.ptr));
  p.b.set_data_handle(const_cast<void*>(b.ptr));
  p.c.set_data_handle(c.ptr);
  const dnnl_status_t st =
      dnnl_primitive_execute(p.prim.get(), cpu_stream().get(), int(p.args.size()), p.args.data());
  STRATA_CHECK(st == dnnl_success, "oneDNN matmul failed with status ", int(st));
  cpu_stream().wait();
}

const int64_t kNoBatch[2] = {1, 1};

// Workspace for widening half-precision operands to fp32 where the CPU has no native kernel.
// Grows to the largest shape seen (the first step), then is reused.
struct Widen {
  Buffer a, b, c;
  Buffer dout;       // linear_backward: dout widened once for both of its products
  Buffer inputs[2];  // widen_input's slots
};
Widen& widen_buffers() {
  static Widen w;
  return w;
}

// dst (B0·B1, lines, len) fp32 = src[b0,b1] line l, element j at
// b0·bstride[0] + b1·bstride[1] + l·line_stride + j·elem_stride.
template <typename S>
void widen_lines(float* dst, const S* src, int64_t lines, int64_t len, int64_t line_stride,
                 int64_t elem_stride, const int64_t batch[2], const int64_t bstride[2]) {
  int64_t nb = batch[0] * batch[1];
  const int64_t work = nb * lines * len;
#pragma omp parallel for collapse(2) schedule(static) if (parallel : work >= kParallelMinWork)
  for (int64_t bi = 0; bi < nb; ++bi) {
    for (int64_t l = 0; l < lines; ++l) {
      const S* in = src + (bi / batch[1]) * bstride[0] + (bi % batch[1]) * bstride[1] +
                    l * line_stride;              // (len) with stride elem_stride
      float* out = dst + (bi * lines + l) * len;  // (len)
      if (elem_stride == 1) {  // the common case, kept apart so that it vectorizes
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) out[j] = load(in[j]);
      } else {
        for (int64_t j = 0; j < len; ++j) out[j] = load(in[j * elem_stride]);
      }
    }
  }
}

// Copies a strided (B0,B1,rows,cols) half operand into dense fp32 and describes the copy. An
// operand whose columns are contiguous (a transposed view) stays column-major, so both the
// reads here and oneDNN's reads of the copy run along contiguous memory.
MatOperand widen(float* dst, const MatOperand& x, int64_t rows, int64_t cols,
                 const int64_t batch[2]) {
  bool col_major = x.row_stride == 1 && x.col_stride != 1;
  int64_t lines = col_major ? cols : rows, len = col_major ? rows : cols;
  int64_t line_stride = col_major ? x.col_stride : x.row_stride;
  int64_t elem_stride = col_major ? x.row_stride : x.col_stride;
  if (x.dtype == DType::BF16) {
    widen_lines(dst, static_cast<const bf16*>(x.ptr), lines, len, line_stride, elem_stride, batch,
                x.batch_stride);
  } else {
    STRATA_CHECK(x.dtype == DType::F16, "only half-precision operands are widened");
    widen_lines(dst, static_cast<const f16*>(x.ptr), lines, len, line_stride, elem_stride, batch,
                x.batch_stride);
  }
  MatOperand w{dst, DType::F32, col_major ? 1 : cols, col_major ? rows : 1};
  w.batch_stride[0] = batch[1] * rows * cols;
  w.batch_stride[1] = rows * cols;
  return w;
}

// c[b0,b1] (M,N) in half precision = src (B0·B1, M, N) dense fp32.
template <typename S>
void narrow_out(const MatOut& c, const float* src, int64_t M, int64_t N, const int64_t batch[2]) {
  int64_t nb = batch[0] * batch[1];
#pragma omp parallel for collapse(2) schedule(static) if (parallel : nb * M * N >= kParallelMinWork)
  for (int64_t bi = 0; bi < nb; ++bi) {
    for (int64_t i = 0; i < M; ++i) {
      S* out = static_cast<S*>(c.ptr) + (bi / batch[1]) * c.batch_stride[0] +
               (bi % batch[1]) * c.batch_stride[1] + i * c.row_stride;  // (N)
      const float* in = src + (bi * M + i) * N;                         // (N)
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) out[j] = store<S>(in[j]);
    }
  }
}

// oneDNN runs fp32 everywhere, and two bf16 operands with an fp32 or bf16 result where the CPU
// multiplies bf16 natively (bf16_matmul_path()). Anything else — bf16 without a native dot
// product (oneDNN 2.6 would emulate it several times slower than fp32), fp16 (oneDNN 2.6 has no
// fast fp16 matmul on CPUs), mixed operand types — is widened to fp32 first.
bool runs_native(DType c, DType a, DType b) {
  if (a == DType::F32 && b == DType::F32 && c == DType::F32) return true;
  return a == DType::BF16 && b == DType::BF16 && (c == DType::F32 || c == DType::BF16) &&
         bf16_matmul_path() == Bf16Matmul::Native;
}

// Columns of a half-precision b widened per GEMM call: all of them, unless b dominates the
// product's traffic (K·N ≥ 2·M·(K + N): a weight met by few rows, as in small batches) and its
// widened copy would overflow the caches (2 MiB, this machine class's L2 for two cores); then
// blocks of a multiple of 64 columns (at least 128, for the GEMM's own efficiency) of about
// 1 MiB. With many rows, narrower products cost more than the copy (bench-23M at M = 2048 ran
// 6-10% slower blocked; gpt2-124M at M = 256 5% faster).
int64_t column_block(DType t, int64_t M, int64_t K, int64_t N, int64_t nb) {
  constexpr int64_t kWhole = int64_t(2) << 20, kBlock = int64_t(1) << 20;
  if (t == DType::F32 || nb != 1 || K * N * 4 <= kWhole || K * N < 2 * M * (K + N)) return N;
  const int64_t cols = std::max<int64_t>(128, kBlock / (4 * K) / 64 * 64);
  return cols >= N ? N : cols;
}

// Whether a product that is not native runs on pack_gemm (widening as it packs) rather than
// widening whole operands into the workspace for oneDNN's sgemm. pack_gemm packs b's block once
// per call and amortises it over a's rows; below kPackMinRows rows that packing costs more than
// the workspace copies (bench/gemm_paths at M = 256, gpt2-124M's shapes: 166-201 GFLOP/s against
// 189-202; at M = 512, 170-196 against 137-179).
constexpr int64_t kPackMinRows = 512;
bool packs(int64_t M, int64_t N, int64_t K, int64_t nb) {
  return nb == 1 && M >= kPackMinRows && N > 0 && K > 0 && !pack_gemm_kernels().empty();
}

}  // namespace

bool matmul_widens(DType t, int64_t rows) {
  return t != DType::F32 && !runs_native(t, t, t) && !(rows > 0 && packs(rows, 1, 1, 1));
}

void grouped_matmul(std::span<const MatGroup> groups, int64_t N, float alpha, bool accumulate) {
  if (N <= 0) return;
  const std::vector<PackKernel>& k = pack_gemm_kernels();
  if (!k.empty()) {
    pack_gemm_grouped(k.front(), groups, N, alpha, accumulate);
    return;
  }
  const int64_t batch[2] = {1, 1};
  for (const MatGroup& g : groups) {
    if (g.M > 0 && g.K > 0) matmul(g.c, g.a, g.b, g.M, N, g.K, batch, alpha, accumulate);
  }
}

const float* widen_input(int slot, const void* src, DType t, int64_t rows, int64_t cols) {
  STRATA_CHECK(slot == 0 || slot == 1, "widen_input: slot ", slot, " is not 0 or 1");
  float* dst = reserve_floats(widen_buffers().inputs[slot], rows * cols);
  widen(dst, {src, t, cols, 1}, rows, cols, kNoBatch);
  return dst;
}

void matmul(MatOut c, MatOperand a, MatOperand b, int64_t M, int64_t N, int64_t K,
            const int64_t batch[2], float alpha, bool accumulate) {
  if (runs_native(c.dtype, a.dtype, b.dtype)) {
    run_native(c, a, b, M, N, K, batch, alpha, accumulate);
    return;
  }
  int64_t nb = batch[0] * batch[1];
  if (packs(M, N, K, nb)) {
    pack_gemm(c, a, b, M, N, K, alpha, accumulate);
    return;
  }
  Widen& w = widen_buffers();
  MatOperand wa = a, wb = b;
  if (a.dtype != DType::F32) wa = widen(reserve_floats(w.a, nb * M * K), a, M, K, batch);
  const int64_t nc = column_block(b.dtype, M, K, N, nb);
  if (nc < N) {
    // b (a weight, typically) by blocks of columns, each widened while the GEMM that reads it
    // finds it in cache: one read of b in half precision instead of a widened copy written
    // out and read back.
    const size_t e = dtype_size(b.dtype), ec = dtype_size(c.dtype);
    for (int64_t n0 = 0; n0 < N; n0 += nc) {
      const int64_t n1 = std::min(N, n0 + nc);
      MatOperand bb = b;
      bb.ptr = static_cast<const char*>(b.ptr) + size_t(n0 * b.col_stride) * e;
      MatOut cc = c;
      cc.ptr = static_cast<char*>(c.ptr) + size_t(n0) * ec;
      matmul(cc, wa, bb, M, n1 - n0, K, batch, alpha, accumulate);
    }
    return;
  }
  if (b.dtype != DType::F32) wb = widen(reserve_floats(w.b, nb * K * N), b, K, N, batch);
  if (c.dtype == DType::F32) {
    run_native(c, wa, wb, M, N, K, batch, alpha, accumulate);
    return;
  }
  float* d = reserve_floats(w.c, nb * M * N);
  MatOut wc{d, DType::F32, N, {batch[1] * M * N, M * N}};
  if (accumulate) {
    MatOperand cur{c.ptr, c.dtype, c.row_stride, 1, {c.batch_stride[0], c.batch_stride[1]}};
    widen(d, cur, M, N, batch);
  }
  run_native(wc, wa, wb, M, N, K, batch, alpha, accumulate);
  if (c.dtype == DType::BF16) {
    narrow_out<bf16>(c, d, M, N, batch);
  } else {
    narrow_out<f16>(c, d, M, N, batch);
  }
}

template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t M, int64_t K,
                    int64_t N) {
  constexpr DType t = dtype_of<T>();
  matmul({out, t, N}, {inp, t, K, 1}, {weight, t, 1, K}, M, N, K, kNoBatch);
  if (bias != nullptr) add_bias(out, bias, M, N);
}

namespace {

// dout (M,N) as the two products of the linear backward (rows M and N) read it: where half
// operands would be widened into the workspace by each product, widened once here instead (not
// where both products widen it as they pack). Every form of the backward (fused or split) reads
// it through this, so they run the same products on the same operands.
template <typename T>
MatOperand linear_dout(const T* dout, int64_t M, int64_t K, int64_t N) {
  constexpr DType t = dtype_of<T>();
  MatOperand dy{dout, t, N, 1};
  if (t != DType::F32 && !runs_native(t, t, t) && !(packs(M, K, N, 1) && packs(N, K, M, 1))) {
    dy = widen(reserve_floats(widen_buffers().dout, M * N), dy, M, N, kNoBatch);
  }
  return dy;
}

// dinp (M,K) (+)= dy (M,N) · weight (N,K).
template <typename T>
void linear_dinp(T* dinp, const MatOperand& dy, const T* weight, int64_t M, int64_t K, int64_t N,
                 bool accumulate) {
  constexpr DType t = dtype_of<T>();
  matmul({dinp, t, K}, dy, {weight, t, K, 1}, M, K, N, kNoBatch, 1.0f, accumulate);
}

// dweight (N,K) += dyᵀ · inp.
template <typename T, typename G>
void linear_dweight(G* dweight, const MatOperand& dy, const T* inp, int64_t M, int64_t K,
                    int64_t N) {
  MatOperand dyt = dy;  // (N, M): the transposed view of the same memory
  std::swap(dyt.row_stride, dyt.col_stride);
  matmul({dweight, dtype_of<G>(), K}, dyt, {inp, dtype_of<T>(), K, 1}, N, K, M, kNoBatch, 1.0f,
         true);
}

// dbias (N) += Σ_m dout (M,N). Column blocks, each summed over all rows in row order: rows are
// read contiguously and the result does not depend on the thread count.
template <typename T, typename G>
void linear_dbias(G* dbias, const T* dout, int64_t M, int64_t N) {
  constexpr int64_t kCols = 64;
  const int64_t blocks = (N + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (parallel : M * N >= kParallelMinWork)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t n0 = blk * kCols, w = std::min(kCols, N - n0);
    float acc[kCols] = {};
    for (int64_t m = 0; m < M; ++m) {
      const T* row = dout + m * N + n0;
#pragma omp simd
      for (int64_t j = 0; j < w; ++j) acc[j] += to_f32(row[j]);
    }
    for (int64_t j = 0; j < w; ++j) dbias[n0 + j] = from_f32<G>(to_f32(dbias[n0 + j]) + acc[j]);
  }
}

}  // namespace

template <typename T, typename G>
void linear_backward(T* dinp, G* dweight, G* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t M, int64_t K, int64_t N) {
  const MatOperand dy = linear_dout(dout, M, K, N);
  if (dinp != nullptr) linear_dinp(dinp, dy, weight, M, K, N, false);
  linear_dweight(dweight, dy, inp, M, K, N);
  if (dbias != nullptr) linear_dbias(dbias, dout, M, N);
}

template <typename T>
void linear_backward_input(T* dinp, const T* dout, const T* weight, int64_t M, int64_t K, int64_t N,
                           bool accumulate) {
  linear_dinp(dinp, linear_dout(dout, M, K, N), weight, M, K, N, accumulate);
}

template <typename T, typename G>
void linear_backward_weight(G* dweight, G* dbias, const T* dout, const T* inp, int64_t M, int64_t K,
                            int64_t N) {
  if (dweight != nullptr) linear_dweight(dweight, linear_dout(dout, M, K, N), inp, M, K, N);
  if (dbias != nullptr) linear_dbias(dbias, dout, M, N);
}

#define INSTANTIATE_S(T)                                                                        \
  template void linear_forward<T>(T*, const T*, const T*, const T*, int64_t, int64_t, int64_t); \
  template void linear_backward_input<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, bool);
#define INSTANTIATE_SG(T, G)                                                                      \
  template void linear_backward<T, G>(T*, G*, G*, const T*, const T*, const T*, int64_t, int64_t, \
                                      int64_t);                                                   \
  template void linear_backward_weight<T, G>(G*, G*, const T*, const T*, int64_t, int64_t, int64_t);
STRATA_FOR_EACH_S(INSTANTIATE_S)
STRATA_FOR_EACH_SG(INSTANTIATE_SG)

}  // namespace strata::kernels
