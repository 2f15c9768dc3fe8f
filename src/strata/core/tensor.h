// A typed, non-owning view: pointer, dtype, shape (row-major, contiguous), device.
// Module boundaries pass Tensors; kernels take raw pointers and sizes.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "strata/core/check.h"
#include "strata/core/device.h"
#include "strata/core/dtype.h"

namespace strata {

struct Tensor {
  static constexpr int kMaxDims = 4;

  void* data = nullptr;
  DType dtype = DType::F32;
  Device device = Device::CPU;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};

  Tensor() = default;
  Tensor(void* data, DType dtype, std::initializer_list<int64_t> dims,
         Device device = default_device())
      : data(data), dtype(dtype), device(device), ndim(int(dims.size())) {
    STRATA_CHECK(dims.size() <= kMaxDims, "tensors have at most ", kMaxDims, " dimensions");
    int i = 0;
    for (int64_t d : dims) shape[i++] = d;
  }

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }

  template <typename T>
  T* ptr() const {
    STRATA_CHECK(dtype_of<T>() == dtype, "tensor holds ", dtype_name(dtype), ", accessed as ",
                 dtype_name(dtype_of<T>()));
    return static_cast<T*>(data);
  }
  // Elements [begin, end) of the outermost dimension, as a tensor of the same rank.
  Tensor slice0(int64_t begin, int64_t end) const;
  std::string shape_str() const;  // "[2, 16, 32]"
};

}  // namespace strata
