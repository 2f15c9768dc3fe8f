// Hugging Face interop: the tensor table covers every parameter, export writes exactly
// transformers' names, shapes and layouts, import gives back every global tensor bit for bit, and
// bad checkpoints and configs fail naming what is wrong.
#include "strata/ckpt/hf.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "strata/core/check.h"
#include "strata/core/rng.h"
#include "strata/core/safetensors.h"
#include "tests/temp_dir_test.h"

namespace strata::ckpt {
namespace {

namespace fs = std::filesystem;
using Tensors = std::map<std::string, std::vector<float>>;

ModelConfig tiny(const std::string& family, bool tied) {
  ModelConfig m;
  m.family = family;
  m.layers = 2, m.hidden = 32, m.heads = 4, m.vocab = 96, m.seq_len = 16;
  m.kv_heads = family == "gpt2" ? 4 : 2;
  m.ffn_hidden = family == "gpt2" ? 128 : 64;
  m.tied_embeddings = tied;
  return m;
}

// Every parameter's global tensor drawn at random, norm gains and biases too, so that no two
// elements are alike.
Tensors random_tensors(const ModelSpec& spec, uint64_t seed) {
  Tensors out;
  for (const ParamSpec& p : spec.params) {
    std::vector<float>& w = out[p.name];
    w.resize(size_t(p.numel()));
    rng_fill_normal(w.data(), rng_key(seed, p.name), 0, w.size(), 0.0f, 1.0f);
  }
  return out;
}

GlobalTensorFn from(const Tensors& t) {
  return [&t](const ParamSpec& p) { return t.at(p.name); };
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

std::vector<float> f32_of(const SafetensorView& v) {
  EXPECT_EQ(v.dtype, "F32");
  std::vector<float> out(size_t(v.numel()));
  std::memcpy(out.data(), v.data, v.bytes);
  return out;
}

// Copies every tensor of `in` into a writer, renamed by `rename` ("" drops it).
SafetensorsWriter copy_of(const SafetensorsFile& in,
                          const std::function<std::string(const std::string&)>& rename) {
  SafetensorsWriter w;
  w.set_metadata("format", "pt");
  for (const std::string& n : in.names()) {
    const SafetensorView v = in.get(n);
    const std::string to = rename(n);
    if (!to.empty()) w.add(to, v.dtype, v.shape, v.data, v.bytes);
  }
  return w;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

class HfTest : public test::TempDirTest {
 protected:
  // Exports random tensors of m into path(name); returns them.
  Tensors export_random(const ModelConfig& m, const std::string& name, DType dtype = DType::F32) {
    const ModelSpec spec = build_model_spec(m);
    Tensors t = random_tensors(spec, 7);
    export_hf(spec, from(t), dtype, path(name));
    return t;
  }
};

TEST(HfTensors, CoverEveryRowOfEveryParameterOnce) {
  for (const char* family : {"gpt2", "llama", "qwen2_moe"}) {
    for (bool tied : {true, false}) {
      ModelConfig m = tiny(family == std::string("gpt2") ? "gpt2" : "llama", tied);
      if (family == std::string("qwen2_moe")) {  // per-expert tensors, a shared expert
        m.family = family, m.moe.experts = 3, m.moe.top_k = 2, m.moe.ffn_hidden = 8;
        m.moe.shared_ffn_hidden = 16, m.moe.shared_gate = true;
      }
      const ModelSpec spec = build_model_spec(m);
      std::vector<std::vector<int>> covered(spec.params.size());
      for (size_t i = 0; i < spec.params.size(); ++i) {
        covered[i].assign(size_t(spec.params[i].global_shape[0]), 0);
      }
      std::set<std::string> names;
      for (const HfTensor& t : hf_tensors(spec)) {
        EXPECT_TRUE(names.insert(t.name).second) << t.name << " twice";
        const ParamSpec& p = spec.params[size_t(t.param)];
        const int64_t cols = p.global_shape.size() > 1 ? p.global_shape[1] : 1;
        int64_t n = 1;
        for (int64_t d : t.shape) n *= d;
        EXPECT_EQ(n, t.rows * cols) << t.name;
        for (int64_t r = t.row_begin; r < t.row_begin + t.rows; ++r) ++covered[size_t(t.param)][r];
      }
      for (size_t i = 0; i < spec.params.size(); ++i) {
        for (int c : covered[i]) ASSERT_EQ(c, 1) << family << " " << spec.params[i].name;
      }
      EXPECT_EQ(names.count("lm_head.weight"), tied ? 0u : 1u) << family;
      if (m.moe.experts > 0) {
        EXPECT_EQ(names.count("model.layers.1.mlp.experts.2.up_proj.weight"), 1u);
        EXPECT_EQ(names.count("model.layers.0.mlp.shared_expert_gate.weight"), 1u);
      }
    }
  }
}

TEST(HfTensors, AParameterWithoutCounterpartIsAnError) {
  ModelSpec spec = build_model_spec(tiny("gpt2", true));
  spec.config.family = "mistral";
  try {
    hf_tensors(spec);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("wpe of a mistral model has no Hugging Face"),
              std::string::npos)
        << e.what();
  }
}

// The names and shapes transformers' GPT2LMHeadModel / LlamaForCausalLM have for the tiny models.
std::map<std::string, std::vector<int64_t>> expected_gpt2() {
  std::map<std::string, std::vector<int64_t>> e = {{"transformer.wte.weight", {96, 32}},
                                                   {"transformer.wpe.weight", {16, 32}},
                                                   {"transformer.ln_f.weight", {32}},
                                                   {"transformer.ln_f.bias", {32}}};
  for (const std::string i : {"0", "1"}) {
    const std::string h = "transformer.h." + i + ".";
    e[h + "ln_1.weight"] = {32}, e[h + "ln_1.bias"] = {32};
    e[h + "attn.c_attn.weight"] = {32, 96}, e[h + "attn.c_attn.bias"] = {96};
    e[h + "attn.c_proj.weight"] = {32, 32}, e[h + "attn.c_proj.bias"] = {32};
    e[h + "ln_2.weight"] = {32}, e[h + "ln_2.bias"] = {32};
    e[h + "mlp.c_fc.weight"] = {32, 128}, e[h + "mlp.c_fc.bias"] = {128};
    e[h + "mlp.c_proj.weight"] = {128, 32}, e[h + "mlp.c_proj.bias"] = {32};
  }
  return e;
}

std::map<std::string, std::vector<int64_t>> expected_llama() {
  std::map<std::string, std::vector<int64_t>> e = {{"model.embed_tokens.weight", {96, 32}},
                                                   {"model.norm.weight", {32}},
                                                   {"lm_head.weight", {96, 32}}};
  for (const std::string i : {"0", "1"}) {
    const std::string l = "model.layers." + i + ".";
    e[l + "input_layernorm.weight"] = {32};
    e[l + "self_attn.q_proj.weight"] = {32, 32};
    e[l + "self_attn.k_proj.weight"] = {16, 32};
    e[l + "self_attn.v_proj.weight"] = {16, 32};
    e[l + "self_attn.o_proj.weight"] = {32, 32};
    e[l + "post_attention_layernorm.weight"] = {32};
    e[l + "mlp.gate_proj.weight"] = {64, 32};
    e[l + "mlp.up_proj.weight"] = {64, 32};
    e[l + "mlp.down_proj.weight"] = {32, 64};
  }
  return e;
}

TEST_F(HfTest, ExportWritesExactlyTheHuggingFaceTensors) {
  for (const char* family : {"gpt2", "llama"}) {
    const bool gpt2 = std::string(family) == "gpt2";
    export_random(tiny(family, gpt2), family);
    const SafetensorsFile f(path(family) + "/model.safetensors");
    const auto expected = gpt2 ? expected_gpt2() : expected_llama();
    std::map<std::string, std::vector<int64_t>> got;
    for (const std::string& n : f.names()) {
      EXPECT_EQ(f.get(n).dtype, "F32") << n;
      got[n] = f.get(n).shape;
    }
    EXPECT_EQ(got, expected) << family;
    EXPECT_EQ(f.metadata().at("format"), "pt");
    std::set<std::string> files;
    for (const auto& e : fs::directory_iterator(path(family))) {
      files.insert(e.path().filename().string());
    }
    EXPECT_EQ(files, (std::set<std::string>{"config.json", "model.safetensors"})) << family;
  }
}

TEST_F(HfTest, ExportThenImportIsBitForBit) {
  for (const char* family : {"gpt2", "llama"}) {
    for (bool tied : {true, false}) {
      const std::string name = std::string(family) + (tied ? "_tied" : "_untied");
      const ModelSpec spec = build_model_spec(tiny(family, tied));
      const Tensors t = export_random(tiny(family, tied), name);
      const Tensors from_dir = import_hf(path(name), spec);
      const Tensors from_file = import_hf(path(name) + "/model.safetensors", spec);
      ASSERT_EQ(from_dir.size(), spec.params.size()) << name;
      for (const ParamSpec& p : spec.params) {
        const std::vector<float>& a = t.at(p.name);
        ASSERT_EQ(from_dir.at(p.name).size(), a.size()) << name << " " << p.name;
        EXPECT_EQ(std::memcmp(from_dir.at(p.name).data(), a.data(), a.size() * 4), 0)
            << name << " " << p.name;
        EXPECT_EQ(from_file.at(p.name), from_dir.at(p.name)) << name << " " << p.name;
      }
    }
  }
}

// GPT-2's fused c_attn is Conv1D (C, 3C): column j is canonical QKV row j ([q | k | v], head h's
// rows h·hd .. h·hd+hd-1 of each); strata's rows are grouped per head (q, k, v of head h).
TEST_F(HfTest, Gpt2ElementsLandWhereTransformersReadsThem) {
  const ModelConfig m = tiny("gpt2", true);
  const Tensors t = export_random(m, "gpt2");
  const SafetensorsFile f(path("gpt2") + "/model.safetensors");
  const int64_t C = 32, hd = 8, F = 128;
  for (int l = 0; l < 2; ++l) {
    const std::string s = "h." + std::to_string(l) + ".", h = "transformer." + s;
    const std::vector<float>& qkv = t.at(s + "attn.c_attn.weight");  // (3C, C) grouped
    const std::vector<float>& qkv_b = t.at(s + "attn.c_attn.bias");
    const std::vector<float> c_attn = f32_of(f.get(h + "attn.c_attn.weight"));  // (C, 3C)
    const std::vector<float> c_attn_b = f32_of(f.get(h + "attn.c_attn.bias"));
    for (int64_t head = 0; head < 4; ++head) {
      for (int64_t part = 0; part < 3; ++part) {  // q, k, v
        for (int64_t d = 0; d < hd; ++d) {
          const int64_t j = part * C + head * hd + d, row = head * 3 * hd + part * hd + d;
          ASSERT_EQ(c_attn_b[j], qkv_b[row]) << l << " " << j;
          for (int64_t c = 0; c < C; ++c) ASSERT_EQ(c_attn[c * 3 * C + j], qkv[row * C + c]);
        }
      }
    }
    const std::vector<float> c_fc = f32_of(f.get(h + "mlp.c_fc.weight"));      // (C, F)
    const std::vector<float> c_proj = f32_of(f.get(h + "mlp.c_proj.weight"));  // (F, C)
    const std::vector<float> a_proj = f32_of(f.get(h + "attn.c_proj.weight"));
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t k = 0; k < F; ++k) {
        ASSERT_EQ(c_fc[c * F + k], t.at(s + "mlp.c_fc.weight")[k * C + c]);
        ASSERT_EQ(c_proj[k * C + c], t.at(s + "mlp.c_proj.weight")[c * F + k]);
      }
      for (int64_t i = 0; i < C; ++i) {
        ASSERT_EQ(a_proj[i * C + c], t.at(s + "attn.c_proj.weight")[c * C + i]);
      }
    }
    EXPECT_EQ(f32_of(f.get(h + "mlp.c_fc.bias")), t.at(s + "mlp.c_fc.bias"));
    EXPECT_EQ(f32_of(f.get(h + "ln_2.bias")), t.at(s + "ln_2.bias"));
  }
  EXPECT_EQ(f32_of(f.get("transformer.wte.weight")), t.at("wte"));
  EXPECT_EQ(f32_of(f.get("transformer.wpe.weight")), t.at("wpe"));
  EXPECT_EQ(f32_of(f.get("transformer.ln_f.weight")), t.at("ln_f.weight"));
}

// Llama (heads 4, kv_heads 2, hd 8): strata's QKV rows per group g are its two query heads, its
// key head, its value head; gate|up rows interleave (2f gate f, 2f+1 up f).
TEST_F(HfTest, LlamaElementsLandWhereTransformersReadsThem) {
  const Tensors t = export_random(tiny("llama", false), "llama");
  const SafetensorsFile f(path("llama") + "/model.safetensors");
  const int64_t C = 32, hd = 8, rep = 2, F = 64;
  for (int l = 0; l < 2; ++l) {
    const std::string s = "layers." + std::to_string(l) + ".", h = "model." + s;
    const std::vector<float>& qkv = t.at(s + "self_attn.qkv_proj.weight");
    const std::vector<float> q = f32_of(f.get(h + "self_attn.q_proj.weight"));
    const std::vector<float> k = f32_of(f.get(h + "self_attn.k_proj.weight"));
    const std::vector<float> v = f32_of(f.get(h + "self_attn.v_proj.weight"));
    for (int64_t g = 0; g < 2; ++g) {
      const int64_t base = g * (rep + 2) * hd;
      for (int64_t d = 0; d < hd; ++d) {
        for (int64_t c = 0; c < C; ++c) {
          for (int64_t r = 0; r < rep; ++r) {
            ASSERT_EQ(q[((g * rep + r) * hd + d) * C + c], qkv[(base + r * hd + d) * C + c]);
          }
          ASSERT_EQ(k[(g * hd + d) * C + c], qkv[(base + rep * hd + d) * C + c]);
          ASSERT_EQ(v[(g * hd + d) * C + c], qkv[(base + (rep + 1) * hd + d) * C + c]);
        }
      }
    }
    const std::vector<float>& gate_up = t.at(s + "mlp.gate_up_proj.weight");
    const std::vector<float> gate = f32_of(f.get(h + "mlp.gate_proj.weight"));
    const std::vector<float> up = f32_of(f.get(h + "mlp.up_proj.weight"));
    for (int64_t i = 0; i < F; ++i) {
      for (int64_t c = 0; c < C; ++c) {
        ASSERT_EQ(gate[i * C + c], gate_up[2 * i * C + c]);
        ASSERT_EQ(up[i * C + c], gate_up[(2 * i + 1) * C + c]);
      }
    }
    EXPECT_EQ(f32_of(f.get(h + "self_attn.o_proj.weight")), t.at(s + "self_attn.o_proj.weight"));
    EXPECT_EQ(f32_of(f.get(h + "mlp.down_proj.weight")), t.at(s + "mlp.down_proj.weight"));
    EXPECT_EQ(f32_of(f.get(h + "post_attention_layernorm.weight")),
              t.at(s + "post_attention_layernorm.weight"));
  }
  EXPECT_EQ(f32_of(f.get("model.embed_tokens.weight")), t.at("embed_tokens"));
  EXPECT_EQ(f32_of(f.get("lm_head.weight")), t.at("lm_head.weight"));
  EXPECT_EQ(f32_of(f.get("model.norm.weight")), t.at("norm.weight"));
}

TEST_F(HfTest, Bf16ExportRoundsToNearestEven) {
  const ModelConfig m = tiny("llama", false);
  const ModelSpec spec = build_model_spec(m);
  const Tensors t = export_random(m, "bf16", DType::BF16);
  const SafetensorsFile f(path("bf16") + "/model.safetensors");
  for (const std::string& n : f.names()) EXPECT_EQ(f.get(n).dtype, "BF16") << n;
  const SafetensorView down = f.get("model.layers.1.mlp.down_proj.weight");
  const std::vector<float>& want = t.at("layers.1.mlp.down_proj.weight");
  ASSERT_EQ(size_t(down.numel()), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(static_cast<const bf16*>(down.data)[i].bits, f32_to_bf16(want[i]).bits) << i;
  }
  const Tensors back = import_hf(path("bf16"), spec);
  size_t changed = 0;
  for (const ParamSpec& p : spec.params) {
    const std::vector<float>& a = t.at(p.name);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(back.at(p.name)[i], bf16_to_f32(f32_to_bf16(a[i]))) << p.name << " " << i;
      changed += back.at(p.name)[i] != a[i];
    }
  }
  EXPECT_GT(changed, 0u) << "random fp32 values must lose bits in bf16";
}

