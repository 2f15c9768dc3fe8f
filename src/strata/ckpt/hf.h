// Hugging Face interop: a model's global tensors to and from a transformers checkpoint directory
// (model.safetensors + config.json) of GPT2LMHeadModel or LlamaForCausalLM, as pure functions
// over whole (tp = 1) tensors. Nothing here knows how the tensors are sharded at run time.
//
// The mapping (hf_tensors) is one static table from (family, ParamRole) to Hugging Face names.
// Every strata weight is [out_features, in_features] like torch.nn.Linear; the fused weights are
// first rewritten in canonical row order (to_canonical, param_spec.h), then:
//   GPT-2 c_attn / c_proj / c_fc / mlp.c_proj weights are transformers' Conv1D, stored transposed
//     as (in_features, out_features); c_attn keeps QKV fused as [q | k | v] columns.
//   Llama's QKV is split by canonical rows into q_proj (heads·hd), k_proj and v_proj (kv_heads·hd
//     each), gate|up into gate_proj and up_proj (ffn_hidden rows each).
// RoPE needs no q/k permutation: strata rotates the two halves of each head (lo = first hd/2,
// hi = second hd/2) by the angle t·θ^(-2i/hd), which is transformers' rotate_half convention.
// The vocabulary matrices are unpadded (model.vocab rows). With tied embeddings lm_head.weight
// is not written (the config says tie_word_embeddings).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "strata/core/dtype.h"
#include "strata/model/model_config.h"
#include "strata/model/param_spec.h"

namespace strata::ckpt {

// One tensor of the Hugging Face checkpoint: rows [row_begin, row_begin + rows) of strata
// parameter `param`'s tensor in canonical row order, transposed for GPT-2's Conv1D weights.
struct HfTensor {
  std::string name;            // e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;  // as Hugging Face stores it
  int param = 0;               // index into ModelSpec::params
  int64_t row_begin = 0, rows = 0;
  bool transposed = false;  // Conv1D: (in_features, out_features)
};

// Every Hugging Face tensor of spec's model, grouped by strata parameter in spec order. Throws if
// a parameter has no Hugging Face counterpart.
std::vector<HfTensor> hf_tensors(const ModelSpec& spec);

// The whole tensor of parameter p (a tp = 1 spec's ParamSpec) in strata's global layout, fp32.
using GlobalTensorFn = std::function<std::vector<float>(const ParamSpec& p)>;

// Writes dir/model.safetensors (Hugging Face tensor names, row order and orientation, fused
// weights split, no vocabulary padding) in `dtype` (F32, BF16 or F16), and dir/config.json
// (GPT2LMHeadModel / LlamaForCausalLM with the model's dimensions); dir is created if absent and
// each file is written atomically (tmp + rename). spec must be built with tp = 1.
void export_hf(const ModelSpec& spec, const GlobalTensorFn& get, DType dtype,
               const std::string& dir);

// Reads a Hugging Face checkpoint: a safetensors file, or a directory holding model.safetensors
// (or shards listed in model.safetensors.index.json). Checks every tensor the model needs is there
// with the right shape (InputError naming the tensor and the expected and actual shapes) and
// returns each strata parameter's global tensor (strata names and layout) in fp32. Extra tensors
// (attention bias buffers, ...) are ignored; names without the base-model prefix ("h.0...",
// "layers.0...", as the original GPT-2 checkpoints have) are accepted; a lm_head.weight beside tied
// embeddings must equal the token embedding. F32, BF16 and F16 tensors are read.
std::map<std::string, std::vector<float>> import_hf(const std::string& path, const ModelSpec& spec);

// The ModelConfig a Hugging Face config.json (or a directory holding one) describes, for
// importing without a strata config (hf_config.cc): a model_type of a family model_families()
// lists (Gemma 3's text model as gemma3_text); seq_len is n_positions / max_position_embeddings.
// InputError naming the field on what strata's model does not compute (longrope, partial rotary,
// soft-capping, a vision tower, ...).
ModelConfig model_config_from_hf(const std::string& config_json_path);
// The config.json transformers loads m from, the weights in `dtype` (hf_config.cc).
nlohmann::json hf_config_json(const ModelConfig& m, DType dtype);

}  // namespace strata::ckpt
