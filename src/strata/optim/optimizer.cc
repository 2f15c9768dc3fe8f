#include "strata/optim/optimizer.h"

#include <type_traits>

#include "strata/core/check.h"
#include "strata/kernels/cpu/optimizer.h"

namespace strata {

Optimizer::Optimizer(const OptimizerConfig& c, DType param_dtype, DType grad_dtype, void* params,
                     int64_t numel, std::vector<ParamRange> ranges, int64_t state_numel,
                     Packed packed)
    : cfg_(c),
      param_dtype_(param_dtype),
      grad_dtype_(grad_dtype),
      params_(params),
      numel_(numel),
      state_numel_(state_numel < 0 ? numel : state_numel),
      partitioned_(state_numel >= 0),
      packed_(packed),
      ranges_(std::move(ranges)) {
  STRATA_CHECK(partitioned_ || (!packed.params && !packed.grads),
               "packed parameters or gradients need a partitioned optimizer state");
  for (ParamRange& r : ranges_) {
    STRATA_CHECK(r.offset >= 0 && r.numel >= 0 && r.offset + r.numel <= numel_,
                 "a parameter range lies outside the flat buffer");
    if (!partitioned_) {
      STRATA_CHECK(r.state_offset < 0, "an unpartitioned optimizer takes no state offsets");
      r.state_offset = r.offset;
    }
    STRATA_CHECK(r.state_offset >= 0 && r.state_offset + r.numel <= state_numel_,
                 "a parameter range lies outside the optimizer state");
  }
  const size_t bytes = size_t(state_numel_) * sizeof(float);
  if (param_dtype == DType::F32) {
    // fp32 training: the parameters are the master copy (partitioned too: each range's master
    // is its own elements of the parameters, full or packed).
    master_ = static_cast<float*>(params);
  } else {
    master_buf_ = Buffer(MemCategory::MasterParams, bytes);
    master_ = master_buf_.as<float>();
  }
  const bool sgd = cfg_.type == "sgd";
  if (!sgd || cfg_.momentum != 0.0f) m_ = Buffer(MemCategory::OptimizerState, bytes);
  if (!sgd) v_ = Buffer(MemCategory::OptimizerState, bytes);
}

int64_t Optimizer::param_offset(const ParamRange& r) const {
  return packed_.params ? r.state_offset : r.offset;
}

float* Optimizer::master_of(const ParamRange& r) {
  return param_dtype_ == DType::F32 ? master_ + param_offset(r) : master_ + r.state_offset;
}

void Optimizer::publish() {
  if (param_dtype_ == DType::F32) return;  // the master is the parameters
  if (!partitioned_) {
    convert(params_, param_dtype_, master_, DType::F32, size_t(numel_));
    return;
  }
  char* p = static_cast<char*>(params_);
  const size_t ps = dtype_size(param_dtype_);
  for (const ParamRange& r : ranges_) {
    convert(p + size_t(param_offset(r)) * ps, param_dtype_, master_ + r.state_offset, DType::F32,
            size_t(r.numel));
  }
}

namespace {

template <typename T, typename G>
void step_range(const OptimizerConfig& c, float* master, T* param, const G* grad, float* m,
                float* v, const ParamRange& r, Packed packed, float lr, float grad_scale,
                int64_t step) {
  const int64_t so = r.state_offset;
  const float wd = r.decay ? c.weight_decay : 0.0f;
  T* p = param + (packed.params ? so : r.offset);
  const G* g = grad + (packed.grads ? so : r.offset);
  // fp32 parameters are their own master copy: the kernels update them in place.
  float* mst = master + so;
  if constexpr (std::is_same_v<T, float>) mst = p;
  if (c.type == "sgd") {
    kernels::sgd_step(mst, p, g, m ? m + so : nullptr, size_t(r.numel), lr, c.momentum, wd,
                      c.nesterov, grad_scale, step);
  } else {
    const bool adamw = c.type == "adamw" || c.adam_w_mode;
    kernels::adam_step(mst, p, g, m + so, v + so, size_t(r.numel), lr, c.beta1, c.beta2, c.eps, wd,
                       grad_scale, step, adamw);
  }
}

template <typename T, typename G>
void step_all(const OptimizerConfig& c, float* master, void* params, const void* grads, float* m,
              float* v, const std::vector<ParamRange>& ranges, Packed packed, float lr,
              float grad_scale, int64_t step) {
  for (const ParamRange& r : ranges) {
    step_range(c, master, static_cast<T*>(params), static_cast<const G*>(grads), m, v, r, packed,
               lr, grad_scale, step);
  }
}

}  // namespace

void Optimizer::step(const void* grads, float lr, float grad_scale) {
  ++step_;
  float* m = m_.as<float>();
  float* v = v_.as<float>();
  using P = DType;
  const P pt = param_dtype_, gt = grad_dtype_;
  if (pt == P::F32 && gt == P::F32) {
    step_all<float, float>(cfg_, master_, params_, grads, m, v, ranges_, packed_, lr, grad_scale,
                           step_);
  } else if (pt == P::BF16 && gt == P::F32) {
    step_all<bf16, float>(cfg_, master_, params_, grads, m, v, ranges_, packed_, lr, grad_scale,
                          step_);
  } else if (pt == P::BF16 && gt == P::BF16) {
    step_all<bf16, bf16>(cfg_, master_, params_, grads, m, v, ranges_, packed_, lr, grad_scale,
                         step_);
  } else if (pt == P::F16 && gt == P::F32) {
    step_all<f16, float>(cfg_, master_, params_, grads, m, v, ranges_, packed_, lr, grad_scale,
                         step_);
  } else if (pt == P::F16 && gt == P::F16) {
    step_all<f16, f16>(cfg_, master_, params_, grads, m, v, ranges_, packed_, lr, grad_scale,
                       step_);
  } else {
    STRATA_FAIL("no optimizer kernel for parameters ", dtype_name(pt), " and gradients ",
                dtype_name(gt));
  }
}

}  // namespace strata