TEST_F(HfTest, ExportRefusesIntegerDtypeAndWrongSizedTensors) {
  const ModelSpec spec = build_model_spec(tiny("gpt2", true));
  Tensors t = random_tensors(spec, 1);
  EXPECT_NE(error_of([&] { export_hf(spec, from(t), DType::I32, path("i32")); }).find("int32"),
            std::string::npos);
  t["h.1.ln_2.bias"].pop_back();
  EXPECT_THROW(export_hf(spec, from(t), DType::F32, path("short")), Error);
  EXPECT_THROW(
      export_hf(build_model_spec(tiny("gpt2", true), 1, 2, 0), from(t), DType::F32, path("tp2")),
      Error);
}

TEST_F(HfTest, ImportNamesAMissingTensor) {
  const ModelConfig m = tiny("gpt2", true);
  export_random(m, "gpt2");
  const SafetensorsFile f(path("gpt2") + "/model.safetensors");
  copy_of(f, [](const std::string& n) {
    return n == "transformer.h.1.mlp.c_fc.bias" ? "" : n;
  }).write(path("missing.safetensors"));
  const std::string e =
      error_of([&] { import_hf(path("missing.safetensors"), build_model_spec(m)); });
  EXPECT_NE(e.find("no tensor 'transformer.h.1.mlp.c_fc.bias' (shape [128])"), std::string::npos)
      << e;
}

