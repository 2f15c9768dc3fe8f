#include "strata/kernels/cpu/pack_gemm.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <type_traits>

#include "strata/core/check.h"
#include "strata/kernels/cpu/common.h"
#include "strata/kernels/cpu/cpu_features.h"
#include "strata/kernels/cpu/vec.h"

namespace strata::kernels {

namespace {

// Depth, rows and columns per block. KC is fixed (never derived from the shape or the thread
// count) so that each element's sum is grouped the same way in every product that computes it.
// KC = 512 and MC = 96 ran fastest on bench-23M's products on 2 threads (bench/gemm_paths); the
// threads' blocks of b (KC x NC/threads each, 6 MiB in all) live in the shared cache, each
// thread's block of a (MC x KC, 192 KiB) in its core's L2.
constexpr int64_t KC = 512, MC = 96, NC = 3072;

// Where a micro-kernel's tile goes. The fp32 sums: t (row stride ldt) = alpha · acc (+ t with
// add). With h, the result is rounded to bf16 into h instead (row stride ldh; + h first with
// h_add), t being read (with add) but not written.
struct Dst {
  float* t = nullptr;
  int64_t ldt = 0;
  bool add = false;
  bf16* h = nullptr;
  int64_t ldh = 0;
  bool h_add = false;
};

// The micro-kernels: the tile (MR,NR) = Σ_k a[k] ⊗ b[k], a packed (kc, MR) and b packed (kc, NR),
// summed in k order in fp32, then stored through Dst: one fused multiply-add with t per element
// whichever tile it is.
// GCC 12's AVX-512 intrinsics start their results from _mm512_undefined_*(), which its
// -Wmaybe-uninitialized reports as a use of an uninitialised value.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
struct Avx512 {
  static constexpr int64_t MR = 12, NR = 32;
  using V = __m512;
  __attribute__((target("avx512f"))) static V widen16(const bf16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // Round to nearest even, NaN kept quiet: store<bf16> of vec.h, 16 lanes at once.
  __attribute__((target("avx512f"))) static void narrow16(bf16* p, V v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
    const __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q)));
  }
  __attribute__((target("avx512f"))) static void kernel(int64_t kc, const float* __restrict a,
                                                        const float* __restrict b, float alpha,
                                                        const Dst& d) {
    V acc[MR][2];
#pragma GCC unroll 12
    for (int64_t i = 0; i < MR; ++i) {
      acc[i][0] = acc[i][1] = _mm512_setzero_ps();
      // The tile's sums are read back at the end: fetched while the products run.
      if (d.add) _mm_prefetch(reinterpret_cast<const char*>(d.t + i * d.ldt), _MM_HINT_T0);
      if (d.add) _mm_prefetch(reinterpret_cast<const char*>(d.t + i * d.ldt + 16), _MM_HINT_T0);
    }
    for (int64_t k = 0; k < kc; ++k) {
      const V b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
#pragma GCC unroll 12
      for (int64_t i = 0; i < MR; ++i) {
        const V ai = _mm512_set1_ps(a[i]);
        acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
      }
      a += MR;
      b += NR;
    }
    const V al = _mm512_set1_ps(alpha);
#pragma GCC unroll 12
    for (int64_t i = 0; i < MR; ++i) {
#pragma GCC unroll 2
      for (int64_t h = 0; h < 2; ++h) {
        float* t = d.t + i * d.ldt + 16 * h;
        V v = d.add ? _mm512_fmadd_ps(al, acc[i][h], _mm512_loadu_ps(t))
                    : _mm512_mul_ps(al, acc[i][h]);
        if (d.h == nullptr) {
          _mm512_storeu_ps(t, v);
          continue;
        }
        bf16* o = d.h + i * d.ldh + 16 * h;
        if (d.h_add) v = _mm512_add_ps(v, widen16(o));
        narrow16(o, v);
      }
    }
  }
};

