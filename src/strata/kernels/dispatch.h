// The dispatch of ops.h, shared by its source files (ops*.cc): every call checks that its views
// share one device, derives the sizes from the views' shapes, checks that they agree, and calls
// the CUDA backend for views on a GPU (kernels/cuda/backend.h) or the kernels/cpu template for
// the views' dtypes.
// Internal to kernels/.
#pragma once

#include <algorithm>
#include <climits>
#include <cstring>
#include <initializer_list>

#include "strata/core/device_memory.h"
#include "strata/kernels/ops.h"
#if STRATA_HAVE_CUDA
#include "strata/kernels/cuda/backend.h"
#endif

namespace strata::ops::dispatch {

inline thread_local int dry_runs = 0;  // DryRun scopes alive on this thread

// A call of the interface: on a dry run (DryRun) it touches nothing; otherwise it holds the device
// open for its duration (the guarded CPU device; a no-op elsewhere). `cuda`: the views are on a
// GPU, and the call goes to kernels/cuda after the checks (STRATA_ON_CUDA).
struct Call {
  Call(bool dry_run, bool on_cuda) : dry(dry_run), cuda(on_cuda), access(!dry_run && !on_cuda) {}
  const bool dry;
  const bool cuda;
  device_memory::Access access;
};

// The non-empty views of a call live on one device, and that device has a backend. The call runs
// inside the returned scope: on the guarded test device, the only time host code may touch device
// memory (core/device_memory.h).
[[nodiscard]] inline Call on_device(const char* op, std::initializer_list<Tensor> views) {
  const Tensor* first = nullptr;
  for (const Tensor& t : views) {
    if (t.data == nullptr) continue;
    if (first == nullptr) first = &t;
    STRATA_CHECK(t.device == first->device, op, ": all views of one call must be on one device");
  }
  const bool cuda = first != nullptr && first->device == Device::CUDA;
#if !STRATA_HAVE_CUDA
  if (cuda) {
    STRATA_FAIL(op,
                ": this strata is built without the CUDA backend (nvcc was not found, or "
                "-DSTRATA_CUDA=OFF)");
  }
#endif
  return Call(dry_runs > 0, cuda);
}

// After a call's checks: its CUDA views go to the backend (kernels/cuda/backend.h) and the call
// returns; CPU views fall through to the CPU kernels.
#if STRATA_HAVE_CUDA
#define STRATA_ON_CUDA(call, ...) \
  if ((call).cuda) return ::strata::ops::cuda::__VA_ARGS__
#else
#define STRATA_ON_CUDA(call, ...) static_cast<void>(call)
#endif

// f(S{}) for the storage type S that dtype t names.
template <typename F>
inline decltype(auto) with_s(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::F32:
      return f(float{});
    case DType::BF16:
      return f(bf16{});
    case DType::F16:
      return f(f16{});
    case DType::I32:
      break;
  }
  STRATA_FAIL(op, ": no kernel for ", dtype_name(t), " values");
}

// f(S{}, G{}) for a (storage, gradient) pair the kernels are built for (STRATA_FOR_EACH_SG).
template <typename F>
inline decltype(auto) with_sg(const char* op, DType s, DType g, F&& f) {
#define STRATA_SG_CASE(S, G) \
  if (s == dtype_of<S>() && g == dtype_of<G>()) return f(S{}, G{});
  STRATA_FOR_EACH_SG(STRATA_SG_CASE)
#undef STRATA_SG_CASE
  STRATA_FAIL(op, ": no kernel for ", dtype_name(s), " values with ", dtype_name(g), " gradients");
}

// The view's elements as T (null for an empty view).
template <typename T>
inline T* p(const Tensor& t) {
  return static_cast<T*>(t.data);
}

inline const int32_t* tokens_of(const char* op, const Tensor& t) {
  STRATA_CHECK(t.dtype == DType::I32, op, ": token views are int32, got ", dtype_name(t.dtype));
  return static_cast<const int32_t*>(t.data);
}

inline void same_dtype(const char* op, std::initializer_list<Tensor> views) {
  const Tensor* first = nullptr;
  for (const Tensor& t : views) {
    if (t.data == nullptr) continue;
    if (first == nullptr) first = &t;
    STRATA_CHECK(t.dtype == first->dtype, op, ": views mix ", dtype_name(first->dtype), " and ",
                 dtype_name(t.dtype));
  }
}

inline void expect_f32(const char* op, const char* name, const Tensor& t) {
  STRATA_CHECK(t.data == nullptr || t.dtype == DType::F32, op, ": ", name, " must be fp32, got ",
               dtype_name(t.dtype));
}

// An absent view passes; a present one holds exactly n elements.
inline void expect_numel(const char* op, const char* name, const Tensor& t, int64_t n) {
  STRATA_CHECK(t.data == nullptr || t.numel() == n, op, ": ", name, " has ", t.numel(),
               " elements ", t.shape_str(), ", expected ", n);
}

// The last dimension of t, and numel / it, the number of rows.
inline int64_t last_dim(const char* op, const char* name, const Tensor& t) {
  STRATA_CHECK(t.ndim >= 1 && t.dim(-1) > 0, op, ": ", name, " needs a last dimension, got ",
               t.shape_str());
  return t.dim(-1);
}
inline int64_t rows_of(const char* op, const char* name, const Tensor& t, int64_t width) {
  STRATA_CHECK(width > 0 && t.numel() % width == 0, op, ": ", name, " ", t.shape_str(),
               " is not a whole number of rows of ", width);
  return t.numel() / width;
}

// N rows of C elements, as the CPU kernels take them.
struct Rows {
  int N, C;
};

// The CPU kernels take int sizes where a dimension is bounded by a model size.
inline int as_int(const char* op, int64_t v) {
  STRATA_CHECK(v >= 0 && v <= INT_MAX, op, ": size ", v, " exceeds the kernels' int range");
  return int(v);
}

// Document masking's starts (AttentionShape::doc_begin) of B sequences of seq positions, read
// on the host (a CPU call's): each at or before its own position and not before its
// predecessor's, as a packed sequence's documents are.
inline void check_doc_begin(const char* op, const int32_t* doc_begin, int64_t B, int64_t seq) {
  if (doc_begin == nullptr) return;
  STRATA_CHECK(seq > 0, op, ": documents need the whole sequence's length (seq), got ", seq);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* d = doc_begin + b * seq;  // (seq)
    for (int64_t p = 0; p < seq; ++p) {
      STRATA_CHECK(d[p] >= 0 && d[p] <= p && (p == 0 || d[p] >= d[p - 1]), op, ": sequence ", b,
                   "'s document at position ", p, " starts at ", d[p],
                   "; a document starts at or before each of its positions, and the starts do not "
                   "decrease along a sequence");
    }
  }
}

// The same for an attention call whose T rows of each sequence are at positions pos (nullptr:
// 0..T-1), which must lie inside the sequence of s.seq.
inline void check_documents(const char* op, const AttentionShape& s, const int32_t* pos) {
  if (s.doc_begin == nullptr) return;
  check_doc_begin(op, s.doc_begin, s.B, s.seq);
  const int64_t last = pos != nullptr ? *std::max_element(pos, pos + s.T) : s.T - 1;
  STRATA_CHECK(last < s.seq, op, ": documents over sequences of ", s.seq,
               " positions, but a row is at position ", last);
}

}  // namespace strata::ops::dispatch
