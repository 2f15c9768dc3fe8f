// Checkpoints through the engine, one process (DESIGN.md §7; layouts are tests/reshard's): a run
// saved and loaded continues bit for bit as if never stopped (AdamW, SGD with and without
// momentum, fp16 with its dynamic loss scale, bf16); `latest` names the newest step; every kind
// of damage — a flipped byte, a truncated or missing file, a garbage or missing manifest, another
// model or optimizer, a bad `latest` — is an InputError saying what is wrong, after which the
// previous good checkpoint still loads; a save that died is ignored; a checkpoint of weights only
// starts the optimizer afresh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "strata/ckpt/manifest.h"
#include "strata/ckpt/store.h"
#include "strata/config/config.h"
#include "strata/core/check.h"
#include "strata/core/rng.h"
#include "strata/data/llmc_shard.h"
#include "strata/data/token_dataset.h"
#include "strata/train/engine.h"
#include "tests/device_host.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

// What a run did: each step's metrics and the parameters (their bytes, param dtype) after it.
struct Trace {
  std::vector<StepMetrics> steps;
  std::vector<uint8_t> params;
};

std::vector<uint8_t> params_of(const Engine& e) {
  return test::device_bytes(e.params(), e.config().param_dtype(), e.spec().numel);
}

Trace train(Engine& e, int steps) {
  Trace t;
  for (int i = 0; i < steps; ++i) t.steps.push_back(e.train_batch());
  t.params = params_of(e);
  return t;
}

// resumed's steps are want's from step `from` on, bit for bit, and so are the parameters after.
void expect_continues(const Trace& resumed, const Trace& want, size_t from) {
  ASSERT_EQ(from + resumed.steps.size(), want.steps.size());
  for (size_t i = 0; i < resumed.steps.size(); ++i) {
    const StepMetrics &a = resumed.steps[i], &b = want.steps[from + i];
    EXPECT_EQ(a.step, b.step);
    EXPECT_EQ(a.loss, b.loss) << "step " << b.step;
    // A skipped fp16 step's norm is not a number: compared bit for bit.
    EXPECT_EQ(std::bit_cast<uint64_t>(a.grad_norm), std::bit_cast<uint64_t>(b.grad_norm))
        << "step " << b.step << ": " << a.grad_norm << " vs " << b.grad_norm;
    EXPECT_EQ(a.lr, b.lr) << "step " << b.step;
    EXPECT_EQ(a.loss_scale, b.loss_scale) << "step " << b.step;
    EXPECT_EQ(a.skipped, b.skipped) << "step " << b.step;
  }
  EXPECT_TRUE(resumed.params == want.params) << "the parameters after the resumed run differ";
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << text;
}

