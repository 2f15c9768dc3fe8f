// The optimizer over a flat parameter buffer: fp32 master weights (a separate copy only when the
// parameters are bf16/fp16), Adam moments or SGD momentum, all in fp32, stepped range by range
// so weight decay applies only where the model says (matrices, not biases or norm gains).
//
// Partitioned (ZeRO stage 1): the fp32 state exists only for the ranges given, packed into
// state_numel elements at each range's state_offset; parameters and gradients are still
// addressed by the range's offset in the full flat buffers — unless Packed says that the
// parameters (ZeRO stage 3) or the gradients (stages 2-3) are partitioned too, laid out like the
// state: then they are addressed by state_offset. Only the parameters inside the ranges are
// written. fp32 parameters are their own master copy, partitioned or not (no MasterParams bytes).
#pragma once

#include <cstdint>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/core/memory.h"
#include "strata/optim/optim_config.h"

namespace strata {

struct ParamRange {
  int64_t offset, numel;  // in the flat parameter and gradient buffers
  bool decay;
  int64_t state_offset = -1;  // in master and moments; -1: equal to offset (unpartitioned)
};

struct Packed {
  bool params = false, grads = false;
};

class Optimizer {
 public:
  // params: numel elements of param_dtype. The caller writes the initial values through master_of()
  // (in fp32, unrounded) and calls publish(). state_numel < 0: the state covers the whole flat
  // buffer (every state_offset must be -1); otherwise the state is partitioned: state_numel
  // elements, every range with its state_offset.
  Optimizer(const OptimizerConfig& c, DType param_dtype, DType grad_dtype, void* params,
            int64_t numel, std::vector<ParamRange> ranges, int64_t state_numel = -1,
            Packed packed = {});

  // Writes the master weights, rounded to the parameter dtype, into the parameters (only the
  // ranges' elements when partitioned).
  void publish();

  // One step at learning rate lr: g = grads * grad_scale (unscaling and clipping folded in).
  // Updates the master weights and writes them back, rounded, into params.
  void step(const void* grads, float lr, float grad_scale);

  int64_t steps_taken() const { return step_; }
  // A resumed run's steps (Adam's bias correction and the schedule continue from it).
  void set_steps_taken(int64_t steps) { step_ = steps; }
  // Where range r's fp32 master values live (r as given to the constructor, or any range inside
  // one): the parameters themselves for fp32 parameters, else the partitioned master copy.
  float* master_of(const ParamRange& r);
  // Range r's fp32 moments: k = 0 Adam's first moment or SGD's momentum, k = 1 Adam's second;
  // nullptr where the optimizer keeps none (SGD without momentum; SGD's second).
  float* moment_of(int k, const ParamRange& r);
  const std::vector<ParamRange>& ranges() const { return ranges_; }

 private:
  OptimizerConfig cfg_;
  DType param_dtype_, grad_dtype_;
  void* params_;
  int64_t numel_, state_numel_;
  bool partitioned_;
  Packed packed_;
  std::vector<ParamRange> ranges_;
  int64_t param_offset(const ParamRange& r) const;
  Buffer master_buf_, m_, v_;
  float* master_;
  int64_t step_ = 0;
};

}  // namespace strata
