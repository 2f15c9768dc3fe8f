#include "strata/core/tensor.h"

namespace strata {

Tensor Tensor::slice0(int64_t begin, int64_t end) const {
  STRATA_CHECK(ndim > 0 && 0 <= begin && begin <= end && end <= shape[0], "slice [", begin, ", ",
               end, ") out of range for shape ", shape_str());
  Tensor t = *this;
  int64_t inner = numel() / shape[0];
  t.data = static_cast<char*>(data) + size_t(begin * inner) * dtype_size(dtype);
  t.shape[0] = end - begin;
  return t;
}

std::string Tensor::shape_str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace strata