std::string step_dir(int64_t step) {
  return ckpt::step_dir_name(step);
}

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("strata_checkpoint_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::vector<int32_t> tokens(20000);
    const uint64_t key = rng_key(7, "checkpoint_test");
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = rng_uniform(key, i) < 0.2f ? int32_t(rng_uniform(key, i + (1u << 20)) * 64) % 64
                                             : int32_t(i % 13);
    }
    data::write_llmc_shard((dir_ / "train.bin").string(), tokens, false);
    dataset_ = data::open_dataset((dir_ / "train.bin").string(), "auto");
  }
  void TearDown() override {
    dataset_.reset();
    fs::remove_all(dir_);
  }

  // AdamW with weight decay, a warmup (the learning rate follows the optimizer's steps),
  // clipping, and gradient accumulation.
  static nlohmann::json base(const std::string& preset = "gpt2-tiny") {
    return {
        {"train_batch_size", 8},
        {"train_micro_batch_size_per_gpu", 4},
        {"steps_per_print", 0},
        {"gradient_clipping", 1.0},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.1}}}}},
        {"scheduler",
         {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 5}, {"warmup_type", "linear"}}}}},
        {"model", {{"preset", preset}}}};
  }

  static nlohmann::json sgd(double momentum) {
    nlohmann::json j = base();
    j["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 0.05}, {"momentum", momentum}}}};
    return j;
  }

  std::unique_ptr<Engine> engine(const nlohmann::json& j) {
    Config cfg = parse_config(j);
    resolve_batch(cfg, 1);
    return std::make_unique<Engine>(cfg, dataset_.get());
  }

  Trace uninterrupted(const nlohmann::json& j, int steps) {
    auto e = engine(j);
    return train(*e, steps);
  }

  // Trains 3 steps and saves into root/step_3, then (by default) 3 more and saves step_6.
  fs::path checkpoints(const nlohmann::json& j, const std::string& name, bool six = true) {
    const fs::path root = dir_ / name;
    auto e = engine(j);
    train(*e, 3);
    e->save_checkpoint(root.string());
    if (six) {
      train(*e, 3);
      e->save_checkpoint(root.string());
    }
    return root;
  }

  // Saves after 3 steps, loads into a new engine, runs 3 more: as the uninterrupted 6 steps.
  // Returns the uninterrupted run.
  Trace expect_resume_continues(const nlohmann::json& j) {
    const Trace want = uninterrupted(j, 6);
    const fs::path root = dir_ / "resume";
    {
      auto first = engine(j);
      const Trace before = train(*first, 3);
      for (size_t i = 0; i < 3; ++i) EXPECT_EQ(before.steps[i].loss, want.steps[i].loss);
      first->save_checkpoint(root.string());
    }
    auto second = engine(j);
    const Engine::Resumed r = second->load_checkpoint(root.string());
    EXPECT_EQ(r.dir, (root / step_dir(3)).string());
    EXPECT_EQ(r.step, 3);
    EXPECT_EQ(r.consumed_samples, 3 * 8);
    EXPECT_EQ(r.layout, "dp 1 x tp 1 x pp 1, ZeRO 0, micro-batch 4 x 2");
    EXPECT_TRUE(r.notes.empty()) << r.notes.front();
    EXPECT_EQ(second->step(), 3);
    EXPECT_EQ(second->consumed_samples(), 3 * 8);
    expect_continues(train(*second, 3), want, 3);
    return want;
  }

  // Loads root's step 3 into e (which may have just failed a load) and continues it as the
  // uninterrupted run of base() does.
  void expect_step3_resumes(Engine& e, const fs::path& root) {
    const Trace want = uninterrupted(base(), 6);
    const Engine::Resumed r = e.load_checkpoint((root / step_dir(3)).string());
    EXPECT_EQ(r.step, 3);
    expect_continues(train(e, 3), want, 3);
  }

  fs::path dir_;
  std::unique_ptr<data::TokenDataset> dataset_;
};

// The InputError's message, or what was thrown instead.
std::string load_error(Engine& e, const fs::path& path) {
  try {
    e.load_checkpoint(path.string());
  } catch (const InputError& x) {
    return x.what();
  } catch (const std::exception& x) {
    return std::string("(not an InputError) ") + x.what();
  }
  return "(no error)";
}

void expect_mentions(const std::string& message, const std::vector<std::string>& parts) {
  for (const std::string& p : parts) {
    EXPECT_NE(message.find(p), std::string::npos) << "\"" << p << "\" not in: " << message;
  }
}

TEST_F(Checkpoint, AdamWResumesBitForBit) {
  expect_resume_continues(base("gpt2-tiny"));
  expect_resume_continues(base("llama-tiny"));
}

TEST_F(Checkpoint, SgdWithMomentumResumesBitForBit) {
  auto j = sgd(0.9);
  j["optimizer"]["params"]["nesterov"] = true;
  expect_resume_continues(j);
}

// SGD without momentum keeps no state but its step count, which the learning rate schedule
// follows: a resumed run continues its warmup (it is not a weights-only import).
TEST_F(Checkpoint, SgdWithoutMomentumResumesBitForBit) {
  const Trace want = expect_resume_continues(sgd(0.0));
  EXPECT_LT(want.steps[3].lr, 0.05f) << "the warmup should still be under way at step 4";
}

