#include "strata/optim/optimizer.h"

#include "strata/core/check.h"
#include "strata/kernels/ops.h"

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

float* Optimizer::moment_of(int k, const ParamRange& r) {
  const Buffer& b = k == 0 ? m_ : v_;
  return b.data() == nullptr ? nullptr : b.as<float>() + r.state_offset;
}

void Optimizer::publish() {
  if (param_dtype_ == DType::F32) return;  // the master is the parameters
  if (!partitioned_) {
    ops::copy(Tensor(params_, param_dtype_, {numel_}), Tensor(master_, DType::F32, {numel_}));
    return;
  }
  char* p = static_cast<char*>(params_);
  const size_t ps = dtype_size(param_dtype_);
  for (const ParamRange& r : ranges_) {
    ops::copy(Tensor(p + size_t(param_offset(r)) * ps, param_dtype_, {r.numel}),
              Tensor(master_ + r.state_offset, DType::F32, {r.numel}));
  }
}

void Optimizer::step(const void* grads, float lr, float grad_scale) {
  ++step_;
  const bool sgd = cfg_.type == "sgd";
  ops::AdamArgs adam;
  adam.lr = lr, adam.beta1 = cfg_.beta1, adam.beta2 = cfg_.beta2, adam.eps = cfg_.eps;
  adam.grad_scale = grad_scale, adam.step = step_;
  adam.adamw = cfg_.type == "adamw" || cfg_.adam_w_mode;
  ops::SgdArgs plain;
  plain.lr = lr, plain.momentum = cfg_.momentum, plain.nesterov = cfg_.nesterov;
  plain.grad_scale = grad_scale, plain.step = step_;
  const size_t ps = dtype_size(param_dtype_), gs = dtype_size(grad_dtype_);
  auto state = [&](const Buffer& b, const ParamRange& r) {
    return b.data() == nullptr ? Tensor()
                               : Tensor(b.as<float>() + r.state_offset, DType::F32, {r.numel});
  };
  for (const ParamRange& r : ranges_) {
    const float wd = r.decay ? cfg_.weight_decay : 0.0f;
    // fp32 parameters are their own master copy: the kernels update them in place.
    const Tensor master(master_of(r), DType::F32, {r.numel});
    const Tensor param = param_dtype_ == DType::F32
                             ? Tensor()
                             : Tensor(static_cast<char*>(params_) + size_t(param_offset(r)) * ps,
                                      param_dtype_, {r.numel});
    const int64_t go = packed_.grads ? r.state_offset : r.offset;
    const Tensor grad(const_cast<char*>(static_cast<const char*>(grads)) + size_t(go) * gs,
                      grad_dtype_, {r.numel});
    if (sgd) {
      plain.weight_decay = wd;
      ops::sgd_step(master, param, grad, state(m_, r), plain);
    } else {
      adam.weight_decay = wd;
      ops::adam_step(master, param, grad, state(m_, r), state(v_, r), adam);
    }
  }
}

}  // namespace strata