#pragma GCC diagnostic pop

struct Avx2 {
  static constexpr int64_t MR = 6, NR = 16;
  using V = __m256;
  __attribute__((target("avx2"))) static V widen8(const bf16* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // store<bf16> of vec.h, 8 lanes at once.
  __attribute__((target("avx2"))) static void narrow8(bf16* p, V v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    // |u| > Inf as signed compares: both sides are below 2^31.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i w = _mm256_blendv_epi8(r, q, nan);  // 8 x 32-bit, each below 2^16
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
  __attribute__((target("avx2,fma"))) static void kernel(int64_t kc, const float* __restrict a,
                                                         const float* __restrict b, float alpha,
                                                         const Dst& d) {
    V acc[MR][2];
#pragma GCC unroll 6
    for (int64_t i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < kc; ++k) {
      const V b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
      for (int64_t i = 0; i < MR; ++i) {
        const V ai = _mm256_broadcast_ss(a + i);
        acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
      }
      a += MR;
      b += NR;
    }
    const V al = _mm256_set1_ps(alpha);
#pragma GCC unroll 6
    for (int64_t i = 0; i < MR; ++i) {
#pragma GCC unroll 2
      for (int64_t h = 0; h < 2; ++h) {
        float* t = d.t + i * d.ldt + 8 * h;
        V v = d.add ? _mm256_fmadd_ps(al, acc[i][h], _mm256_loadu_ps(t))
                    : _mm256_mul_ps(al, acc[i][h]);
        if (d.h == nullptr) {
          _mm256_storeu_ps(t, v);
          continue;
        }
        bf16* o = d.h + i * d.ldh + 8 * h;
        if (d.h_add) v = _mm256_add_ps(v, widen8(o));
        narrow8(o, v);
      }
    }
  }
};

// 8 (4) consecutive elements widened to fp32: the transposes' loads.
inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m128 load4(const float* p) {
  return _mm_loadu_ps(p);
}
inline __m128 load4(const bf16* p) {
  const __m128i h = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16));
}