// The dynamic loss scale and the skipped steps continue: 2^23 overflows the fp16 gradients of
// some steps, and a window of 2 doubles the scale again, so the saved scale, iteration, last
// overflow and optimizer steps (fewer than the steps) all decide the resumed steps.
TEST_F(Checkpoint, Fp16ResumesWithItsLossScale) {
  auto j = base();
  j["fp16"] = {
      {"enabled", true}, {"initial_scale_power", 23}, {"hysteresis", 1}, {"loss_scale_window", 2}};
  const Trace want = expect_resume_continues(j);
  bool skipped = false, stepped = false, changes_after = false;
  for (int i = 0; i < 3; ++i) {
    skipped |= want.steps[size_t(i)].skipped;
    stepped |= !want.steps[size_t(i)].skipped;
  }
  for (int i = 3; i < 5; ++i) {
    changes_after |= want.steps[size_t(i)].loss_scale != want.steps[size_t(i) + 1].loss_scale;
  }
  EXPECT_TRUE(skipped && stepped) << "the first 3 steps should both skip and step";
  EXPECT_NE(want.steps[3].loss_scale, float(1 << 23)) << "the scale should have changed by then";
  EXPECT_TRUE(changes_after) << "the scale should change after the resume too";
}

TEST_F(Checkpoint, Bf16ResumesBitForBit) {
  auto j = base("llama-tiny");
  j["bf16"] = {{"enabled", true}};
  expect_resume_continues(j);
}

// Saving step 3 then step 6 keeps both; `latest` names step 6; a root resolves to its latest, a
// step directory to itself.
TEST_F(Checkpoint, LatestNamesTheNewestStep) {
  const fs::path root = checkpoints(base(), "ckpt");
  EXPECT_EQ(read_file(root / "latest"), step_dir(6) + "\n");
  for (int step : {3, 6}) {
    EXPECT_TRUE(fs::exists(root / step_dir(step) / "manifest.json")) << step;
    EXPECT_TRUE(fs::exists(root / step_dir(step) / ckpt::rank_file_name(0))) << step;
  }
  for (const fs::directory_entry& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    EXPECT_TRUE(name == "latest" || name == step_dir(3) || name == step_dir(6))
        << "left behind: " << name;
  }
  for (const fs::directory_entry& e : fs::directory_iterator(root / step_dir(6))) {
    EXPECT_TRUE(e.path().filename() == "manifest.json" ||
                e.path().filename() == ckpt::rank_file_name(0))
        << "left behind: " << e.path();
  }
  EXPECT_EQ(ckpt::latest_checkpoint(root.string()), (root / step_dir(6)).string());
  EXPECT_EQ(ckpt::resolve_checkpoint(root.string()), (root / step_dir(6)).string());
  EXPECT_EQ(ckpt::resolve_checkpoint((root / step_dir(3)).string()), (root / step_dir(3)).string());
  EXPECT_EQ(ckpt::latest_checkpoint((dir_ / "nothing").string()), "");
  auto e = engine(base());
  EXPECT_EQ(e->load_checkpoint(root.string()).step, 6);
  EXPECT_EQ(e->step(), 6);
  EXPECT_EQ(e->consumed_samples(), 6 * 8);
  expect_step3_resumes(*e, root);
}

// Saving a step again (a run resumed from an earlier one, here with another data order)
// replaces it, leaving nothing else behind.
TEST_F(Checkpoint, SavingAStepAgainReplacesIt) {
  const fs::path root = checkpoints(base(), "ckpt");
  std::vector<uint8_t> first;
  {
    auto f = engine(base());
    f->load_checkpoint(root.string());
    first = params_of(*f);
  }
  auto j = base();
  j["train"] = {{"seed", 99}};
  auto e = engine(j);
  const Engine::Resumed r = e->load_checkpoint((root / step_dir(3)).string());
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("train.seed 1234, this run uses 99"), std::string::npos) << r.notes[0];
  const Trace t = train(*e, 3);
  ASSERT_FALSE(t.params == first) << "the second run should differ from the first";
  e->save_checkpoint(root.string());
  auto f = engine(base());
  EXPECT_EQ(f->load_checkpoint(root.string()).step, 6);
  EXPECT_TRUE(params_of(*f) == t.params);
  size_t entries = 0;
  for ([[maybe_unused]] const fs::directory_entry& d : fs::directory_iterator(root)) ++entries;
  EXPECT_EQ(entries, 3u) << "latest, step 3 and step 6";
}

