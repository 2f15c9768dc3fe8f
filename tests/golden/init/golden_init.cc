// Writes a golden case's initial weights, batch and hyper-parameters as safetensors for
// make_golden.py. Usage: golden_init PRESET OUT.safetensors (see scripts/make_golden.sh).
#include <cstdio>
#include <string>
#include <vector>

#include "strata/config/config.h"
#include "strata/core/safetensors.h"
#include "strata/train/engine.h"
#include "tests/device_host.h"
#include "tests/golden/golden_case.h"

int main(int argc, char** argv) {
  using namespace strata;
  if (argc != 3) {
    std::fprintf(stderr, "usage: golden_init PRESET OUT.safetensors\n");
    return 2;
  }
  Config cfg = parse_config(golden::config(argv[1], false));
  resolve_batch(cfg, 1);
  Engine engine(cfg, nullptr);
  const ModelConfig& m = cfg.model;
  SafetensorsWriter w;
  const std::vector<float> host =
      test::device_f32(engine.params(), DType::F32, engine.spec().numel);
  const float* p = host.data();
  std::vector<std::vector<float>> canonical;  // Hugging Face row order, as PyTorch reads it
  for (const ParamSpec& s : engine.spec().params) {
    canonical.emplace_back(size_t(s.numel()));
    to_canonical(s, p + s.offset, canonical.back().data());
    w.add(s.name, "F32", s.shape, canonical.back().data(), size_t(s.numel()) * 4);
  }
  auto tok = golden::tokens(m.seq_len, m.vocab);
  w.add("tokens", "I32", {golden::kBatch, m.seq_len + 1}, tok.data(), tok.size() * 4);
  const OptimizerConfig& o = cfg.optimizer;
  auto num = [](double v) {
    char b[64];
    std::snprintf(b, sizeof b, "%.9g", v);
    return std::string(b);
  };
  w.set_metadata("family", m.family);
  w.set_metadata("layers", std::to_string(m.layers));
  w.set_metadata("hidden", std::to_string(m.hidden));
  w.set_metadata("heads", std::to_string(m.heads));
  w.set_metadata("kv_heads", std::to_string(m.kv_heads));
  w.set_metadata("ffn_hidden", std::to_string(m.ffn_hidden));
  w.set_metadata("vocab", std::to_string(m.vocab));
  w.set_metadata("seq_len", std::to_string(m.seq_len));
  w.set_metadata("tied", m.tied_embeddings ? "true" : "false");
  w.set_metadata("norm_eps", num(m.norm_eps));
  w.set_metadata("rope_theta", num(m.rope_theta));
  w.set_metadata("lr", num(o.lr));
  w.set_metadata("beta1", num(o.beta1));
  w.set_metadata("beta2", num(o.beta2));
  w.set_metadata("eps", num(o.eps));
  w.set_metadata("weight_decay", num(o.weight_decay));
  w.set_metadata("grad_clip", num(cfg.gradient_clipping));
  w.set_metadata("steps", std::to_string(golden::kSteps));
  w.write(argv[2]);
  return 0;
}