TEST_F(HfTest, ImportNamesATensorOfTheWrongShape) {
  const ModelConfig m = tiny("llama", false);
  export_random(m, "llama");
  const SafetensorsFile f(path("llama") + "/model.safetensors");
  SafetensorsWriter w = copy_of(f, [](const std::string& n) {
    return n == "model.layers.0.self_attn.k_proj.weight" ? "" : n;
  });
  const SafetensorView k = f.get("model.layers.0.self_attn.k_proj.weight");
  w.add("model.layers.0.self_attn.k_proj.weight", "F32", {32, 16}, k.data, k.bytes);
  w.write(path("shape.safetensors"));
  const std::string e =
      error_of([&] { import_hf(path("shape.safetensors"), build_model_spec(m)); });
  EXPECT_NE(e.find("tensor 'model.layers.0.self_attn.k_proj.weight' has shape [32, 16], the "
                   "model needs [16, 32]"),
            std::string::npos)
      << e;
}

// The original GPT-2 checkpoints were saved from GPT2Model: no "transformer." prefix, and the
// attention's causal-mask buffers beside the weights.
TEST_F(HfTest, ImportReadsBareGpt2NamesAndIgnoresBuffers) {
  const ModelConfig m = tiny("gpt2", true);
  const ModelSpec spec = build_model_spec(m);
  const Tensors t = export_random(m, "gpt2");
  SafetensorsWriter w = copy_of(SafetensorsFile(path("gpt2") + "/model.safetensors"),
                                [](const std::string& n) { return n.substr(12); });
  const std::vector<float> mask(16 * 16, 1.0f);
  w.add("h.0.attn.bias", "F32", {1, 1, 16, 16}, mask.data(), mask.size() * 4);
  w.write(path("bare.safetensors"));
  const Tensors back = import_hf(path("bare.safetensors"), spec);
  for (const ParamSpec& p : spec.params) EXPECT_EQ(back.at(p.name), t.at(p.name)) << p.name;
}

