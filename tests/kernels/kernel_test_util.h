// Helpers shared by the kernel tests: fixed random inputs, dtype round trips, error measures and
// central finite differences.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string_view>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/core/rng.h"
#include "strata/core/tensor.h"

namespace strata::test {

// A host vector as a CPU tensor of the given shape; token ids as a 1-D int32 tensor.
template <typename T>
Tensor view(std::vector<T>& v, std::initializer_list<int64_t> dims) {
  return Tensor(v.data(), dtype_of<T>(), dims);
}
// (B, T) document starts (ops::AttentionShape::doc_begin) of B sequences of T whose documents
// start at starts[b] (each list from 0, ascending).
inline std::vector<int32_t> doc_begin(int T, const std::vector<std::vector<int>>& starts) {
  std::vector<int32_t> d;
  for (const std::vector<int>& s : starts) {
    for (size_t i = 0; i < s.size(); ++i) {
      d.insert(d.end(), size_t((i + 1 < s.size() ? s[i + 1] : T) - s[i]), s[i]);
    }
  }
  return d;
}

inline Tensor tokens(std::vector<int32_t>& v) {
  return Tensor(v.data(), DType::I32, {int64_t(v.size())});
}

inline double as_double(double v) {
  return v;
}
inline double as_double(float v) {
  return v;
}
inline double as_double(bf16 v) {
  return to_f32(v);
}
inline double as_double(f16 v) {
  return to_f32(v);
}

// n normal samples, mean 0, standard deviation `std`, from a stream named `name`.
inline std::vector<float> randn(size_t n, std::string_view name, float std = 1.0f) {
  std::vector<float> v(n);
  rng_fill_normal(v.data(), rng_key(1234, name), 0, n, 0.0f, std);
  return v;
}

// n integers uniform in [0, hi).
inline std::vector<int32_t> randint(size_t n, std::string_view name, int hi) {
  std::vector<int32_t> v(n);
  uint64_t key = rng_key(1234, name);
  for (size_t i = 0; i < n; ++i) v[i] = std::min(hi - 1, int(rng_uniform(key, i) * float(hi)));
  return v;
}

template <typename S>
std::vector<S> to_dtype(const std::vector<float>& v) {
  std::vector<S> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = from_f32<S>(v[i]);
  return out;
}

template <typename S>
std::vector<float> to_float(const std::vector<S>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = to_f32(v[i]);
  return out;
}

// v rounded to S and back: the values a kernel of type S actually sees.
template <typename S>
std::vector<float> rounded(const std::vector<float>& v) {
  return to_float(to_dtype<S>(v));
}

// Σ w·out in double: the scalar whose gradient the backward kernels compute.
template <typename S>
double weighted_sum(const std::vector<float>& w, const S* out, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += double(w[i]) * double(to_f32(out[i]));
  return s;
}

// max_i |a_i − ref_i| / max_i |ref_i|: error relative to the scale of the reference.
template <typename A, typename R>
double rel_err(const std::vector<A>& a, const std::vector<R>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size() && i < ref.size(); ++i) {
    num = std::max(num, std::fabs(as_double(a[i]) - double(ref[i])));
    den = std::max(den, std::fabs(double(ref[i])));
  }
  return num / std::max(den, 1e-30);
}

// Central differences of loss() with respect to x[i] for every i in `indices` (all of x when
// empty). x is perturbed in place and restored.
inline std::vector<double> numeric_grad(std::vector<float>& x, const std::function<double()>& loss,
                                        float eps, const std::vector<size_t>& indices = {}) {
  std::vector<size_t> idx = indices;
  if (idx.empty()) {
    idx.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) idx[i] = i;
  }
  std::vector<double> g(idx.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    float saved = x[idx[k]];
    x[idx[k]] = saved + eps;
    double lp = loss();
    x[idx[k]] = saved - eps;
    double lm = loss();
    x[idx[k]] = saved;
    g[k] = (lp - lm) / (2.0 * double(eps));
  }
  return g;
}

// The entries of v at `indices`.
template <typename V>
std::vector<double> gather(const std::vector<V>& v, const std::vector<size_t>& indices) {
  std::vector<double> out(indices.size());
  for (size_t k = 0; k < indices.size(); ++k) out[k] = as_double(v[indices[k]]);
  return out;
}

// `count` distinct-ish indices spread over [0, n), fixed.
inline std::vector<size_t> sample_indices(size_t n, size_t count, std::string_view name) {
  if (count >= n) {
    std::vector<size_t> all(n);
    for (size_t i = 0; i < n; ++i) all[i] = i;
    return all;
  }
  std::vector<size_t> idx(count);
  uint64_t key = rng_key(99, name);
  for (size_t k = 0; k < count; ++k) idx[k] = std::min(n - 1, size_t(rng_uniform(key, k) * n));
  return idx;
}

// s·v in double.
template <typename V>
std::vector<double> scaled(const std::vector<V>& v, double s) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = s * as_double(v[i]);
  return out;
}

template <typename V>
bool bit_equal(const std::vector<V>& a, const std::vector<V>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(V)) == 0;
}

}  // namespace strata::test
