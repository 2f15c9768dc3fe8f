// The optimizer over a flat parameter buffer: fp32 master weights (a separate copy only when the
// parameters are bf16/fp16), Adam moments or SGD momentum, all in fp32, stepped range by range
// so weight decay applies only where the model says (matrices, not biases or norm gains).
#pragma once

#include <cstdint>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/core/memory.h"
#include "strata/optim/optim_config.h"

namespace strata {

struct ParamRange {
  int64_t offset, numel;
  bool decay;
};

class Optimizer {
 public:
  // params: numel elements of param_dtype. The caller writes the initial values into master()
  // (in fp32, unrounded) and calls publish().
  Optimizer(const OptimizerConfig& c, DType param_dtype, DType grad_dtype, void* params,
            int64_t numel, std::vector<ParamRange> ranges);

  // Writes the master weights, rounded to the parameter dtype, into the parameters.
  void publish();

  // One step at learning rate lr: g = grads * grad_scale (unscaling and clipping folded in).
  // Updates the master weights and writes them back, rounded, into params.
  void step(const void* grads, float lr, float grad_scale);

  int64_t steps_taken() const { return step_; }
  float* master() { return master_; }
  float* moment1() { return m_.as<float>(); }
  float* moment2() { return v_.as<float>(); }
  int64_t numel() const { return numel_; }

 private:
  OptimizerConfig cfg_;
  DType param_dtype_, grad_dtype_;
  void* params_;
  int64_t numel_;
  std::vector<ParamRange> ranges_;
  Buffer master_buf_, m_, v_;
  float* master_;
  int64_t step_ = 0;
};

}  // namespace strata