TEST_F(HfTest, ImportChecksATiedLmHead) {
  const ModelConfig m = tiny("gpt2", true);
  const ModelSpec spec = build_model_spec(m);
  const Tensors t = export_random(m, "gpt2");
  const SafetensorsFile f(path("gpt2") + "/model.safetensors");
  const SafetensorView wte = f.get("transformer.wte.weight");
  SafetensorsWriter same = copy_of(f, [](const std::string& n) { return n; });
  same.add("lm_head.weight", "F32", wte.shape, wte.data, wte.bytes);
  same.write(path("same.safetensors"));
  EXPECT_EQ(import_hf(path("same.safetensors"), spec).at("wte"), t.at("wte"));

  std::vector<float> other = f32_of(wte);
  other[5] += 1.0f;
  SafetensorsWriter differs = copy_of(f, [](const std::string& n) { return n; });
  differs.add("lm_head.weight", "F32", wte.shape, other.data(), other.size() * 4);
  differs.write(path("differs.safetensors"));
  const std::string e = error_of([&] { import_hf(path("differs.safetensors"), spec); });
  EXPECT_NE(e.find("lm_head.weight differs from the token embedding"), std::string::npos) << e;
}

TEST_F(HfTest, UntiedImportOfATiedCheckpointNamesLmHead) {
  export_random(tiny("llama", true), "tied");
  const std::string e =
      error_of([&] { import_hf(path("tied"), build_model_spec(tiny("llama", false))); });
  EXPECT_NE(e.find("no tensor 'lm_head.weight' (shape [96, 32])"), std::string::npos) << e;
  EXPECT_NE(e.find("model.tied_embeddings true"), std::string::npos) << e;
}

