// A decoder-only Transformer (GPT-2 or Llama family) over flat parameter and gradient buffers
// laid out by ModelSpec. Activations for one micro-batch (B, T) are allocated once, at
// construction; forward and backward allocate nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/model/param_spec.h"

namespace strata {

// Where a unit's parameters and gradients live during a step, and when its gradients are final.
// Units are ModelSpec::units (param_spec.h). Without a hook, or where a method returns nullptr,
// the model uses its own flat buffers; ZeRO stages 2-3 hand out a gradient buffer per unit, stage
// 3 gathers each unit's parameters just before they are read.
//
// The calls come in a static order that depends only on the model (param_trace()), so every
// data-parallel rank makes the same ones: forward acquires the vocabulary units, the position
// unit, each block's attention and MLP units, the final norm and the output units (with tied
// embeddings: the vocabulary units again); backward acquires the output units in reverse, the
// final norm, then each block's MLP and attention units from the last block down — the
// embedding's backward reads no parameters. Each acquire is paired with a release once the model
// is done reading. Backward asks grads_for() before it accumulates (+=) into a unit and reports
// unit_done() right after, in descending flat offsets among final reports: output units, final
// norm, blocks, position, vocabulary units. A tied vocabulary unit is reported twice: after the
// output projection added its part (final = false) and after the embedding added the rest
// (final = true); grads_for() is asked before each.
class UnitHook {
 public:
  enum class Pass { Forward, Backward };
  virtual ~UnitHook() = default;
  virtual void begin_pass(Pass) {}
  // The unit's parameters (its first element, padding layout as ModelSpec), or nullptr.
  virtual const void* acquire_params(int /*unit*/) { return nullptr; }
  virtual void release_params(int /*unit*/) {}
  // Where backward accumulates the unit's gradients (its first element), or nullptr.
  virtual void* grads_for(int /*unit*/) { return nullptr; }
  // The gradients asked for last are added; final: no more will be added in this backward.
  virtual void unit_done(int /*unit*/, bool /*final*/) {}
};

// The units acquire_params() sees, in order, in a forward or a backward pass of `spec`.
std::vector<int> param_trace(const ModelSpec& spec, UnitHook::Pass pass);

class Transformer {
 public:
  virtual ~Transformer() = default;

  // Forward over the micro-batch; inputs, targets (B, T) int32 (target < 0 is ignored).
  // Returns the sum of per-token losses over counted tokens. With `train`, also leaves the
  // logits' gradient, scaled by `dloss` (1/tokens of the global batch × loss scale), ready for
  // backward().
  virtual double forward(const int32_t* inputs, const int32_t* targets, float dloss, bool train,
                         UnitHook* hook = nullptr) = 0;
  // Backward of the last training forward: parameter gradients accumulate (+=) into grads.
  // `hook`, when given, hears of each unit as its gradients are complete.
  virtual void backward(UnitHook* hook = nullptr) = 0;
  // The logits of the last forward (B, T, V) in the parameter dtype, valid until backward().
  virtual const void* logits() const = 0;
  // Number of targets >= 0 in the last forward.
  virtual int64_t counted_tokens() const = 0;
};

// params: flat buffer of spec.numel elements of `param_dtype`; grads: the same in `grad_dtype`.
// Both must outlive the model. Either may be nullptr when every pass gets a hook that places all
// units (ZeRO stage 3 has no full parameter buffer; stages 2-3 no full gradient buffer). B, T:
// micro-batch size and sequence length (T <= seq_len).
std::unique_ptr<Transformer> make_transformer(const ModelSpec& spec, DType param_dtype,
                                              DType grad_dtype, void* params, void* grads, int B,
                                              int T);

}  // namespace strata