// d[k·P + r] = s[r·rs + k] for r < 8, k < 8: eight rows of eight, transposed in registers.
template <int64_t P, typename S>
void transpose8x8(float* d, const S* s, int64_t rs) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = load8(s + i * rs);
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(d + i * P, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(d + (i + 4) * P, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

// d[k·P + r] = s[r·rs + k] for r < 4, k < 4.
template <int64_t P, typename S>
void transpose4x4(float* d, const S* s, int64_t rs) {
  __m128 r0 = load4(s), r1 = load4(s + rs), r2 = load4(s + 2 * rs), r3 = load4(s + 3 * rs);
  _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
  _mm_storeu_ps(d, r0);
  _mm_storeu_ps(d + P, r1);
  _mm_storeu_ps(d + 2 * P, r2);
  _mm_storeu_ps(d + 3 * P, r3);
}

// dst (ceil(rows/P) panels, kc, P) fp32 = src (rows, kc) widened, element (r, k) at
// src + r·rs + k·ks, rows past `rows` zero. Used for a's rows (P = MR; rs, ks = row and column
// strides) and for b's columns (P = NR; rs, ks = column and row strides). Each panel is the
// transpose of a source whose k run contiguously (a row-major a, a weight read as its transpose):
// done in registers by 8 x 8 (or 4 x 4) blocks, as a copy where the rows run contiguously.
template <int64_t P, typename S>
void pack_panels(float* dst, const S* src, int64_t rs, int64_t ks, int64_t rows, int64_t kc) {
  // fp16 has no exact vector widening here (vec.h's load keeps NaN payloads as they are).
  constexpr bool kVector = !std::is_same_v<S, f16>;
  for (int64_t r0 = 0; r0 < rows; r0 += P) {
    float* d = dst + (r0 / P) * kc * P;  // (kc, P)
    const S* s = src + r0 * rs;
    const int64_t n = std::min(P, rows - r0);
    if (rs == 1) {
      for (int64_t k = 0; k < kc; ++k) {
        const S* sk = s + k * ks;
        float* dk = d + k * P;
        if (n == P) {
#pragma omp simd
          for (int64_t r = 0; r < P; ++r) dk[r] = load(sk[r]);
        } else {
          for (int64_t r = 0; r < P; ++r) dk[r] = r < n ? load(sk[r]) : 0.0f;
        }
      }
      continue;
    }
    int64_t r = 0;
    if constexpr (kVector) {
      const int64_t k8 = kc / 8 * 8, k4 = kc / 4 * 4;
      for (; ks == 1 && r + 8 <= n; r += 8) {
        for (int64_t k = 0; k < k8; k += 8) transpose8x8<P>(d + k * P + r, s + r * rs + k, rs);
        for (int64_t k = k8; k < kc; ++k) {
          for (int64_t i = r; i < r + 8; ++i) d[k * P + i] = load(s[i * rs + k]);
        }
      }
      for (; ks == 1 && r + 4 <= n; r += 4) {
        for (int64_t k = 0; k < k4; k += 4) transpose4x4<P>(d + k * P + r, s + r * rs + k, rs);
        for (int64_t k = k4; k < kc; ++k) {
          for (int64_t i = r; i < r + 4; ++i) d[k * P + i] = load(s[i * rs + k]);
        }
      }
    }
    for (; r < n; ++r) {
      for (int64_t k = 0; k < kc; ++k) d[k * P + r] = load(s[r * rs + k * ks]);
    }
    for (; r < P; ++r) {
      for (int64_t k = 0; k < kc; ++k) d[k * P + r] = 0.0f;
    }
  }
}

template <int64_t P>
void pack(float* dst, const MatOperand& x, int64_t off, int64_t rs, int64_t ks, int64_t rows,
          int64_t kc) {
  switch (x.dtype) {
    case DType::F32:
      return pack_panels<P>(dst, static_cast<const float*>(x.ptr) + off, rs, ks, rows, kc);
    case DType::BF16:
      return pack_panels<P>(dst, static_cast<const bf16*>(x.ptr) + off, rs, ks, rows, kc);
    case DType::F16:
      return pack_panels<P>(dst, static_cast<const f16*>(x.ptr) + off, rs, ks, rows, kc);
    case DType::I32:
      break;
  }
  STRATA_FAIL("pack_gemm operands are fp32, bf16 or fp16, not ", dtype_name(x.dtype));
}

// c (rows, cols) in half precision = tile (rows, cols; row stride NR) + (c with accumulate).
template <typename S, int64_t NR>
void narrow_tile(const MatOut& c, int64_t i0, int64_t j0, const float* tile, int64_t rows,
                 int64_t cols, bool accumulate) {
  for (int64_t r = 0; r < rows; ++r) {
    S* out = static_cast<S*>(c.ptr) + (i0 + r) * c.row_stride + j0;  // (cols)
    const float* in = tile + r * NR;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) out[j] = store<S>(accumulate ? in[j] + load(out[j]) : in[j]);
  }
}

struct Workspace {
  Buffer b;   // each thread's packed block of b (KC, NC / threads)
  Buffer a;   // each thread's packed rows of a (MC, KC)
  Buffer cs;  // half-precision c with K > KC: the fp32 partial sums of a column block (M, nc)
  std::vector<int64_t> cost, sums;  // a grouped product's prefix sums (run_grouped)
};
Workspace& workspace() {
  static Workspace w;
  return w;
}

// One thread's share of a product: rows [m0, m1) of c, every column, the thread's packing
// buffers ap (KC, MC + MR) and bp0 (KC, NCt + NR). csum: where a half-precision c with K > KC
// keeps its fp32 partial sums, (M, min(N, NCt)) from c's first row (else nullptr): a row's sums
// of a column block at the same place whatever the block's width, so that a thread already in
// the last, narrower block never writes where another still sums a wider one.
template <typename Kern>
void rows_of_c(float* ap, float* bp0, const MatOut& c, const MatOperand& a, const MatOperand& b,
               int64_t m0, int64_t m1, int64_t N, int64_t K, int64_t NCt, float alpha,
               bool accumulate, float* csum) {
  constexpr int64_t MR = Kern::MR, NR = Kern::NR;
  const bool half_c = c.dtype != DType::F32;
  float* cf = half_c ? nullptr : static_cast<float*>(c.ptr);
  const int64_t sum_ld = std::min(N, NCt);
  alignas(64) float tile[MR * NR] = {};  // rows and columns past the edge stay finite
  for (int64_t jc = 0; jc < N && m0 < m1; jc += NCt) {
    const int64_t nc = std::min(NCt, N - jc), panels = (nc + NR - 1) / NR;
    for (int64_t pc = 0; pc < K; pc += KC) {
      const int64_t kc = std::min(KC, K - pc);
      const bool last = pc + kc == K;
      for (int64_t p = 0; p < panels; ++p) {
        pack<NR>(bp0 + p * kc * NR, b, pc * b.row_stride + (jc + p * NR) * b.col_stride,
                 b.col_stride, b.row_stride, std::min(NR, nc - p * NR), kc);
      }
      for (int64_t ic = m0; ic < m1; ic += MC) {
        const int64_t mc = std::min(MC, m1 - ic);
        pack<MR>(ap, a, ic * a.row_stride + pc * a.col_stride, a.row_stride, a.col_stride, mc, kc);
        for (int64_t p = 0; p < panels; ++p) {
          const int64_t j0 = jc + p * NR, cols = std::min(NR, nc - p * NR);
          const float* bp = bp0 + p * kc * NR;
          for (int64_t i0 = ic; i0 < ic + mc; i0 += MR) {
            const int64_t rows = std::min(MR, ic + mc - i0);
            const float* aq = ap + (i0 - ic) * kc;
            // Where this block's sums go: c itself (fp32), or the fp32 partial sums of a
            // half-precision c, whose last block is rounded into c.
            float* t = nullptr;
            int64_t ldt = 0;
            bool add = pc > 0;
            if (!half_c) {
              t = cf + i0 * c.row_stride + j0, ldt = c.row_stride, add = add || accumulate;
            } else if (csum != nullptr) {
              t = csum + i0 * sum_ld + (j0 - jc), ldt = sum_ld;
            }
            const bool round = half_c && last;
            if (rows == MR && cols == NR && (!round || c.dtype == DType::BF16)) {
              Dst d{t != nullptr ? t : tile, t != nullptr ? ldt : NR, add};
              if (round) {
                d.h = static_cast<bf16*>(c.ptr) + i0 * c.row_stride + j0;
                d.ldh = c.row_stride, d.h_add = accumulate;
              }
              Kern::kernel(kc, aq, bp, alpha, d);
              continue;
            }
            // A partial tile, or an fp16 c: through the tile, which starts from the sums t
            // holds, so that the arithmetic is that of a whole tile.
            if (add) {
              for (int64_t r = 0; r < rows; ++r) std::copy_n(t + r * ldt, cols, tile + r * NR);
            }
            Kern::kernel(kc, aq, bp, alpha, Dst{tile, NR, add});
            if (!round) {
              for (int64_t r = 0; r < rows; ++r) std::copy_n(tile + r * NR, cols, t + r * ldt);
            } else if (c.dtype == DType::BF16) {
              narrow_tile<bf16, NR>(c, i0, j0, tile, rows, cols, accumulate);
            } else {
              narrow_tile<f16, NR>(c, i0, j0, tile, rows, cols, accumulate);
            }
          }
        }
      }
    }
  }
}

// The threads and the width of each one's blocks of b for a product of `work` multiply-adds.
// Each thread packs its own blocks of b, NCt columns wide: packing b once per thread costs far
// less than the two barriers per block a shared block needs, at each of which every thread waits
// for the slowest (bench-23M's bf16 step on a 2-core AVX2 EPYC: 2.67 s against 2.85 s, medians
// of 7 runs).
struct Threads {
  int threads;
  int64_t NCt;
};
template <typename Kern>
Threads threads_for(int64_t work) {
  const int threads = work >= 64 * kParallelMinWork ? omp_get_max_threads() : 1;
  return {threads, (NC / threads + Kern::NR - 1) / Kern::NR * Kern::NR};
}

template <typename Kern>
void run(const MatOut& c, const MatOperand& a, const MatOperand& b, int64_t M, int64_t N, int64_t K,
         float alpha, bool accumulate) {
  constexpr int64_t MR = Kern::MR, NR = Kern::NR;
  const auto [threads, NCt] = threads_for<Kern>(M * N * K);
  Workspace& w = workspace();
  float* bpack = reserve_floats(w.b, threads * KC * (NCt + NR));
  float* apack = reserve_floats(w.a, threads * KC * (MC + MR));
  const bool half_sums = c.dtype != DType::F32 && K > KC;
  float* csum = half_sums ? reserve_floats(w.cs, M * std::min(N, NCt)) : nullptr;

#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
    // Each thread's rows: a multiple of MR, so that only the last thread's last panel is partial.
    const int64_t per = ((M + nth - 1) / nth + MR - 1) / MR * MR;
    const int64_t m0 = std::min(M, tid * per), m1 = std::min(M, m0 + per);
    rows_of_c<Kern>(apack + tid * KC * (MC + MR), bpack + tid * KC * (NCt + NR), c, a, b, m0, m1, N,
                    K, NCt, alpha, accumulate, csum);
  }
}

