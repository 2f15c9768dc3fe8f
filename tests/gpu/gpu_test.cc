// gpu_test.h: device selection, tensors uploaded from host vectors and read back through the
// kernel interface (the only way host code reaches device memory), and the comparison.
#include "tests/gpu/gpu_test.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>

#include "strata/core/check.h"
#include "strata/core/rng.h"

namespace strata::gpu_test {

bool gpu_available() {
  // Once per process, before the first device allocation (ops::init_device).
  static const bool available = [] {
    if (ops::device_count(Device::CUDA) == 0) return false;
    ops::init_device(Device::CUDA, 0);
    return true;
  }();
  return available;
}

namespace {

// A tensor of dims on device holding the `count` elements of dtype at host address src; without
// elements, an empty view (as a scratch that a backend does not need).
std::unique_ptr<Held> upload(Device device, DType dtype, std::initializer_list<int64_t> dims,
                             const void* src, size_t count) {
  auto h = std::make_unique<Held>();
  h->t = Tensor(nullptr, dtype, dims, device);
  STRATA_CHECK(size_t(h->t.numel()) == count, "make: ", count, " values for a tensor of shape ",
               h->t.shape_str());
  if (count == 0) return h;
  h->buf = Buffer(MemCategory::Activations, h->t.nbytes(), device);
  h->t.data = h->buf.data();
  ops::copy_from_host(h->t, src);
  return h;
}

}  // namespace

std::unique_ptr<Held> make(Device device, DType dtype, std::initializer_list<int64_t> dims,
                           const std::vector<float>& values) {
  if (dtype == DType::I32) {
    std::vector<int32_t> ints(values.size());
    std::transform(values.begin(), values.end(), ints.begin(), [](float v) { return int32_t(v); });
    return upload(device, dtype, dims, ints.data(), ints.size());
  }
  std::vector<uint8_t> host(values.size() * dtype_size(dtype));
  convert(host.data(), dtype, values.data(), DType::F32, values.size());
  return upload(device, dtype, dims, host.data(), values.size());
}

std::unique_ptr<Held> make_tokens(Device device, std::initializer_list<int64_t> dims,
                                  const std::vector<int32_t>& values) {
  return upload(device, DType::I32, dims, values.data(), values.size());
}

std::vector<float> values(const Tensor& t) {
  std::vector<uint8_t> host(t.nbytes());
  ops::copy_to_host(host.data(), t);
  std::vector<float> out(size_t(t.numel()));
  convert(out.data(), DType::F32, host.data(), t.dtype, out.size());
  return out;
}

std::vector<float> random(size_t n, uint64_t seed, float scale) {
  const uint64_t key = rng_key(seed, "gpu_test");
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * (2.0f * rng_uniform(key, i) - 1.0f);
  return v;
}

::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want,
                                 double tol) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << got.size() << " values, expected " << want.size();
  }
  size_t bad = 0, first = 0, worst = 0;
  double worst_err = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (g == w) continue;  // equal infinities too; a NaN never matches
    const double err = std::fabs(g - w) / std::max(std::fabs(w), 1.0);
    if (err <= tol) continue;
    if (bad++ == 0) first = i;
    if (std::isnan(err) || err > worst_err) {
      worst = i;
      worst_err = std::isnan(err) ? INFINITY : err;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << std::setprecision(9) << bad << " of " << got.size() << " values off by more than "
         << tol << " relative to max(|want|, 1); first at index " << first << ": got " << got[first]
         << ", want " << want[first] << "; worst at index " << worst << ": got " << got[worst]
         << ", want " << want[worst];
}

double tolerance(DType t) {
  switch (t) {
    case DType::F32:
      return 1e-5;
    case DType::BF16:
    case DType::F16:
      return 1e-2;
    case DType::I32:
      break;
  }
  STRATA_FAIL("tolerance: int32 results are compared exactly");
}

::testing::AssertionResult identical(const std::vector<float>& got,
                                     const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << got.size() << " values, expected " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure()
             << "index " << i << ": got " << got[i] << ", want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

std::string sg_name(const ::testing::TestParamInfo<SG>& p) {
  return std::string(dtype_name(p.param.s)) + "_" + dtype_name(p.param.g) + "_grads";
}

}  // namespace strata::gpu_test
