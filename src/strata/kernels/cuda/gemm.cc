// The products of the CUDA backend on cuBLASLt: ops::gemm and the linear layers (backend.h).
// Row-major products map onto cuBLASLt's column-major call as gemm_plan.h derives. Every product
// runs in fp32 (CUBLAS_COMPUTE_32F: no TF32, fp32 accumulation for half operands too, and split-K
// partial sums kept in fp32), on the runtime's compute stream and workspace. A product's plan
// (descriptor, layouts, the heuristic's algorithm) is built on its first call and cached by
// PlanKey, so a step's calls build nothing; with the algorithm and workspace fixed, the same inputs
// give the same bits on the same GPU.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>

#include "strata/core/check.h"
#include "strata/core/dtype.h"
#include "strata/core/tensor.h"
#include "strata/kernels/cuda/backend.h"
#include "strata/kernels/cuda/gemm_plan.h"
#include "strata/kernels/cuda/runtime.h"

namespace strata::ops::cuda {

namespace {

cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::F32:
      return CUDA_R_32F;
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F16:
      return CUDA_R_16F;
    case DType::I32:
      break;
  }
  STRATA_FAIL("gemm: operands are fp32, bf16 or fp16, not ", dtype_name(t));
}

// cuBLASLt's descriptors are host objects: destroying one is a free that cannot fail.
struct DescDestroy {
  void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutDestroy {
  void operator()(cublasLtMatrixLayout_t l) const { cublasLtMatrixLayoutDestroy(l); }
};
struct PreferenceDestroy {
  void operator()(cublasLtMatmulPreference_t p) const { cublasLtMatmulPreferenceDestroy(p); }
};
using Desc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, DescDestroy>;
using Layout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutDestroy>;
using Preference =
    std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PreferenceDestroy>;

// Everything cublasLtMatmul takes but the pointers and the scalars. `a` and `b` are cuBLASLt's
// operands: the memory of the product's B and A (gemm_plan.h's LtProduct); C and D share `d`.
struct Plan {
  Desc desc;
  Layout a, b, d;
  cublasLtMatmulAlgo_t algo{};
};

// One product as its call gives it: C (M, N) (+)= alpha · op(A) · op(B) [+ bias (N) on each row].
struct Product {
  Tensor c, a, b, bias;  // bias empty: no epilogue
  RowMajorProduct shape;
  float alpha = 1.0f;
  bool accumulate = false;
};

Layout layout(DType t, const ColLayout& l) {
  cublasLtMatrixLayout_t h = nullptr;
  STRATA_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&h, lt_type(t), uint64_t(l.rows), uint64_t(l.cols), l.ld));
  return Layout(h);
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}
template <typename T>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& v) {
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
}

std::unique_ptr<Plan> build(const Product& p, uint32_t align_a, uint32_t align_b,
                            uint32_t align_c) {
  const LtProduct lt = lt_product(p.shape);
  auto plan = std::make_unique<Plan>();
  cublasLtMatmulDesc_t desc = nullptr;
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  plan->desc = Desc(desc);
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(lt.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
  set_desc(desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(lt.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
  if (p.bias.data != nullptr) {
    set_desc(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(CUBLASLT_EPILOGUE_BIAS));
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(lt_type(p.bias.dtype)));
    // The heuristic reads the bias pointer's alignment from its value (cublasLt.h).
    set_desc(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(p.bias.data));
  }
  plan->a = layout(p.b.dtype, lt.a);
  plan->b = layout(p.a.dtype, lt.b);
  plan->d = layout(p.c.dtype, lt.d);

  cublasLtMatmulPreference_t pref_h = nullptr;
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_h));
  const Preference pref(pref_h);
  size_t workspace = 0;
  lt_workspace(&workspace);
  set_pref(pref_h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(workspace));
  // Split-K partial sums in fp32 only: the in-place and output-type schemes would add them up in
  // C's dtype, rounding bf16/fp16 results more than once.
  set_pref(pref_h, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
           uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));
  set_pref(pref_h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b);
  set_pref(pref_h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a);
  set_pref(pref_h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c);
  set_pref(pref_h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c);

  cublasLtMatmulHeuristicResult_t found{};
  int count = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(lt_handle(), desc, plan->a.get(), plan->b.get(), plan->d.get(),
                                     plan->d.get(), pref_h, 1, &found, &count);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && count == 0)) {
    const RowMajorProduct& g = p.shape;
    STRATA_FAIL(
        "gemm: cuBLASLt has no algorithm for C (", g.M, ", ", g.N, ") ", dtype_name(p.c.dtype),
        " ldc=", g.ldc, " = op(A) ", dtype_name(p.a.dtype), " trans_a=", g.trans_a, " lda=", g.lda,
        " · op(B) ", dtype_name(p.b.dtype), " trans_b=", g.trans_b, " ldb=", g.ldb, " over K=", g.K,
        ", accumulate=", p.accumulate, ", bias=", p.bias.data != nullptr,
        ", pointers of A, B, C aligned to ", align_a, ", ", align_b, ", ", align_c, " bytes");
  }
  if (s != CUBLAS_STATUS_SUCCESS) {
    fail_cublas(s, "cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__);
  }
  plan->algo = found.algo;
  return plan;
}

