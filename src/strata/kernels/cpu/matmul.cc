#include "strata/kernels/cpu/matmul.h"

#include <bit>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "strata/core/check.h"
#include "strata/core/memory.h"

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
  }
  return dnnl::memory::data_type::undef;
}

struct Key {
  std::vector<int64_t> v;
  bool operator<(const Key& o) const { return v < o.v; }
};

struct Plan {
  dnnl::matmul prim;
  dnnl::memory a, b, c;
};

bool batched(const int64_t batch[2]) { return batch[0] != 1 || batch[1] != 1; }

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
  Key key{{M, N, K, batch[0], batch[1], int64_t(a.dtype), a.row_stride, a.col_stride,
           a.batch_stride[0], a.batch_stride[1], int64_t(b.dtype), b.row_stride, b.col_stride,
           b.batch_stride[0], b.batch_stride[1], int64_t(c.dtype), c.row_stride,
           c.batch_stride[0], c.batch_stride[1], int64_t(accumulate),
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
  return *cache.emplace(key, std::move(plan)).first->second;
}

void run_native(const MatOut& c, const MatOperand& a, const MatOperand& b, int64_t M, int64_t N,
                int64_t K, const int64_t batch[2], float alpha, bool accumulate) {
  Plan& p = get_plan(c, a, b, M, N, K, batch, alpha, accumulate);
  p.a.set_data_handle(const_cast<void*>(a.ptr));
  p.b.set_data_handle(const_cast<void*>(b.ptr));
  p.c.set_data_handle(c.ptr);
  p.prim.execute(cpu_stream(),
                 {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}});
  cpu_stream().wait();
}

// Workspace for widening half-precision operands to fp32 where the CPU has no bf16 matmul.
// Grows to the largest shape seen (the first step), then is reused.
struct Widen {
  Buffer a, b, c;
};
Widen& widen_buffers() {
  static Widen w;
  return w;
}
float* reserve(Buffer& buf, size_t elems) {
  if (buf.bytes() < elems * sizeof(float)) buf = Buffer(MemCategory::Workspace, elems * 4);
  return buf.as<float>();
}

// Copies a strided [B0,B1,rows,cols] operand into dense fp32 (row-major, batch-major).
void widen(float* dst, const void* src, DType t, int64_t rows, int64_t cols, int64_t rs,
           int64_t cs, const int64_t batch[2], const int64_t bstride[2]) {
  int64_t nb = batch[0] * batch[1];
  size_t es = dtype_size(t);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bi = 0; bi < nb; ++bi) {
    for (int64_t i = 0; i < rows; ++i) {
      int64_t b0 = bi / batch[1], b1 = bi % batch[1];
      const char* row = static_cast<const char*>(src) +
                        size_t(b0 * bstride[0] + b1 * bstride[1] + i * rs) * es;
      float* out = dst + (bi * rows + i) * cols;
      if (cs == 1) {
        convert(out, DType::F32, row, t, size_t(cols));
      } else {
        for (int64_t j = 0; j < cols; ++j) convert(out + j, DType::F32, row + j * cs * es, t, 1);
      }
    }
  }
}

}  // namespace

