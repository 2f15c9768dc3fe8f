#include "strata/comm/wire_reduce.h"

#include <mutex>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

#include "strata/comm/mpi_runtime.h"
#include "strata/core/check.h"

namespace strata::comm::detail {

namespace {

void sum_bf16(uint16_t* inout, const uint16_t* in, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    inout[i] = f32_to_bf16(bf16_to_f32(bf16{inout[i]}) + bf16_to_f32(bf16{in[i]})).bits;
  }
}

void sum_f16(uint16_t* inout, const uint16_t* in, size_t n) {
  size_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
  // F16C converts with round-to-nearest-even, exactly as f32_to_f16 does.
  for (; i + 8 <= n; i += 8) {
    __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(inout + i)));
    __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(inout + i),
                     _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < n; ++i) inout[i] = f32_to_f16(f16_to_f32(f16{inout[i]}) + f16_to_f32(f16{in[i]})).bits;
}

void mpi_sum_bf16(void* in, void* inout, int* len, MPI_Datatype*) {
  sum_bf16(static_cast<uint16_t*>(inout), static_cast<const uint16_t*>(in), size_t(*len));
}
void mpi_sum_f16(void* in, void* inout, int* len, MPI_Datatype*) {
  sum_f16(static_cast<uint16_t*>(inout), static_cast<const uint16_t*>(in), size_t(*len));
}

struct WireOps {
  std::mutex mu;
  bool created = false;
  MPI_Datatype bf16_type = MPI_DATATYPE_NULL, f16_type = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum = MPI_OP_NULL, f16_sum = MPI_OP_NULL;
};

WireOps& wire_ops() {
  static WireOps ops;
  return ops;
}

}  // namespace

void sum_into(void* inout, const void* in, size_t n, DType t) {
  switch (t) {
    case DType::F32: {
      float* o = static_cast<float*>(inout);
      const float* a = static_cast<const float*>(in);
      for (size_t i = 0; i < n; ++i) o[i] += a[i];
      return;
    }
    case DType::BF16:
      return sum_bf16(static_cast<uint16_t*>(inout), static_cast<const uint16_t*>(in), n);
    case DType::F16:
      return sum_f16(static_cast<uint16_t*>(inout), static_cast<const uint16_t*>(in), n);
    case DType::I32: {
      int32_t* o = static_cast<int32_t*>(inout);
      const int32_t* a = static_cast<const int32_t*>(in);
      for (size_t i = 0; i < n; ++i) o[i] += a[i];
      return;
    }
  }
}

void create_wire_ops() {
  WireOps& w = wire_ops();
  std::lock_guard<std::mutex> lock(w.mu);
  if (w.created) return;
  STRATA_MPI_CHECK(MPI_Type_contiguous(1, MPI_UINT16_T, &w.bf16_type));
  STRATA_MPI_CHECK(MPI_Type_commit(&w.bf16_type));
  STRATA_MPI_CHECK(MPI_Type_contiguous(1, MPI_UINT16_T, &w.f16_type));
  STRATA_MPI_CHECK(MPI_Type_commit(&w.f16_type));
  STRATA_MPI_CHECK(MPI_Op_create(&mpi_sum_bf16, 1, &w.bf16_sum));
  STRATA_MPI_CHECK(MPI_Op_create(&mpi_sum_f16, 1, &w.f16_sum));
  w.created = true;
}

void free_wire_ops() {
  WireOps& w = wire_ops();
  std::lock_guard<std::mutex> lock(w.mu);
  if (!w.created) return;
  MPI_Op_free(&w.bf16_sum);
  MPI_Op_free(&w.f16_sum);
  MPI_Type_free(&w.bf16_type);
  MPI_Type_free(&w.f16_type);
  w.created = false;
}

MPI_Datatype mpi_datatype(DType t) {
  switch (t) {
    case DType::BF16:
      return wire_ops().bf16_type;
    case DType::F16:
      return wire_ops().f16_type;
    case DType::I32:
      return MPI_INT32_T;
    default:
      return MPI_FLOAT;
  }
}

MPI_Op mpi_sum(DType t) {
  switch (t) {
    case DType::BF16:
      return wire_ops().bf16_sum;
    case DType::F16:
      return wire_ops().f16_sum;
    default:
      return MPI_SUM;
  }
}

}  // namespace strata::comm::detail