TEST_F(HfTest, ImportReadsAShardedCheckpoint) {
  const ModelConfig m = tiny("llama", false);
  const ModelSpec spec = build_model_spec(m);
  const Tensors t = export_random(m, "llama");
  const SafetensorsFile f(path("llama") + "/model.safetensors");
  fs::create_directories(path("sharded"));
  const auto first = [](const std::string& n) { return n.find("layers.1.") == n.npos; };
  copy_of(f, [&](const std::string& n) {
    return first(n) ? n : "";
  }).write(path("sharded/model-00001-of-00002.safetensors"));
  copy_of(f, [&](const std::string& n) {
    return first(n) ? "" : n;
  }).write(path("sharded/model-00002-of-00002.safetensors"));
  std::string map;
  for (const std::string& n : f.names()) {
    map += (map.empty() ? "" : ", ") + ("\"" + n + "\": \"model-0000") + (first(n) ? "1" : "2") +
           "-of-00002.safetensors\"";
  }
  write_text(path("sharded/model.safetensors.index.json"), "{\"weight_map\": {" + map + "}}");
  const Tensors back = import_hf(path("sharded"), spec);
  for (const ParamSpec& p : spec.params) EXPECT_EQ(back.at(p.name), t.at(p.name)) << p.name;
}

TEST_F(HfTest, ConfigJsonRoundTrips) {
  ModelConfig llama = tiny("llama", false);
  llama.norm_eps = 1e-6f, llama.rope_theta = 500000.0f, llama.init_std = 0.01f;
  llama.rope_scaling = {"llama3", 8.0f, 1.0f, 4.0f, 8192};
  ModelConfig gpt2 = tiny("gpt2", true);
  ModelConfig llama_tied = tiny("llama", true);
  // Each family's description: what its config.json must carry back.
  ModelConfig mistral = tiny("llama", false);
  mistral.family = "mistral", mistral.sliding_window = 5, mistral.head_dim = 16;
  ModelConfig qwen2 = tiny("llama", true);
  qwen2.family = "qwen2", qwen2.qkv_bias = true;
  qwen2.rope_scaling.type = "yarn", qwen2.rope_scaling.factor = 4.0f;
  qwen2.rope_scaling.original_max_positions = 8, qwen2.rope_scaling.attention_factor = 1.25f;
  ModelConfig qwen3 = tiny("llama", true);
  qwen3.family = "qwen3", qwen3.qk_norm = "head", qwen3.head_dim = 24;
  qwen3.sliding_window = 4, qwen3.layer_sliding = {0, 1};
  ModelConfig phi3 = tiny("llama", false);
  phi3.family = "phi3", phi3.sliding_window = 7;
  ModelConfig smollm3 = tiny("llama", true);
  smollm3.family = "smollm3", smollm3.layer_rope = {1, 0};
  ModelConfig gemma3 = tiny("llama", true);
  gemma3.family = "gemma3", gemma3.qk_norm = "head", gemma3.norm_placement = "sandwich";
  gemma3.norm_offset = 1.0f, gemma3.mlp_act = "gelu_tanh", gemma3.embed_scale = true;
  gemma3.query_pre_attn_scalar = 20.0f, gemma3.rope_local_theta = 10000.0f,
  gemma3.rope_theta = 1e6f;
  gemma3.sliding_window = 4, gemma3.layer_sliding = {1, 0}, gemma3.head_dim = 12;
  ModelConfig gemma2 = gemma3;
  gemma2.family = "gemma2", gemma2.qk_norm = "none", gemma2.rope_local_theta = 0.0f;
  gemma2.attn_logit_softcapping = 50.0f, gemma2.final_logit_softcapping = 30.0f;
  ModelConfig olmo2 = tiny("llama", false);
  olmo2.family = "olmo2", olmo2.qk_norm = "whole", olmo2.norm_placement = "post";
  // The mixtures of experts, with transformers' balancing loss (the pooled one) or none.
  ModelConfig mixtral = tiny("llama", false);
  mixtral.family = "mixtral", mixtral.ffn_hidden = 48;
  mixtral.moe.experts = 4, mixtral.moe.top_k = 2, mixtral.moe.ffn_hidden = 48;
  mixtral.moe.router_aux_loss_coef = 0.02f;
  ModelConfig qwen2_moe = tiny("llama", true);
  qwen2_moe.family = "qwen2_moe", qwen2_moe.qkv_bias = true;
  qwen2_moe.moe.experts = 4, qwen2_moe.moe.top_k = 1, qwen2_moe.moe.ffn_hidden = 16;
  qwen2_moe.moe.shared_ffn_hidden = 32, qwen2_moe.moe.shared_gate = true;
  qwen2_moe.moe.norm_topk_prob = false, qwen2_moe.moe.mlp_only_layers = {1};
  ModelConfig qwen3_moe = tiny("llama", false);
  qwen3_moe.family = "qwen3_moe", qwen3_moe.qk_norm = "head";
  qwen3_moe.moe.experts = 8, qwen3_moe.moe.top_k = 3, qwen3_moe.moe.ffn_hidden = 16;
  qwen3_moe.moe.decoder_sparse_step = 2;
  for (const ModelConfig& m : {gpt2, llama, llama_tied, mistral, qwen2, qwen3, phi3, smollm3,
                               gemma2, gemma3, olmo2, mixtral, qwen2_moe, qwen3_moe}) {
    const std::string name = m.family + (m.tied_embeddings ? "_tied" : "");
    export_random(m, name);
    const ModelConfig r = model_config_from_hf(path(name) + "/config.json");
    EXPECT_EQ(r.family, m.family) << name;
    EXPECT_EQ(r.layers, m.layers) << name;
    EXPECT_EQ(r.hidden, m.hidden) << name;
    EXPECT_EQ(r.heads, m.heads) << name;
    EXPECT_EQ(r.kv_heads, m.kv_heads) << name;
    EXPECT_EQ(r.ffn_hidden, m.ffn_hidden) << name;
    EXPECT_EQ(r.vocab, m.vocab) << name;
    EXPECT_EQ(r.seq_len, m.seq_len) << name;
    EXPECT_EQ(r.tied_embeddings, m.tied_embeddings) << name;
    EXPECT_EQ(r.norm_eps, m.norm_eps) << name;
    EXPECT_EQ(r.rope_theta, m.rope_theta) << name;
    EXPECT_EQ(r.init_std, m.init_std) << name;
    EXPECT_EQ(r.hd(), m.hd()) << name;
    EXPECT_EQ(r.qkv_bias, m.qkv_bias) << name;
    EXPECT_EQ(r.qk_norm, m.qk_norm) << name;
    EXPECT_EQ(r.sliding_window, m.sliding_window) << name;
    for (int l = 0; l < m.layers; ++l) {
      EXPECT_EQ(r.sliding(l), m.sliding(l)) << name << " layer " << l;
      EXPECT_EQ(r.rope(l), m.rope(l)) << name << " layer " << l;
    }
    EXPECT_EQ(r.rope_scaling, m.rope_scaling) << name;
    EXPECT_EQ(r.norm_placement, m.norm_placement) << name;
    EXPECT_EQ(r.norm_offset, m.norm_offset) << name;
    EXPECT_EQ(r.mlp_act, m.mlp_act) << name;
    EXPECT_EQ(r.embed_scale, m.embed_scale) << name;
    EXPECT_EQ(r.query_pre_attn_scalar, m.query_pre_attn_scalar) << name;
    EXPECT_EQ(r.rope_local_theta, m.rope_local_theta) << name;
    EXPECT_EQ(r.attn_logit_softcapping, m.attn_logit_softcapping) << name;
    EXPECT_EQ(r.final_logit_softcapping, m.final_logit_softcapping) << name;
    EXPECT_EQ(r.moe, m.moe) << name;
    EXPECT_EQ(model_config_from_hf(path(name)).hidden, m.hidden) << "a directory reads config.json";
  }
  std::ifstream in(path("llama") + "/config.json");
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(text.find("\"rms_norm_eps\": 1e-06"), std::string::npos) << text;
}

