// A checkpoint's manifest (ckpt/manifest.h): to_json and parse_manifest round-trip every field,
// every kind of damage is an InputError naming the field (never a crash, an overflow or a
// manifest accepted that a loader would read out of bounds with), and model_difference names the
// first field two models differ in.
#include "strata/ckpt/manifest.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/core/check.h"

namespace strata::ckpt {
namespace {

using nlohmann::json;

// Two tensors, two files, four chunks: the master weights and one moment of "w" split in two
// chunks by rows, of "b" whole.
Manifest valid() {
  Manifest m;
  m.model.family = "llama";
  m.model.layers = 2, m.model.hidden = 32, m.model.heads = 4, m.model.kv_heads = 2;
  m.model.ffn_hidden = 64, m.model.vocab = 90, m.model.seq_len = 16;
  m.model.tied_embeddings = false;
  m.model.norm_eps = 1e-6f, m.model.rope_theta = 500000.0f, m.model.init_std = 0.01f;
  m.optimizer = "adamw";
  m.step = 7, m.optimizer_steps = 5, m.consumed_samples = 112;
  m.seed = UINT64_MAX;  // the whole unsigned range survives
  m.scaler = {1024.0f, 7, 4, 2};
  m.layout = "dp 2 x tp 2 x pp 1, ZeRO 1, micro-batch 4 x 2 [[[[[[[[[[ {{{{{{{{";
  m.tensors = {{"w", {4, 3}}, {"b", {5}}};
  m.files = {{"rank_00000.safetensors", 200}, {"rank_00001.safetensors", 100}};
  m.chunks = {
      {kMaster, "w", 0, 16, 6, 0x12345678u, {{0, 3, 2, 3}}},
      {kMaster, "w", 1, 8, 6, 0xffffffffu, {{6, 3, 1, 0}, {9, 3, 1, 0}}},
      {kExpAvg, "b", 0, 40, 5, 0u, {{0, 1, 5, 1}}},
      {kMaster, "b", 0, 60, 5, 42u, {{0, 5, 1, 0}}},
  };
  return m;
}

std::string error_of(const std::string& text) {
  try {
    parse_manifest(text, "/ckpt/step_00000007/manifest.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

// The valid manifest with `edit` applied to its JSON.
std::string edited(const std::function<void(json&)>& edit) {
  json j = json::parse(to_json(valid()));
  edit(j);
  return j.dump();
}

TEST(Manifest, RoundTripsEveryField) {
  const Manifest a = valid();
  const std::string text = to_json(a);
  const Manifest b = parse_manifest(text, "manifest.json");
  EXPECT_EQ(b.format, kFormatVersion);
  EXPECT_EQ(b.model.family, a.model.family);
  EXPECT_EQ(b.model.layers, a.model.layers);
  EXPECT_EQ(b.model.hidden, a.model.hidden);
  EXPECT_EQ(b.model.heads, a.model.heads);
  EXPECT_EQ(b.model.kv_heads, a.model.kv_heads);
  EXPECT_EQ(b.model.ffn_hidden, a.model.ffn_hidden);
  EXPECT_EQ(b.model.vocab, a.model.vocab);
  EXPECT_EQ(b.model.seq_len, a.model.seq_len);
  EXPECT_EQ(b.model.tied_embeddings, a.model.tied_embeddings);
  EXPECT_EQ(b.model.norm_eps, a.model.norm_eps);
  EXPECT_EQ(b.model.rope_theta, a.model.rope_theta);
  EXPECT_EQ(b.model.init_std, a.model.init_std);
  EXPECT_EQ(model_difference(a.model, b.model), "");
  EXPECT_EQ(b.optimizer, a.optimizer);
  EXPECT_EQ(b.step, a.step);
  EXPECT_EQ(b.optimizer_steps, a.optimizer_steps);
  EXPECT_EQ(b.consumed_samples, a.consumed_samples);
  EXPECT_EQ(b.seed, a.seed);
  EXPECT_EQ(b.scaler.scale, a.scaler.scale);
  EXPECT_EQ(b.scaler.iter, a.scaler.iter);
  EXPECT_EQ(b.scaler.last_overflow_iter, a.scaler.last_overflow_iter);
  EXPECT_EQ(b.scaler.hysteresis_left, a.scaler.hysteresis_left);
  EXPECT_EQ(b.layout, a.layout);
  EXPECT_EQ(b.tensors, a.tensors);
  ASSERT_EQ(b.files.size(), a.files.size());
  for (size_t i = 0; i < a.files.size(); ++i) {
    EXPECT_EQ(b.files[i].name, a.files[i].name);
    EXPECT_EQ(b.files[i].bytes, a.files[i].bytes);
  }
  ASSERT_EQ(b.chunks.size(), a.chunks.size());
  for (size_t i = 0; i < a.chunks.size(); ++i) {
    const Chunk &x = a.chunks[i], &y = b.chunks[i];
    EXPECT_EQ(y.kind, x.kind);
    EXPECT_EQ(y.tensor, x.tensor);
    EXPECT_EQ(y.file, x.file);
    EXPECT_EQ(y.offset, x.offset);
    EXPECT_EQ(y.numel, x.numel);
    EXPECT_EQ(y.crc32c, x.crc32c);
    ASSERT_EQ(y.runs.size(), x.runs.size());
    for (size_t k = 0; k < x.runs.size(); ++k) {
      EXPECT_EQ(y.runs[k].global, x.runs[k].global);
      EXPECT_EQ(y.runs[k].len, x.runs[k].len);
      EXPECT_EQ(y.runs[k].count, x.runs[k].count);
      EXPECT_EQ(y.runs[k].stride, x.runs[k].stride);
    }
  }
  EXPECT_EQ(to_json(b), text);
}

// A sigmoid router's model and its expert bias: every float back to its bits; a bias of a dense
// layer, of the wrong length or not a number is refused, naming it.
TEST(Manifest, ExpertBiasRoundTripsAndIsChecked) {
  Manifest a = valid();
  MoeConfig& e = a.model.moe;
  e.experts = 4, e.top_k = 2, e.ffn_hidden = 16, e.router = "sigmoid";
  e.n_group = 2, e.topk_group = 1, e.routed_scaling_factor = 2.5f;
  e.expert_bias_update_rate = 0.001f;
  e.mlp_only_layers = {0};
  a.expert_bias[1] = {0.1f, -0.003f, 1e-7f, -2.75f};
  const Manifest b = parse_manifest(to_json(a), "manifest.json");
  EXPECT_EQ(model_difference(a.model, b.model), "");
  EXPECT_EQ(b.model.moe, a.model.moe);
  EXPECT_EQ(b.expert_bias, a.expert_bias);
  const auto bad = [&](const std::function<void(json&)>& edit) {
    json j = json::parse(to_json(a));
    edit(j);
    return error_of(j.dump());
  };
  EXPECT_NE(bad([](json& j) {
              j["expert_bias"]["0"] = j["expert_bias"]["1"];
            }).find("expert_bias.0 is not a MoE layer"),
            std::string::npos);
  EXPECT_NE(bad([](json& j) {
              j["expert_bias"]["1"].push_back(0.5);
            }).find("expert_bias.1 is not a list of the 4 experts' biases"),
            std::string::npos);
  EXPECT_NE(bad([](json& j) {
              j["expert_bias"]["1"][0] = "x";
            }).find("expert_bias.1 holds something that is not a finite number"),
            std::string::npos);
  EXPECT_NE(bad([](json& j) { j["model"]["moe"]["n_group"] = 3; }).find("model.moe.n_group"),
            std::string::npos);
}

TEST(Manifest, EmptyCollectionsRoundTrip) {
  Manifest a = valid();
  a.tensors.clear(), a.files.clear(), a.chunks.clear();
  const Manifest b = parse_manifest(to_json(a), "manifest.json");
  EXPECT_TRUE(b.tensors.empty());
  EXPECT_TRUE(b.files.empty());
  EXPECT_TRUE(b.chunks.empty());
}

struct Bad {
  std::string what, text;
  std::string names;  // a part of the message: the field and the problem
};

void expect_refused(const std::vector<Bad>& cases) {
  for (const Bad& b : cases) {
    const std::string e = error_of(b.text);
    EXPECT_NE(e.find(b.names), std::string::npos)
        << b.what << ": the error should say \"" << b.names << "\"; it says: " << e;
    EXPECT_NE(e.find("/ckpt/step_00000007/manifest.json"), std::string::npos)
        << b.what << ": the error should name the file; it says: " << e;
  }
}

TEST(Manifest, NotJsonOrTooDeepIsRefused) {
  std::string deep_objects;
  for (int i = 0; i < 10000; ++i) deep_objects += "{\"a\":";
  expect_refused({
      {"empty", "", "the JSON does not parse"},
      {"truncated", to_json(valid()).substr(0, 300), "the JSON does not parse"},
      {"garbage", std::string("\x00\xff\xfe garbage", 12), "the JSON does not parse"},
      {"trailing text", to_json(valid()) + " x", "the JSON does not parse"},
      {"10000 [", std::string(10000, '['), "is nested deeper than a manifest is"},
      {"10000 {", deep_objects, "is nested deeper than a manifest is"},
      {"nine levels", "{\"a\":[[[[[[[[1]]]]]]]]}", "is nested deeper"},
      {"not an object", "[1, 2]", "manifest is not an object"},
      {"a number", "17", "manifest is not an object"},
  });
  // Brackets inside strings are not nesting (the valid manifest's layout holds 18 of them).
  EXPECT_NO_THROW(parse_manifest(to_json(valid()), "m"));
}

TEST(Manifest, WrongVersionIsRefused) {
  expect_refused({
      {"format 2", edited([](json& j) { j["format"] = 2; }),
       "format is 2; this strata reads format 1"},
      {"format 0", edited([](json& j) { j["format"] = 0; }), "format is 0"},
      {"format string", edited([](json& j) { j["format"] = "1"; }),
       "manifest.format is not an integer"},
      {"format negative", edited([](json& j) { j["format"] = -1; }), "manifest.format = -1"},
  });
}

TEST(Manifest, MissingFieldsAreNamed) {
  std::vector<Bad> cases;
  // Drops the last key of `path` ("0": an array's first element), expecting `field` named.
  auto drop = [&](const std::vector<std::string>& path, const std::string& field) {
    cases.push_back({field, edited([&](json& j) {
                       json* o = &j;
                       for (size_t i = 0; i + 1 < path.size(); ++i) {
                         o = path[i] == "0" ? &o->at(size_t(0)) : &o->at(path[i]);
                       }
                       ASSERT_EQ(o->erase(path.back()), 1u) << field;
                     }),
                     field + " is missing"});
  };
  for (const char* k :
       {"format", "model", "optimizer", "step", "optimizer_steps", "consumed_samples", "seed",
        "scaler", "layout", "tensors", "files", "chunks"}) {
    drop({k}, "manifest." + std::string(k));
  }
  for (const char* k : {"family", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab",
                        "seq_len", "tied_embeddings", "norm_eps", "init_std"}) {
    drop({"model", k}, "model." + std::string(k));
  }
  for (const char* k : {"scale", "iter", "last_overflow_iter", "hysteresis_left"}) {
    drop({"scaler", k}, "scaler." + std::string(k));
  }
  for (const char* k : {"name", "bytes"}) drop({"files", "0", k}, "files[]." + std::string(k));
  for (const char* k : {"kind", "tensor", "file", "offset", "numel", "crc32c", "runs"}) {
    drop({"chunks", "0", k}, "chunks[0]." + std::string(k));
  }
  expect_refused(cases);
}

TEST(Manifest, WrongTypesAreNamed) {
  expect_refused({
      {"model", edited([](json& j) { j["model"] = "llama"; }), "model is not an object"},
      {"layers", edited([](json& j) { j["model"]["layers"] = "2"; }),
       "model.layers is not an integer"},
      {"layers float", edited([](json& j) { j["model"]["layers"] = 2.5; }),
       "model.layers is not an integer"},
      {"family", edited([](json& j) { j["model"]["family"] = 2; }), "model.family is not a string"},
      {"unknown family", edited([](json& j) { j["model"]["family"] = "bert"; }),
       "model.family is not a model family strata knows"},
      {"tied", edited([](json& j) { j["model"]["tied_embeddings"] = 1; }),
       "model.tied_embeddings is not a boolean"},
      {"norm_eps", edited([](json& j) { j["model"]["norm_eps"] = "1e-5"; }),
       "model.norm_eps is not a number"},
      {"optimizer", edited([](json& j) { j["optimizer"] = json::array(); }),
       "manifest.optimizer is not a string"},
      {"layout", edited([](json& j) { j["layout"] = nullptr; }), "manifest.layout is not a string"},
      {"seed", edited([](json& j) { j["seed"] = "1"; }), "seed is not a non-negative integer"},
      {"seed float", edited([](json& j) { j["seed"] = 1.0; }),
       "seed is not a non-negative integer"},
      {"scaler", edited([](json& j) { j["scaler"] = json::array(); }), "scaler is not an object"},
      {"scale", edited([](json& j) { j["scaler"]["scale"] = true; }),
       "scaler.scale is not a number"},
      {"tensors", edited([](json& j) { j["tensors"] = json::array(); }),
       "tensors is not an object"},
      {"shape", edited([](json& j) { j["tensors"]["w"] = 12; }),
       "tensors.w is not a shape of 1 or 2 dimensions"},
      {"dimension", edited([](json& j) {
         j["tensors"]["w"] = {4, "3"};
       }),
       "tensors.w has a dimension that is not a positive integer"},
      {"dimension float", edited([](json& j) {
         j["tensors"]["w"] = {4, 3.0};
       }),
       "tensors.w has a dimension that is not a positive integer"},
      {"files", edited([](json& j) { j["files"] = json::object(); }),
       "manifest.files is not an array"},
      {"file entry", edited([](json& j) { j["files"][0] = "rank_00000.safetensors"; }),
       "files[] is not an object"},
      {"file name", edited([](json& j) { j["files"][0]["name"] = 0; }),
       "files[].name is not a string"},
      {"chunks", edited([](json& j) { j["chunks"] = "none"; }), "manifest.chunks is not an array"},
      {"chunk", edited([](json& j) { j["chunks"][1] = 5; }), "chunks[1] is not an object"},
      {"kind", edited([](json& j) { j["chunks"][0]["kind"] = 0; }),
       "chunks[0].kind is not a string"},
      {"crc", edited([](json& j) { j["chunks"][0]["crc32c"] = "0"; }),
       "chunks[0].crc32c is not an integer"},
      {"runs", edited([](json& j) { j["chunks"][0]["runs"] = 3; }),
       "chunks[0].runs is not an array"},
      {"run not 4", edited([](json& j) {
         j["chunks"][3]["runs"][0] = {0, 5, 1};
       }),
       "chunks[3].runs has an entry not of 4 integers"},
      {"run object", edited([](json& j) {
         j["chunks"][3]["runs"][0] = {{"global", 0}};
       }),
       "chunks[3].runs has an entry not of 4 integers"},
      {"run float", edited([](json& j) {
         j["chunks"][3]["runs"][0] = {0, 5.0, 1, 0};
       }),
       "chunks[3].runs has a non-integer entry"},
  });
}

TEST(Manifest, NegativeAndHugeNumbersAreRefused) {
  const uint64_t big = uint64_t(1) << 63;
  std::string past_double = edited([](json& j) { j["model"]["init_std"] = 12345.0; });
  past_double.replace(past_double.find("12345.0"), 7, "1e309");
  expect_refused({
      {"step", edited([](json& j) { j["step"] = -1; }), "manifest.step = -1 is outside"},
      {"step 2^63", edited([&](json& j) { j["step"] = big; }), "manifest.step is out of range"},
      {"step 2^64-1", edited([](json& j) { j["step"] = UINT64_MAX; }),
       "manifest.step is out of range"},
      {"step 1e30", edited([](json& j) { j["step"] = 1e30; }), "manifest.step is not an integer"},
      {"step 2^62", edited([](json& j) { j["step"] = int64_t(1) << 62; }),
       "manifest.step = 4611686018427387904 is outside"},
      {"optimizer steps past step", edited([](json& j) { j["optimizer_steps"] = 8; }),
       "manifest.optimizer_steps = 8 is outside [0, 7]"},
      {"consumed", edited([](json& j) { j["consumed_samples"] = INT64_MIN; }),
       "manifest.consumed_samples = -9223372036854775808 is outside"},
      {"seed", edited([](json& j) { j["seed"] = -1; }), "seed is not a non-negative integer"},
      {"layers", edited([](json& j) { j["model"]["layers"] = -2; }), "model.layers = -2"},
      {"hidden 0", edited([](json& j) { j["model"]["hidden"] = 0; }), "model.hidden = 0"},
      {"hidden 2^31", edited([](json& j) { j["model"]["hidden"] = int64_t(1) << 31; }),
       "model.hidden = 2147483648 is outside"},
      {"vocab", edited([](json& j) { j["model"]["vocab"] = UINT64_MAX; }),
       "model.vocab is out of range"},
      {"scale 0", edited([](json& j) { j["scaler"]["scale"] = 0; }),
       "scaler.scale is not a positive finite number"},
      {"scale negative", edited([](json& j) { j["scaler"]["scale"] = -2.0; }),
       "scaler.scale is not a positive finite number"},
      {"scale past float", edited([](json& j) { j["scaler"]["scale"] = 1e300; }),
       "scaler.scale is not a positive finite number"},
      {"scale under float", edited([](json& j) { j["scaler"]["scale"] = 1e-300; }),
       "scaler.scale is not a positive finite number"},
      {"norm_eps past float", edited([](json& j) { j["model"]["norm_eps"] = 1e39; }),
       "model.norm_eps is not a finite number"},
      {"rope_theta past float", edited([](json& j) { j["model"]["rope_theta"] = -1e300; }),
       "model.rope_theta is not a finite number"},
      {"init_std past double", past_double, "the JSON does not parse"},
      {"last overflow", edited([](json& j) { j["scaler"]["last_overflow_iter"] = -2; }),
       "scaler.last_overflow_iter = -2"},
      {"hysteresis", edited([](json& j) { j["scaler"]["hysteresis_left"] = -1; }),
       "scaler.hysteresis_left = -1"},
      {"file bytes", edited([](json& j) { j["files"][1]["bytes"] = -4; }),
       "files[].bytes = -4 is outside"},
      {"chunk file", edited([](json& j) { j["chunks"][0]["file"] = 2; }),
       "chunks[0].file = 2 is outside [0, 1]"},
      {"chunk file negative", edited([](json& j) { j["chunks"][0]["file"] = -1; }),
       "chunks[0].file = -1"},
      {"no files", edited([](json& j) { j["files"] = json::array(); }),
       "chunks[0].file = 0 is outside [0, -1]"},
      {"offset", edited([](json& j) { j["chunks"][0]["offset"] = -8; }), "chunks[0].offset = -8"},
      {"numel", edited([](json& j) { j["chunks"][2]["numel"] = -5; }), "chunks[2].numel = -5"},
      {"numel past the tensor", edited([](json& j) { j["chunks"][2]["numel"] = 6; }),
       "chunks[2].numel = 6 is outside [0, 5]"},
      {"crc negative", edited([](json& j) { j["chunks"][0]["crc32c"] = -1; }),
       "chunks[0].crc32c = -1 is outside"},
      {"crc 2^32", edited([](json& j) { j["chunks"][0]["crc32c"] = uint64_t(1) << 32; }),
       "chunks[0].crc32c = 4294967296 is outside"},
  });
}

TEST(Manifest, ChunksPastTheirFilesEndAreRefused) {
  expect_refused({
      // rank_00001 is 100 bytes: 6 floats at 80 end at 104.
      {"past the end", edited([](json& j) { j["chunks"][1]["offset"] = 80; }),
       "chunks[1] reaches past the end of rank_00001.safetensors"},
      {"at the end", edited([](json& j) { j["chunks"][1]["offset"] = 100; }),
       "chunks[1] reaches past the end of rank_00001.safetensors"},
      {"offset past the file", edited([](json& j) { j["chunks"][1]["offset"] = 101; }),
       "chunks[1].offset = 101 is outside [0, 100]"},
      {"file shrunk", edited([](json& j) { j["files"][0]["bytes"] = 79; }),
       "chunks[3] reaches past the end of rank_00000.safetensors"},
  });
  // Exactly to the end is fine.
  EXPECT_NO_THROW(parse_manifest(edited([](json& j) { j["chunks"][1]["offset"] = 76; }), "m"));
}

TEST(Manifest, RunsOutsideTheirTensorAreRefused) {
  // chunks[3]: the 5 elements of "b" (numel 5) as one run [global, len, count, stride].
  auto run = [](std::vector<int64_t> r) {
    return edited([r](json& j) { j["chunks"][3]["runs"] = {r}; });
  };
  auto runs = [](std::vector<std::vector<int64_t>> r) {
    return edited([r](json& j) { j["chunks"][3]["runs"] = r; });
  };
  const int64_t M = INT64_MAX;
  expect_refused({
      {"negative global", run({-1, 5, 1, 0}), "chunks[3].runs has a run outside b"},
      {"past the end", run({1, 5, 1, 0}), "chunks[3].runs has a run outside b"},
      {"len 0", run({0, 0, 5, 1}), "chunks[3].runs has a run outside b"},
      {"negative len", run({0, -5, -1, 0}), "chunks[3].runs has a run outside b"},
      {"count 0", run({0, 5, 0, 0}), "chunks[3].runs has a run outside b"},
      {"negative count", run({0, 1, -5, 1}), "chunks[3].runs has a run outside b"},
      {"negative stride", run({4, 1, 5, -1}), "chunks[3].runs has a run outside b"},
      {"stride 0 repeats", run({0, 1, 5, 0}), "chunks[3].runs has a run outside b"},
      {"overlapping segments", run({0, 2, 2, 1}), "chunks[3].runs has a run outside b"},
      {"last segment past the end", run({0, 1, 5, 2}), "chunks[3].runs has a run outside b"},
      // global + (count - 1)·stride + len overflows int64 for each of these.
      {"huge count", run({0, 1, M, M}), "chunks[3].runs has a run outside b"},
      {"huge stride", run({1, 1, 2, M}), "chunks[3].runs has a run outside b"},
      {"huge len", run({1, M, 1, 0}), "chunks[3].runs has a run outside b"},
      {"huge global", run({M, 1, 1, 0}), "chunks[3].runs has a run outside b"},
      {"wrapping count", run({0, 1, (M / 2) + 2, 2}), "chunks[3].runs has a run outside b"},
      {"unsigned", edited([](json& j) {
         j["chunks"][3]["runs"] = {{uint64_t(1) << 63, 1, 1, 0}};
       }),
       "chunks[3].runs has a run outside b"},
      {"more than numel", runs({{0, 5, 1, 0}, {0, 1, 1, 0}}),
       "chunks[3].runs cover more elements than the chunk holds"},
      {"fewer than numel", runs({{0, 4, 1, 0}}),
       "chunks[3].runs cover fewer elements than the chunk holds"},
      {"none", runs({}), "chunks[3].runs cover fewer elements than the chunk holds"},
      {"huge product", runs({{0, 1, 1, 0}, {0, 5, M, 6}}), "chunks[3].runs has a run outside b"},
  });
}

TEST(Manifest, UnknownKindsTensorsAndBadNamesAreRefused) {
  expect_refused({
      {"kind", edited([](json& j) { j["chunks"][0]["kind"] = "adam_v"; }),
       "chunks[0].kind \"adam_v\" is not a stored kind"},
      {"kind empty", edited([](json& j) { j["chunks"][0]["kind"] = ""; }),
       "chunks[0].kind \"\" is not a stored kind"},
      {"tensor", edited([](json& j) { j["chunks"][0]["tensor"] = "c"; }),
       "chunks[0].tensor \"c\" is not in tensors"},
      {"parent", edited([](json& j) { j["files"][0]["name"] = "../x"; }),
       "files[].name \"../x\" is not a plain file name"},
      {"subdirectory", edited([](json& j) { j["files"][0]["name"] = "a/b"; }),
       "files[].name \"a/b\" is not a plain file name"},
      {"absolute", edited([](json& j) { j["files"][0]["name"] = "/etc/passwd"; }),
       "is not a plain file name"},
      {"hidden", edited([](json& j) { j["files"][0]["name"] = ".hidden"; }),
       "files[].name \".hidden\" is not a plain file name"},
      {"dot", edited([](json& j) { j["files"][0]["name"] = "."; }), "is not a plain file name"},
      {"dot dot", edited([](json& j) { j["files"][0]["name"] = ".."; }),
       "is not a plain file name"},
      {"empty", edited([](json& j) { j["files"][0]["name"] = ""; }),
       "files[].name \"\" is not a plain file name"},
  });
}

TEST(Manifest, NonPositiveOrHugeDimensionsAreRefused) {
  const int64_t two40 = int64_t(1) << 40;
  expect_refused({
      {"zero", edited([](json& j) {
         j["tensors"]["w"] = {0, 3};
       }),
       "tensors.w has a dimension that is not a positive integer"},
      {"negative", edited([](json& j) { j["tensors"]["b"] = {-5}; }),
       "tensors.b has a dimension that is not a positive integer"},
      {"unsigned", edited([](json& j) { j["tensors"]["b"] = {UINT64_MAX}; }),
       "tensors.b has a dimension that is not a positive integer"},
      {"past 2^40", edited([&](json& j) { j["tensors"]["b"] = {two40 + 1}; }),
       "tensors.b has a dimension that is not a positive integer"},
      {"no dimensions", edited([](json& j) { j["tensors"]["w"] = json::array(); }),
       "tensors.w is not a shape of 1 or 2 dimensions"},
      {"three dimensions", edited([](json& j) {
         j["tensors"]["w"] = {2, 2, 3};
       }),
       "tensors.w is not a shape of 1 or 2 dimensions"},
      {"2^21 x 2^21", edited([](json& j) {
         j["tensors"]["w"] = {1 << 21, 1 << 21};
       }),
       "tensors.w has more elements than any model"},
      // 2^40 · 2^24 = 2^64: the product wraps to 0 in int64 unless checked before multiplying.
      {"2^40 x 2^24", edited([&](json& j) {
         j["tensors"]["w"] = {two40, int64_t(1) << 24};
       }),
       "tensors.w has more elements than any model"},
      {"2^40 x 2^40", edited([&](json& j) {
         j["tensors"]["w"] = {two40, two40};
       }),
       "tensors.w has more elements than any model"},
  });
}

TEST(Manifest, ModelDifferenceNamesTheFirstDifferingField) {
  const ModelConfig a = valid().model;
  EXPECT_EQ(model_difference(a, a), "");
  struct Edit {
    const char* field;
    std::function<void(ModelConfig&)> edit;
  };
  const std::vector<Edit> edits = {
      {"family", [](ModelConfig& m) { m.family = "gpt2"; }},
      {"layers", [](ModelConfig& m) { m.layers = 3; }},
      {"hidden", [](ModelConfig& m) { m.hidden = 48; }},
      {"heads", [](ModelConfig& m) { m.heads = 8; }},
      {"kv_heads", [](ModelConfig& m) { m.kv_heads = 4; }},
      {"ffn_hidden", [](ModelConfig& m) { m.ffn_hidden = 128; }},
      {"vocab", [](ModelConfig& m) { m.vocab = 96; }},
      {"seq_len", [](ModelConfig& m) { m.seq_len = 32; }},
      {"tied_embeddings", [](ModelConfig& m) { m.tied_embeddings = true; }},
      {"norm_eps", [](ModelConfig& m) { m.norm_eps = 1e-5f; }},
      {"rope_theta", [](ModelConfig& m) { m.rope_theta = 10000.0f; }},
  };
  for (size_t i = 0; i < edits.size(); ++i) {
    ModelConfig b = a;
    edits[i].edit(b);
    const std::string d = model_difference(a, b);
    EXPECT_EQ(d.rfind(std::string(edits[i].field) + " ", 0), 0u) << edits[i].field << ": " << d;
    // Every later field differing too: still the first is named.
    for (size_t k = i + 1; k < edits.size(); ++k) edits[k].edit(b);
    EXPECT_EQ(model_difference(a, b).rfind(std::string(edits[i].field) + " ", 0), 0u)
        << edits[i].field << ": " << model_difference(a, b);
  }
  ModelConfig b = a;
  b.hidden = 48;
  EXPECT_EQ(model_difference(a, b), "hidden 32 in the checkpoint, 48 here");
  // What does not change a tensor's shape or value after loading does not count.
  b = a;
  b.init_std = 0.5f, b.preset = "llama-tiny";
  EXPECT_EQ(model_difference(a, b), "");
}

}  // namespace
}  // namespace strata::ckpt