// The grouped product: the groups' panels of MR rows in one sequence, each panel costing its
// group's depth, cut into one contiguous run per thread of about equal cost. A thread packs b
// once per group it reaches (the loop of one product per group: once per group and thread), and
// a group of few rows shares a thread with its neighbours instead of splitting in slivers.
template <typename Kern>
void run_grouped(std::span<const MatGroup> groups, int64_t N, float alpha, bool accumulate) {
  constexpr int64_t MR = Kern::MR, NR = Kern::NR;
  const size_t G = groups.size();
  // Prefix sums over the groups: the panels' cost, the rows of half-precision partial sums.
  Workspace& w = workspace();
  std::vector<int64_t>& cost = w.cost;
  std::vector<int64_t>& sums = w.sums;
  cost.assign(G + 1, 0), sums.assign(G + 1, 0);
  int64_t work = 0;
  bool half_sums = false;
  for (size_t g = 0; g < G; ++g) {
    const MatGroup& q = groups[g];
    const bool live = q.M > 0 && q.K > 0;
    cost[g + 1] = cost[g] + (live ? (q.M + MR - 1) / MR * q.K : 0);
    const bool h = live && q.c.dtype != DType::F32 && q.K > KC;
    sums[g + 1] = sums[g] + (h ? q.M : 0);
    half_sums = half_sums || h;
    if (live) work += q.M * N * q.K;
  }
  if (work == 0) return;
  const auto [threads, NCt] = threads_for<Kern>(work);
  float* bpack = reserve_floats(w.b, threads * KC * (NCt + NR));
  float* apack = reserve_floats(w.a, threads * KC * (MC + MR));
  float* csum = half_sums ? reserve_floats(w.cs, sums[G] * std::min(N, NCt)) : nullptr;
  const int64_t total = cost[G];

#pragma omp parallel num_threads(threads)
  {
    const int tid = omp_get_thread_num(), nth = omp_get_num_threads();
    float* ap = apack + tid * KC * (MC + MR);
    float* bp = bpack + tid * KC * (NCt + NR);
    // Panel p of group g starts at cost s = cost[g] + p·K and belongs to the thread t with
    // t·total <= s·nth < (t+1)·total: the first panel at or past a thread's share.
    const auto first_panel = [&](size_t g, int64_t t) {
      const MatGroup& q = groups[g];
      const int64_t panels = (q.M + MR - 1) / MR;
      if (t >= nth) return panels;
      const int64_t need = t * total - cost[g] * nth;  // p·K·nth >= need
      if (need <= 0) return int64_t(0);
      return std::min(panels, (need + q.K * nth - 1) / (q.K * nth));
    };
    for (size_t g = 0; g < G; ++g) {
      const MatGroup& q = groups[g];
      if (q.M <= 0 || q.K <= 0 || cost[g + 1] * nth <= tid * total) continue;
      if (cost[g] * nth >= (tid + 1) * total) break;
      const int64_t m0 = std::min(q.M, first_panel(g, tid) * MR);
      const int64_t m1 = std::min(q.M, first_panel(g, tid + 1) * MR);
      float* gs = q.c.dtype != DType::F32 && q.K > KC ? csum + sums[g] * std::min(N, NCt) : nullptr;
      rows_of_c<Kern>(ap, bp, q.c, q.a, q.b, m0, m1, N, q.K, NCt, alpha, accumulate, gs);
    }
  }
}

}  // namespace