// A mixture of experts transformers' class cannot hold is refused before anything is written.
TEST_F(HfTest, ExportRefusesExpertsTransformersCannotHold) {
  ModelConfig m = tiny("llama", false);
  m.moe.experts = 4, m.moe.top_k = 2, m.moe.ffn_hidden = 16;
  const std::pair<std::string, std::string> cases[] = {
      {"llama", "only Mixtral, Qwen2-MoE and Qwen3-MoE have experts"},
      {"mixtral", "Mixtral has renormalised experts on every layer"},  // with a dense layer
      {"qwen3_moe", "Qwen3-MoE has no shared expert"},
      {"qwen2_moe", "Qwen2-MoE always has a shared expert"},
      {"qwen3_moe_sigmoid", "their routers are softmax ones"}};
  for (const auto& [name, why] : cases) {
    const std::string family = name == "qwen3_moe_sigmoid" ? "qwen3_moe" : name;
    ModelConfig c = m;
    c.family = family;
    if (name == "qwen3_moe_sigmoid") c.moe.router = "sigmoid";
    if (family == "mixtral") c.moe.mlp_only_layers = {1};
    if (name == "qwen3_moe") c.moe.shared_ffn_hidden = 16;
    const std::string dir = path("refused_" + name);
    try {
      export_random(c, "refused_" + name);
      ADD_FAILURE() << name << ": exported";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::filesystem::exists(dir)) << name << ": something was written";
  }
}