// cuBLASLt multiplies two operands of one dtype into C of that dtype or fp32 (with fp32 compute
// and scale types); the CPU backend's other mixes (widening an operand first) have no kernel here.
void check_types(const Product& p) {
  const DType a = p.a.dtype, c = p.c.dtype;
  STRATA_CHECK(p.b.dtype == a && (c == a || c == DType::F32), "gemm: no CUDA product of ",
               dtype_name(a), " and ", dtype_name(p.b.dtype), " operands into a ", dtype_name(c),
               " result; CUDA multiplies operands of one dtype into that dtype or fp32");
}

// C's M rows of N elements, row stride ldc, set to zero: a product over K = 0.
void zero_rows(const Product& p, cudaStream_t stream) {
  const size_t e = dtype_size(p.c.dtype);
  const RowMajorProduct& s = p.shape;
  STRATA_CUDA_CHECK(
      cudaMemset2DAsync(p.c.data, size_t(s.ldc) * e, 0, size_t(s.N) * e, size_t(s.M), stream));
}

void run(const Product& p) {
  const RowMajorProduct& s = p.shape;
  if (s.M == 0 || s.N == 0) return;
  // First: it binds the calling thread to the process's device, which the heuristic below reads
  // (its SM count and architecture) before anything else would bind it.
  const cudaStream_t stream = compute_stream();
  if (s.K == 0) {  // an empty sum: C keeps its values, or is zero
    if (!p.accumulate) zero_rows(p, stream);
    return;
  }
  check_types(p);
  const Epilogue e = p.bias.data != nullptr ? Epilogue::Bias : Epilogue::None;
  const uint32_t align_a = pointer_alignment(uintptr_t(p.a.data));
  const uint32_t align_b = pointer_alignment(uintptr_t(p.b.data));
  const uint32_t align_c = pointer_alignment(uintptr_t(p.c.data));
  const uint32_t align_bias = e == Epilogue::Bias ? pointer_alignment(uintptr_t(p.bias.data)) : 0;
  const PlanKey key = plan_key(s, p.a.dtype, p.b.dtype, p.c.dtype, e, p.accumulate, align_a,
                               align_b, align_c, align_bias);

  // One process computes on one device (runtime.h), so plans are not keyed by it. The lock
  // covers the call as well: the bias pointer is an attribute of the cached descriptor.
  static std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
  static std::mutex mu;
  const std::lock_guard<std::mutex> lock(mu);
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, build(p, align_a, align_b, align_c)).first;
  const Plan& plan = *it->second;
  if (e == Epilogue::Bias) {
    set_desc(plan.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER,
             static_cast<const void*>(p.bias.data));
  }
  size_t workspace_bytes = 0;
  void* workspace = lt_workspace(&workspace_bytes);
  const float beta = p.accumulate ? 1.0f : 0.0f;
  STRATA_CUBLAS_CHECK(cublasLtMatmul(lt_handle(), plan.desc.get(), &p.alpha, p.b.data, plan.a.get(),
                                     p.a.data, plan.b.get(), &beta, p.c.data, plan.d.get(),
                                     p.c.data, plan.d.get(), &plan.algo, workspace, workspace_bytes,
                                     stream));
}

// (M, K, N) of a linear layer from its weight (N, K) and an activation (M, K), as the dispatch
// checked them.
struct LinearSize {
  int64_t M, K, N;
};
LinearSize linear_size(const Tensor& w, const Tensor& x) {
  const int64_t K = w.dim(-1);
  return {x.numel() / K, K, w.numel() / K};
}

}  // namespace

void gemm(Tensor c, Tensor a, Tensor b, const Gemm& g) {
  run({c, a, b, Tensor(), RowMajorProduct{g.M, g.N, g.K, g.trans_a, g.trans_b, g.lda, g.ldb, g.ldc},
       g.alpha, g.accumulate});
}

void linear_forward(Tensor y, Tensor x, Tensor w, Tensor b) {
  const auto [M, K, N] = linear_size(w, x);
  run({y, x, w, b, linear_forward_product(M, K, N)});
}

void linear_backward_input(Tensor dx, Tensor dy, Tensor w, bool accumulate) {
  const auto [M, K, N] = linear_size(w, dx);
  run({dx, dy, w, Tensor(), linear_dx_product(M, K, N), 1.0f, accumulate});
}

void linear_backward_weight(Tensor dw, Tensor db, Tensor dy, Tensor x) {
  if (dw.data != nullptr) {
    const auto [M, K, N] = linear_size(dw, x);
    run({dw, dy, x, Tensor(), linear_dw_product(M, K, N), 1.0f, true});
  }
  if (db.data != nullptr) bias_grad(db, dy);
}

// The same products as the two calls apart, on the same plans: bit for bit their results.
void linear_backward(Tensor dx, Tensor dw, Tensor db, Tensor dy, Tensor x, Tensor w) {
  if (dx.data != nullptr) linear_backward_input(dx, dy, w, false);
  linear_backward_weight(dw, db, dy, x);
}

}  // namespace strata::ops::cuda