const std::vector<PackKernel>& pack_gemm_kernels() {
  static const std::vector<PackKernel> kernels = [] {
    const CpuFeatures& f = cpu_features();
    std::vector<PackKernel> k;
    if (f.avx512f && f.fma) k.push_back(PackKernel::Avx512);
    if (f.avx2 && f.fma) k.push_back(PackKernel::Avx2);
    return k;
  }();
  return kernels;
}

const char* pack_kernel_name(PackKernel k) {
  return k == PackKernel::Avx512 ? "avx512" : "avx2";
}

void pack_gemm(const MatOut& c, const MatOperand& a, const MatOperand& b, int64_t M, int64_t N,
               int64_t K, float alpha, bool accumulate) {
  const std::vector<PackKernel>& k = pack_gemm_kernels();
  STRATA_CHECK(!k.empty(), "pack_gemm needs AVX-512F or AVX2 with FMA; this CPU has ",
               cpu_features().flags());
  pack_gemm(k.front(), c, a, b, M, N, K, alpha, accumulate);
}

void pack_gemm(PackKernel kernel, const MatOut& c, const MatOperand& a, const MatOperand& b,
               int64_t M, int64_t N, int64_t K, float alpha, bool accumulate) {
  const std::vector<PackKernel>& k = pack_gemm_kernels();
  STRATA_CHECK(std::find(k.begin(), k.end(), kernel) != k.end(), "this CPU (",
               cpu_features().flags(), ") cannot run the ", pack_kernel_name(kernel),
               " micro-kernel");
  if (kernel == PackKernel::Avx512) {
    run<Avx512>(c, a, b, M, N, K, alpha, accumulate);
  } else {
    run<Avx2>(c, a, b, M, N, K, alpha, accumulate);
  }
}

void pack_gemm_grouped(PackKernel kernel, std::span<const MatGroup> groups, int64_t N, float alpha,
                       bool accumulate) {
  const std::vector<PackKernel>& k = pack_gemm_kernels();
  STRATA_CHECK(std::find(k.begin(), k.end(), kernel) != k.end(), "this CPU (",
               cpu_features().flags(), ") cannot run the ", pack_kernel_name(kernel),
               " micro-kernel");
  if (kernel == PackKernel::Avx512) {
    run_grouped<Avx512>(groups, N, alpha, accumulate);
  } else {
    run_grouped<Avx2>(groups, N, alpha, accumulate);
  }
}

}  // namespace strata::kernels