// A byte flipped inside any chunk of step 6's data file fails that chunk's checksum.
TEST_F(Checkpoint, AFlippedByteFailsItsChecksum) {
  const fs::path root = checkpoints(base(), "ckpt");
  const fs::path dir = root / step_dir(6), data = dir / ckpt::rank_file_name(0);
  const ckpt::Manifest m = ckpt::parse_manifest(read_file(dir / "manifest.json"), "manifest");
  ASSERT_GT(m.chunks.size(), 20u);
  const std::string good = read_file(data);
  auto e = engine(base());
  for (size_t c = 0; c < m.chunks.size(); ++c) {
    const ckpt::Chunk& k = m.chunks[c];
    std::string bad = good;
    bad[size_t(k.offset + 4 * k.numel / 2)] ^= 0x10;
    write_file(data, bad);
    expect_mentions(load_error(*e, root), {data.string(), "the " + k.kind + " chunk of " + k.tensor,
                                           "fails its checksum", "damaged"});
  }
  write_file(data, good);
  EXPECT_EQ(e->load_checkpoint(root.string()).step, 6);
  expect_step3_resumes(*e, root);
}

TEST_F(Checkpoint, ATruncatedDataFileIsRefused) {
  const fs::path root = checkpoints(base(), "ckpt");
  const fs::path data = root / step_dir(6) / ckpt::rank_file_name(0);
  const uintmax_t size = fs::file_size(data);
  auto e = engine(base());
  for (uintmax_t cut : {size - 1, size / 2, uintmax_t(0)}) {
    fs::resize_file(data, cut);
    expect_mentions(
        load_error(*e, root),
        {data.string(),
         "is " + std::to_string(cut) + " bytes where the manifest says " + std::to_string(size),
         "truncated"});
  }
  expect_step3_resumes(*e, root);
}

TEST_F(Checkpoint, AMissingDataFileIsRefused) {
  const fs::path root = checkpoints(base(), "ckpt");
  const fs::path data = root / step_dir(6) / ckpt::rank_file_name(0);
  fs::remove(data);
  auto e = engine(base());
  expect_mentions(load_error(*e, root), {"data file", data.string(), "is missing"});
  expect_step3_resumes(*e, root);
}

TEST_F(Checkpoint, AGarbageManifestIsRefused) {
  const fs::path root = checkpoints(base(), "ckpt");
  const fs::path manifest = root / step_dir(6) / "manifest.json";
  auto e = engine(base());
  for (const std::string& garbage :
       {std::string("\x00\x01garbage\xff", 11), std::string(), std::string(100000, '['),
        read_file(manifest).substr(0, 500)}) {
    write_file(manifest, garbage);
    const std::string error = load_error(*e, root);
    expect_mentions(error, {manifest.string(), "the JSON"});
    EXPECT_LT(error.size(), 2000u) << "the message should not quote the file at length";
  }
  expect_step3_resumes(*e, root);
}

TEST_F(Checkpoint, AMissingManifestIsRefused) {
  const fs::path root = checkpoints(base(), "ckpt");
  const fs::path dir = root / step_dir(6);
  fs::remove(dir / "manifest.json");
  auto e = engine(base());
  expect_mentions(load_error(*e, root), {"latest", dir.string(), "holds no manifest.json"});
  expect_mentions(load_error(*e, dir), {"no checkpoint at", dir.string()});
  expect_mentions(load_error(*e, dir_ / "nothing"), {"no checkpoint at"});
  expect_step3_resumes(*e, root);
}

TEST_F(Checkpoint, AnotherModelIsRefusedNamingTheField) {
  const fs::path root = checkpoints(base(), "ckpt");
  auto e = engine(base());
  struct Other {
    const char* key;
    int value;
    const char* says;
  };
  for (const Other& o : {Other{"layers", 3, "layers 3 in the checkpoint, 2 here"},
                         Other{"hidden", 48, "hidden 48 in the checkpoint, 32 here"},
                         Other{"vocab", 65, "vocab 65 in the checkpoint, 64 here"}}) {
    auto j = base();
    j["model"][o.key] = o.value;
    const fs::path other = checkpoints(j, std::string("other_") + o.key, false);
    expect_mentions(load_error(*e, other), {"holds a different model", o.says});
  }
  auto j = base();
  j["model"]["tied_embeddings"] = false;
  expect_mentions(load_error(*e, checkpoints(j, "untied", false)), {"tied_embeddings"});
  expect_step3_resumes(*e, root);
}