// openai-community/gpt2's config.json: n_ctx, n_inner null, the published dropouts.
TEST_F(HfTest, ConfigReadsThePublishedGpt2Config) {
  write_text(path("gpt2.json"), R"({"activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1, "bos_token_id": 50256,
    "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
    "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1,
    "summary_activation": null, "task_specific_params": {"text-generation": {"max_length": 50}},
    "vocab_size": 50257})");
  const ModelConfig m = model_config_from_hf(path("gpt2.json"));
  EXPECT_EQ(m.family, "gpt2");
  EXPECT_EQ(m.layers, 12);
  EXPECT_EQ(m.hidden, 768);
  EXPECT_EQ(m.heads, 12);
  EXPECT_EQ(m.kv_heads, 12);
  EXPECT_EQ(m.ffn_hidden, 3072);
  EXPECT_EQ(m.vocab, 50257);
  EXPECT_EQ(m.seq_len, 1024);
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_EQ(m.norm_eps, 1e-5f);
}

TEST_F(HfTest, ConfigRefusesWhatStrataDoesNotCompute) {
  const std::string gpt2 = R"("model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 4,
    "vocab_size": 96, "n_positions": 16)";
  const std::string llama = R"("model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64,
    "vocab_size": 96, "max_position_embeddings": 16)";
  const std::pair<std::string, std::string> cases[] = {
      {gpt2 + R"(, "activation_function": "relu")", "\"activation_function\" is \"relu\""},
      {gpt2 + R"(, "scale_attn_by_inverse_layer_idx": true)", "scale_attn_by_inverse_layer_idx"},
      {gpt2 + R"(, "n_head": 5)", "do not divide evenly"},
      {R"("model_type": "gpt2", "n_layer": 2, "n_head": 4, "vocab_size": 96, "n_positions": 16)",
       "has no \"n_embd\""},
      {gpt2 + R"(, "n_layer": "two")", "\"n_layer\" is \"two\", which is not a non-negative"},
      {llama + R"(, "hidden_act": "gelu")", "\"hidden_act\" is \"gelu\""},
      {llama + R"(, "attention_bias": true)", "\"attention_bias\" is true"},
      {llama + R"(, "mlp_bias": true)", "\"mlp_bias\" is true"},
      {llama + R"(, "head_dim": 15)", "even head dimension"},
      {llama + R"(, "rope_scaling": {"rope_type": "llama3", "factor": 8.0})",
       "has no \"original_max_position_embeddings\""},
      {llama + R"(, "rope_parameters": {"rope_type": "dynamic", "factor": 2.0})",
       "RoPE scaling \"dynamic\" is not supported"},
      {llama + R"(, "rope_scaling": {"type": "longrope", "short_factor": [1]})", "longrope is not"},
      {llama + R"(, "rope_scaling": {"rope_type": "yarn"})", "has no \"factor\""},
      {llama + R"(, "partial_rotary_factor": 0.75)", "partial rotary"},
      {R"("model_type": "mamba", "hidden_size": 32)", "\"model_type\" is \"mamba\""},
      {R"("model_type": "gemma", "hidden_size": 32)", "Gemma 1 is not supported"},
      {llama + R"(, "model_type": "gemma2", "final_logit_softcapping": -1.0)",
       "\"final_logit_softcapping\" must be >= 0"},
      {llama + R"(, "model_type": "gemma3_text", "hidden_activation": "gelu")",
       "\"hidden_activation\" is \"gelu\""},
      {llama + R"(, "vision_config": {})", "text-only"},
      {llama + R"(, "model_type": "smollm3", "no_rope_layers": [1])", "one 0 or 1 per layer"},
      {llama + R"(, "model_type": "qwen2", "use_sliding_window": true, "sliding_window": 4,
         "layer_types": ["sliding_attention", "local"])",
       "holds \"local\""},
      {llama + R"(, "model_type": "qwen3", "attention_bias": true)", "\"attention_bias\" is true"},
  };
  for (const auto& [body, want] : cases) {
    write_text(path("bad.json"), "{" + body + "}");
    const std::string e = error_of([&] { model_config_from_hf(path("bad.json")); });
    EXPECT_NE(e.find(want), std::string::npos) << body << "\n -> " << e;
  }
  write_text(path("broken.json"), "{\"model_type\": ");
  EXPECT_NE(error_of([&] { model_config_from_hf(path("broken.json")); }).find("not valid JSON"),
            std::string::npos);
}

}  // namespace
}  // namespace strata::ckpt