bool native_bf16_matmul() {
  static const bool ok = [] {
    try {
      dnnl::memory::desc md({16, 16}, dnnl::memory::data_type::bf16, {16, 1});
      dnnl::memory::desc od({16, 16}, dnnl::memory::data_type::f32, {16, 1});
      dnnl::matmul::desc desc(md, md, od);
      dnnl::matmul::primitive_desc pd(desc, cpu_engine());
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return ok;
}

void matmul(MatOut c, MatOperand a, MatOperand b, int64_t M, int64_t N, int64_t K,
            const int64_t batch[2], float alpha, bool accumulate) {
  bool half = a.dtype != DType::F32 || b.dtype != DType::F32 || c.dtype != DType::F32;
  if (!half || native_bf16_matmul()) {
    run_native(c, a, b, M, N, K, batch, alpha, accumulate);
    return;
  }
  int64_t nb = batch[0] * batch[1];
  Widen& w = widen_buffers();
  MatOperand wa = a, wb = b;
  if (a.dtype != DType::F32) {
    float* d = reserve(w.a, size_t(nb * M * K));
    widen(d, a.ptr, a.dtype, M, K, a.row_stride, a.col_stride, batch, a.batch_stride);
    wa = MatOperand{d, DType::F32, K, 1, {batch[1] * M * K, M * K}};
  }
  if (b.dtype != DType::F32) {
    float* d = reserve(w.b, size_t(nb * K * N));
    widen(d, b.ptr, b.dtype, K, N, b.row_stride, b.col_stride, batch, b.batch_stride);
    wb = MatOperand{d, DType::F32, N, 1, {batch[1] * K * N, K * N}};
  }
  if (c.dtype == DType::F32) {
    run_native(c, wa, wb, M, N, K, batch, alpha, accumulate);
    return;
  }
  float* d = reserve(w.c, size_t(nb * M * N));
  MatOut wc{d, DType::F32, N, {batch[1] * M * N, M * N}};
  if (accumulate) widen(d, c.ptr, c.dtype, M, N, c.row_stride, 1, batch, c.batch_stride);
  run_native(wc, wa, wb, M, N, K, batch, alpha, accumulate);
  size_t es = dtype_size(c.dtype);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bi = 0; bi < nb; ++bi) {
    for (int64_t i = 0; i < M; ++i) {
      int64_t b0 = bi / batch[1], b1 = bi % batch[1];
      char* row = static_cast<char*>(c.ptr) +
                  size_t(b0 * c.batch_stride[0] + b1 * c.batch_stride[1] + i * c.row_stride) * es;
      convert(row, c.dtype, d + (bi * M + i) * N, DType::F32, size_t(N));
    }
  }
}

namespace {
const int64_t kNoBatch[2] = {1, 1};
}

template <typename T>
void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t M, int64_t K,
                    int64_t N) {
  constexpr DType t = dtype_of<T>();
  matmul({out, t, N}, {inp, t, K, 1}, {weight, t, 1, K}, M, N, K, kNoBatch);
  if (bias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < M; ++m) {
      T* o = out + m * N;
      for (int64_t n = 0; n < N; ++n) o[n] = from_f32<T>(to_f32(o[n]) + to_f32(bias[n]));
    }
  }
}

template <typename T, typename G>
void linear_backward(T* dinp, G* dweight, G* dbias, const T* dout, const T* inp, const T* weight,
                     int64_t M, int64_t K, int64_t N) {
  constexpr DType t = dtype_of<T>();
  if (dinp != nullptr) matmul({dinp, t, K}, {dout, t, N, 1}, {weight, t, K, 1}, M, K, N, kNoBatch);
  matmul({dweight, dtype_of<G>(), K}, {dout, t, 1, N}, {inp, t, K, 1}, N, K, M, kNoBatch, 1.0f,
         true);
  if (dbias != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      float s = 0.0f;
      for (int64_t m = 0; m < M; ++m) s += to_f32(dout[m * N + n]);
      dbias[n] = from_f32<G>(to_f32(dbias[n]) + s);
    }
  }
}

template void linear_forward<float>(float*, const float*, const float*, const float*, int64_t,
                                    int64_t, int64_t);
template void linear_forward<bf16>(bf16*, const bf16*, const bf16*, const bf16*, int64_t, int64_t,
                                   int64_t);
template void linear_forward<f16>(f16*, const f16*, const f16*, const f16*, int64_t, int64_t,
                                  int64_t);
template void linear_backward<float, float>(float*, float*, float*, const float*, const float*,
                                            const float*, int64_t, int64_t, int64_t);
template void linear_backward<bf16, float>(bf16*, float*, float*, const bf16*, const bf16*,
                                           const bf16*, int64_t, int64_t, int64_t);
template void linear_backward<bf16, bf16>(bf16*, bf16*, bf16*, const bf16*, const bf16*,
                                          const bf16*, int64_t, int64_t, int64_t);
template void linear_backward<f16, float>(f16*, float*, float*, const f16*, const f16*,
                                          const f16*, int64_t, int64_t, int64_t);
template void linear_backward<f16, f16>(f16*, f16*, f16*, const f16*, const f16*, const f16*,
                                        int64_t, int64_t, int64_t);

}  // namespace strata::kernels