TEST_F(Checkpoint, AnotherOptimizersStateIsRefused) {
  const fs::path root = checkpoints(base(), "ckpt");
  const fs::path other = checkpoints(sgd(0.9), "sgd", false);
  auto e = engine(base());
  expect_mentions(load_error(*e, other),
                  {"holds sgd optimizer state", "this run's optimizer.type is adamw"});
  auto adam = base();
  adam["optimizer"]["type"] = "Adam";
  auto f = engine(adam);
  expect_mentions(load_error(*f, root),
                  {"holds adamw optimizer state", "this run's optimizer.type is adam"});
  expect_step3_resumes(*e, root);
}

// A save that died leaves a .step_N.tmp directory: latest still names the last complete step,
// which loads; the next save of that step clears it.
TEST_F(Checkpoint, AStaleTemporaryDirectoryIsIgnored) {
  const fs::path root = checkpoints(base(), "ckpt", false);
  const fs::path stale = root / ("." + step_dir(4) + ".tmp");
  fs::create_directories(stale);
  write_file(stale / ckpt::rank_file_name(0), "half a file");
  write_file(stale / (ckpt::rank_file_name(0) + ".json"), "{\"format\": 1,");
  write_file(root / "latest.tmp", "step_000");  // a `latest` being rewritten
  EXPECT_EQ(ckpt::resolve_checkpoint(root.string()), (root / step_dir(3)).string());
  auto e = engine(base());
  EXPECT_EQ(e->load_checkpoint(root.string()).step, 3);
  train(*e, 1);
  e->save_checkpoint(root.string());
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_EQ(ckpt::resolve_checkpoint(root.string()), (root / step_dir(4)).string());
  expect_step3_resumes(*e, root);
}

// A checkpoint without moments (SGD without momentum, loaded by AdamW) gives the weights, and
// the optimizer starts afresh: its learning rate schedule restarts, and the notes say so.
TEST_F(Checkpoint, WeightsOnlyStartsTheOptimizerAfresh) {
  const fs::path root = checkpoints(sgd(0.0), "sgd", false);
  std::vector<uint8_t> saved;
  {
    auto s = engine(sgd(0.0));
    s->load_checkpoint(root.string());
    saved = params_of(*s);
  }
  auto e = engine(base());
  const Engine::Resumed r = e->load_checkpoint(root.string());
  EXPECT_EQ(r.step, 3);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_EQ(r.notes[0], "the checkpoint holds weights only: the optimizer starts afresh");
  EXPECT_TRUE(params_of(*e) == saved);
  const float first_lr = uninterrupted(base(), 1).steps[0].lr;
  EXPECT_EQ(e->train_batch().lr, first_lr) << "the warmup restarts with the optimizer";
}

// A weights-only checkpoint written with the ckpt API (as an import would): every tensor's
// master values, stored in two chunks per tensor in reverse order; loading gives exactly them.
TEST_F(Checkpoint, AWeightsOnlyManifestLoads) {
  const nlohmann::json j = base("llama-tiny");
  auto e = engine(j);
  const ModelSpec& spec = e->spec();
  const fs::path dir = dir_ / "import" / step_dir(0);
  fs::create_directories(dir);
  std::vector<float> want(size_t(spec.numel), 0.0f);
  ckpt::Manifest m;
  m.model = e->config().model;
  m.optimizer = "none";
  m.seed = e->config().train.seed;
  m.layout = "an import";
  std::vector<ckpt::PendingChunk> chunks;
  for (const ParamSpec& p : spec.params) {
    m.tensors[p.name] = p.global_shape;
    float* w = want.data() + p.offset;
    rng_fill_normal(w, rng_key(11, p.name), 0, size_t(p.numel()), 0.0f, 1.0f);
    const int64_t half = p.numel() / 2;
    for (const auto& [lo, n] : {std::pair{half, p.numel() - half}, std::pair{int64_t(0), half}}) {
      if (n == 0) continue;
      ckpt::PendingChunk c;
      c.meta.kind = ckpt::kMaster, c.meta.tensor = p.name, c.meta.numel = n;
      c.meta.runs = {{lo, n, 1, 0}};
      c.data = w + lo;
      chunks.push_back(c);
    }
  }
  const std::string file = ckpt::rank_file_name(0);
  m.files = {{file, ckpt::write_rank_file((dir / file).string(), chunks)}};
  for (const ckpt::PendingChunk& c : chunks) m.chunks.push_back(c.meta);
  write_file(dir / "manifest.json", ckpt::to_json(m));
  const Engine::Resumed r = e->load_checkpoint(dir.string());
  EXPECT_EQ(r.step, 0);
  EXPECT_EQ(r.layout, "an import");
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("weights only"), std::string::npos);
  ASSERT_EQ(e->config().param_dtype(), DType::F32);
  EXPECT_EQ(test::device_f32(e->params(), DType::F32, int64_t(want.size())), want);
  EXPECT_TRUE(std::isfinite(e->train_batch().loss));
}

