// A decoder-only Transformer (GPT-2 or Llama family) over flat parameter and gradient buffers
// laid out by ModelSpec. Activations for one micro-batch (B, T) are allocated once, at
// construction; forward and backward allocate nothing.
#pragma once

#include <cstdint>
#include <memory>

#include "strata/core/dtype.h"
#include "strata/model/param_spec.h"

namespace strata {

// Told during backward when a unit's parameter gradients are final for this micro-batch: units
// are 0 = embedding, 1..L = blocks, L+1 = head (ModelSpec::units order). Backward finishes them
// from the last to the first; with tied embeddings the embedding unit (holding the tied weight)
// is finished last.
class UnitHook {
 public:
  virtual ~UnitHook() = default;
  virtual void unit_done(int unit) = 0;
};

class Transformer {
 public:
  virtual ~Transformer() = default;

  // Forward over the micro-batch; inputs, targets (B, T) int32 (target < 0 is ignored).
  // Returns the sum of per-token losses over counted tokens. With `train`, also leaves the
  // logits' gradient, scaled by `dloss` (1/tokens of the global batch × loss scale), ready for
  // backward().
  virtual double forward(const int32_t* inputs, const int32_t* targets, float dloss,
                         bool train) = 0;
  // Backward of the last training forward: parameter gradients accumulate (+=) into grads.
  // `hook`, when given, hears of each unit as its gradients are complete.
  virtual void backward(UnitHook* hook = nullptr) = 0;
  // The logits of the last forward (B, T, V) in the parameter dtype, valid until backward().
  virtual const void* logits() const = 0;
  // Number of targets >= 0 in the last forward.
  virtual int64_t counted_tokens() const = 0;
};

// params: flat buffer of spec.numel elements of `param_dtype`; grads: the same in `grad_dtype`.
// Both must outlive the model. B, T: micro-batch size and sequence length (T <= seq_len).
std::unique_ptr<Transformer> make_transformer(const ModelSpec& spec, DType param_dtype,
                                              DType grad_dtype, void* params, void* grads, int B,
                                              int T);

}  // namespace strata