// Open file descriptors of this process.
size_t open_files() {
  size_t n = 0;
  for ([[maybe_unused]] const fs::directory_entry& e : fs::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

// Chunks that leave elements uncovered, overlap, store a kind for only some tensors, or one of
// Adam's moments without the other: each is refused naming what is wrong, and a refused
// checkpoint leaves no file open.
TEST_F(Checkpoint, ChunksNotCoveringEachTensorOnceAreRefused) {
  const fs::path root = checkpoints(base(), "ckpt");
  const fs::path manifest = root / step_dir(6) / "manifest.json";
  const std::string good = read_file(manifest);
  const nlohmann::json j = nlohmann::json::parse(good);
  ASSERT_EQ(j["chunks"][0]["kind"], ckpt::kMaster);
  const std::string tensor = j["chunks"][0]["tensor"];
  const int64_t n = j["chunks"][0]["numel"];
  struct Damage {
    std::function<void(nlohmann::json&)> edit;
    std::string says;
  };
  const std::vector<Damage> damages = {
      {[](nlohmann::json& m) { m["chunks"].erase(0); },
       "master is stored for " + std::to_string(j["tensors"].size() - 1) + " of the " +
           std::to_string(j["tensors"].size()) + " tensors"},
      {[](nlohmann::json& m) { m["chunks"].push_back(m["chunks"][0]); },
       "the master chunks of " + tensor + " overlap at element 0"},
      {[&](nlohmann::json& m) {
         m["chunks"][0]["numel"] = n - 1;
         m["chunks"][0]["runs"] = {{0, n - 1, 1, 0}};
       },
       "the master chunks of " + tensor + " cover " + std::to_string(n - 1) + " of its " +
           std::to_string(n) + " elements"},
      {[&](nlohmann::json& m) {
         m["chunks"][0]["numel"] = n - 1;
         m["chunks"][0]["runs"] = {{1, n - 1, 1, 0}};
       },
       "the master chunks of " + tensor + " leave elements uncovered at element 0"},
      // Adam's first moment without its second: refused when the load reaches it.
      {[](nlohmann::json& m) {
         nlohmann::json kept = nlohmann::json::array();
         for (const nlohmann::json& c : m["chunks"]) {
           if (c["kind"] != ckpt::kExpAvgSq) kept.push_back(c);
         }
         m["chunks"] = kept;
       },
       "stores no exp_avg_sq for"},
  };
  auto e = engine(base());
  const size_t files = open_files();
  for (const Damage& d : damages) {
    nlohmann::json m = j;
    d.edit(m);
    write_file(manifest, m.dump());
    for (int i = 0; i < 10; ++i) {
      expect_mentions(load_error(*e, root), {(root / step_dir(6)).string(), d.says});
    }
    EXPECT_EQ(open_files(), files) << "a refused checkpoint left its files open: " << d.says;
  }
  write_file(manifest, good);
  expect_step3_resumes(*e, root);
}

TEST_F(Checkpoint, ABadLatestIsRefused) {
  const fs::path root = checkpoints(base(), "ckpt");
  auto e = engine(base());
  for (const std::string& latest :
       {std::string("../etc\n"), std::string(""), std::string("\n\n"), std::string(".hidden"),
        std::string("/etc"), std::string("step_00000006/../../x")}) {
    write_file(root / "latest", latest);
    expect_mentions(load_error(*e, root),
                    {root.string(), "latest", "does not name a step directory"});
  }
  write_file(root / "latest", "step_00000099\n");
  expect_mentions(load_error(*e, root),
                  {(root / "step_00000099").string(), "holds no manifest.json"});
  write_file(root / "latest", std::string(10000, 'x'));
  expect_mentions(load_error(*e, root), {"latest"});
  expect_step3_resumes(*e, root);
}

}  // namespace
}  // namespace strata
