// The core invariant for tensor and sequence parallelism (DESIGN.md §1): every tp × dp × ZeRO
// stage × sequence-parallel layout gives the single-process losses, and each tensor-parallel
// layer's forward (the logits) and backward (every parameter's gradient) equal the serial ones.
// Runs under mpirun with 2, 4 and 8 ranks (tests/CMakeLists.txt); one rank computes each
// single-process reference once and shares it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/comm/topology.h"
#include "strata/config/config.h"
#include "strata/core/dtype.h"
#include "strata/core/rng.h"
#include "strata/cost/predict.h"
#include "strata/data/llmc_shard.h"
#include "strata/data/token_dataset.h"
#include "strata/train/engine.h"
#include "tests/device_host.h"
#include "tests/mpi_world.h"

namespace strata {
namespace {

using test::world_rank;
using test::world_size;

constexpr int kSteps = 20;
constexpr int kGlobalBatch = 32;
constexpr int kVocab = 1001;  // padded to 1002 at tp 2 and 1004 at tp 4

class TensorParallel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    path_ = test::shared_temp_path("strata_tp_", ".bin");
    std::vector<int32_t> tokens(40000);
    const uint64_t key = rng_key(5, "tp_test");
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = rng_uniform(key, i) < 0.3f
                      ? int32_t(rng_uniform(key, i + (1u << 24)) * (kVocab - 1)) % (kVocab - 1)
                      : int32_t((i * 37) % 997);
    }
    if (world_rank() == 0) data::write_llmc_shard(path_, tokens, false);
    MPI_Barrier(MPI_COMM_WORLD);
    dataset_ = data::open_dataset(path_, "llmc");
  }
  static void TearDownTestSuite() {
    dataset_.reset();
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::filesystem::remove(path_);
  }

  static nlohmann::json config(const std::string& preset) {
    return {
        {"train_batch_size", kGlobalBatch},
        {"steps_per_print", 0},
        {"gradient_clipping", 1.0},
        {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.1}}}}},
        {"scheduler",
         {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 5}, {"warmup_type", "linear"}}}}},
        {"model", {{"preset", preset}, {"vocab", kVocab}}}};
  }

  // Collective: the losses of kSteps steps on one process, computed once per config by one rank
  // and shared (test::shared_out), the others waiting asleep. norms, when given: each step's
  // global gradient norm.
  static std::vector<double> serial_losses(const nlohmann::json& j,
                                           std::vector<double>* norms = nullptr) {
    const std::string key = j.dump();
    auto it = serial_runs_.find(key);
    if (it == serial_runs_.end()) {
      const auto shared = test::shared_out(1, 2 * kSteps, [&](size_t) {
        std::vector<double> n, v = run_serial(j, &n);
        v.insert(v.end(), n.begin(), n.end());
        return v;
      });
      it = serial_runs_.emplace(key, shared[0]).first;
    }
    const std::vector<double>& v = it->second;
    if (norms) norms->assign(v.begin() + kSteps, v.end());
    return {v.begin(), v.begin() + kSteps};
  }
  static std::vector<double> run_serial(nlohmann::json j, std::vector<double>* norms) {
    j["train_micro_batch_size_per_gpu"] = kGlobalBatch;
    Config cfg = parse_config(j);
    resolve_batch(cfg, 1);
    Engine engine(cfg, dataset_.get());
    std::vector<double> out;
    for (int i = 0; i < kSteps; ++i) {
      const StepMetrics m = engine.train_batch();
      out.push_back(m.loss);
      if (norms) norms->push_back(m.grad_norm);
    }
    return out;
  }

  static std::vector<double> losses(nlohmann::json j, int tp, int gas,
                                    std::vector<double>* norms = nullptr) {
    const bool sp = j.contains("sp") && j["sp"].get<bool>();
    j.erase("sp");
    j["parallelism"] = {{"tensor", tp}, {"sequence_parallel", sp}};
    const comm::RankGrid grid(world_size(), tp, 1);
    comm::ProcessGroups groups(grid, MPI_COMM_WORLD);
    j["train_micro_batch_size_per_gpu"] = kGlobalBatch / (grid.dp() * gas);
    j["gradient_accumulation_steps"] = gas;
    Config cfg = parse_config(j);
    resolve_batch(cfg, grid.dp());
    Engine engine(cfg, dataset_.get(), &groups.dp(), &groups.tp());
    // The tensor-parallel traffic is the formula's, byte for byte.
    const uint64_t predicted = cost::predict_tp_bytes(cost::layout_of(cfg), engine.spec());
    std::vector<double> out;
    for (int i = 0; i < kSteps; ++i) {
      const StepMetrics m = engine.train_batch();
      EXPECT_EQ(m.tp_bytes, predicted) << j.dump() << " step " << i;
      out.push_back(m.loss);
      if (norms) norms->push_back(m.grad_norm);
    }
    return out;
  }

  static std::string path_;
  static std::unique_ptr<data::TokenDataset> dataset_;
  static std::map<std::string, std::vector<double>> serial_runs_;  // losses, then norms
};

std::string TensorParallel::path_;
std::unique_ptr<data::TokenDataset> TensorParallel::dataset_;
std::map<std::string, std::vector<double>> TensorParallel::serial_runs_;

std::vector<int> tp_sizes() {
  std::vector<int> out;
  for (int tp : {2, 4}) {
    if (world_size() % tp == 0) out.push_back(tp);
  }
  return out;
}

// GPT-2 (tied embeddings, MHA) and Llama with GQA (kv_heads 2: split at tp 2, replicated at
// tp 4), untied: every tp × sequence parallelism × ZeRO stage, dp = the rest of the world.
TEST_F(TensorParallel, EveryLayoutGivesTheSingleProcessLosses) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    std::vector<double> ref_norms;
    const std::vector<double> ref = serial_losses(config(preset), &ref_norms);
    EXPECT_LT(ref.back(), ref.front());
    for (int tp : tp_sizes()) {
      for (bool sp : {false, true}) {
        for (int stage : {0, 1, 2, 3}) {
          const int gas = stage == 1 ? 2 : 1;
          auto j = config(preset);
          j["sp"] = sp;
          j["zero_optimization"] = {{"stage", stage}, {"stage3_param_persistence_threshold", 0}};
          std::vector<double> norms;
          const std::vector<double> got = losses(j, tp, gas, &norms);
          for (int s = 0; s < kSteps; ++s) {
            EXPECT_NEAR(got[size_t(s)], ref[size_t(s)], 1e-5 * ref[size_t(s)])
                << preset << " tp=" << tp << " dp=" << world_size() / tp << " sp=" << sp
                << " zero=" << stage << " gas=" << gas << " step " << s;
            // The global norm counts every replicated parameter once (it also sets clipping).
            EXPECT_NEAR(norms[size_t(s)], ref_norms[size_t(s)], 1e-5 * ref_norms[size_t(s)])
                << preset << " tp=" << tp << " sp=" << sp << " zero=" << stage
                << " grad norm, step " << s;
          }
        }
      }
    }
  }
}

// bf16: the tensor-parallel sums (all-reduces in bf16, partial products per rank) round in a
// different order than one process; as for data parallelism (dp_equivalence_test.cc), the
// losses stay within 1e-3 relative over 20 steps.
TEST_F(TensorParallel, Bf16StaysCloseToTheSingleProcessLosses) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    auto j = config(preset);
    j["bf16"] = {{"enabled", true}};
    const std::vector<double> ref = serial_losses(j);
    double worst = 0.0;
    for (int tp : tp_sizes()) {
      for (bool sp : {false, true}) {
        auto k = j;
        k["sp"] = sp;
        k["zero_optimization"] = {{"stage", 2}};
        const std::vector<double> got = losses(k, tp, 1);
        for (int s = 0; s < kSteps; ++s) {
          const double rel = std::abs(got[size_t(s)] - ref[size_t(s)]) / ref[size_t(s)];
          worst = std::max(worst, rel);
          EXPECT_LT(rel, 1e-3) << preset << " bf16 tp=" << tp << " sp=" << sp << " step " << s;
        }
      }
    }
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
      std::printf("%s bf16 tensor parallel: worst relative loss difference %.2e\n", preset, worst);
    }
  }
}

// MiCS (hierarchical ZeRO) beside tensor parallelism: ZeRO shards each tensor-parallel rank's
// own flat buffer over groups of 2 data-parallel ranks, replicated across the groups.
TEST_F(TensorParallel, MicsShardsBesideTensorParallelism) {
  const int tp = 2, dp = world_size() / tp;
  if (dp < 4) GTEST_SKIP() << "needs 8 ranks (tp 2 x dp 4)";
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    const std::vector<double> ref = serial_losses(config(preset));
    for (int stage : {1, 3}) {
      auto j = config(preset);
      j["sp"] = true;
      j["zero_optimization"] = {{"stage", stage}, {"mics_shard_size", 2}};
      const std::vector<double> got = losses(j, tp, 1);
      for (int s = 0; s < kSteps; ++s) {
        EXPECT_NEAR(got[size_t(s)], ref[size_t(s)], 1e-5 * ref[size_t(s)])
            << preset << " MiCS stage " << stage << " step " << s;
      }
    }
  }
}

// One forward and backward at tp (no ZeRO, dp = 1 per tp group): this rank's logit columns
// and every slice of every parameter's gradient equal the serial model's at the same global
// indices (fp32, 1e-5 of the tensor's largest magnitude): the column-, row- and
// vocabulary-parallel layers, the vocabulary-parallel cross-entropy, and the replicated norms.
TEST_F(TensorParallel, EachParallelLayerMatchesTheSerialLayer) {
  // (also: the input- and weight-gradient halves run apart give the fused backward's bits)
  // B = 1: under sequence parallelism a rank's rows then start inside a sequence (position
  // offsets); B = 4: several sequences per rank.
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    for (int tp : tp_sizes()) {
      for (auto [sp, B] : {std::pair{false, 4}, {true, 4}, {true, 1}}) {
        SCOPED_TRACE("micro-batch " + std::to_string(B));
        auto j = config(preset);
        j["train_micro_batch_size_per_gpu"] = B;
        j["train_batch_size"] = B;
        Config serial_cfg = parse_config(j);
        resolve_batch(serial_cfg, 1);
        Engine serial(serial_cfg, nullptr);
        const int T = serial_cfg.model.seq_len, N = B * T;
        std::vector<int32_t> in, tg;
        for (int i = 0; i < N; ++i) {
          in.push_back((i * 131 + 7) % kVocab);
          tg.push_back((i * 29 + 3) % kVocab);
        }
        tg[5] = -1;  // an ignored target
        // Serial logits (eval forward) and gradients.
        serial.model().forward(in.data(), tg.data(), 1.0f, false);
        const std::vector<float> ref_logits =
            test::device_f32(serial.model().logits(0).data, DType::F32, int64_t(N) * kVocab);
        const double ref_loss = serial.forward_backward(in.data(), tg.data());

        // tp ranks in groups of consecutive world ranks; every group runs the same batch.
        const comm::RankGrid grid(world_size(), tp, 1);
        comm::ProcessGroups groups(grid, MPI_COMM_WORLD);
        auto k = j;
        k["parallelism"] = {{"tensor", tp}, {"sequence_parallel", sp}};
        Config cfg = parse_config(k);
        resolve_batch(cfg, 1);  // every tensor-parallel group runs the same micro-batch
        Engine engine(cfg, nullptr, nullptr, &groups.tp());
        const ModelSpec& spec = engine.spec();
        engine.model().forward(in.data(), tg.data(), 1.0f, false);
        const Tensor lt = engine.model().logits(0);
        const std::vector<float> logits_host = test::device_f32(lt.data, DType::F32, lt.numel());
        const float* logits = logits_host.data();
        double lmax = 0, ldiff = 0;
        for (int n = 0; n < N; ++n) {
          for (int64_t v = 0; v < spec.tp.vocab_valid; ++v) {
            const double r = ref_logits[size_t(n) * kVocab + size_t(spec.tp.vocab_begin + v)];
            lmax = std::max(lmax, std::fabs(r));
            ldiff = std::max(ldiff, std::fabs(r - logits[size_t(n * spec.tp.vocab_rows + v)]));
          }
        }
        EXPECT_LE(ldiff, 1e-5 * lmax) << preset << " tp=" << tp << " sp=" << sp << " logits";
        const double loss = engine.forward_backward(in.data(), tg.data());
        EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss) << preset << " tp=" << tp << " sp=" << sp;
        {  // The weight gradients deferred (backward split in two) give the same bits.
          comm::Communicator* kv = nullptr;
          std::unique_ptr<comm::Communicator> kv_comm;
          if (spec.tp.kv_replicated) {
            const int share = tp / cfg.model.kv_heads;
            kv_comm = groups.tp().split(groups.tp().rank() / share, groups.tp().rank(), "tp-kv");
            kv = kv_comm.get();
          }
          tp::Group group(&groups.tp(), kv, sp);
          std::vector<float> deferred(size_t(spec.numel), 0.0f);
          auto model =
              make_transformer(spec, DType::F32, DType::F32, const_cast<void*>(engine.params()),
                               deferred.data(), B, T, ChunkOptions{0, -1, 1, true}, &group);
          model->forward(0, in.data(), Tensor(), tg.data(), 1.0f / float(N), true);
          model->backward_input(0, Tensor());
          model->backward_weight(0);
          EXPECT_EQ(deferred, test::device_f32(engine.grads(), DType::F32, spec.numel))
              << preset << " tp=" << tp << " sp=" << sp << ": deferred weight gradients differ";
        }
        const std::vector<float> gv = test::device_f32(engine.grads(), DType::F32, spec.numel);
        const std::vector<float> rgv =
            test::device_f32(serial.grads(), DType::F32, serial.spec().numel);
        const float* g = gv.data();
        const float* rg = rgv.data();
        for (size_t i = 0; i < spec.params.size(); ++i) {
          const ParamSpec& p = spec.params[i];
          const ParamSpec& sp_ = serial.spec().params[i];
          const int64_t gcols = p.global_shape.size() > 1 ? p.global_shape[1] : 1;
          const int64_t lcols = p.shape.size() > 1 ? p.shape[1] : 1;
          std::vector<int64_t> map;
          for (const TpRange& r : p.ranges) {
            for (int64_t x = 0; x < r.count; ++x) map.push_back(r.begin + x);
          }
          double gmax = 0, worst = 0;
          for (int64_t x = 0; x < sp_.numel(); ++x)
            gmax = std::max(gmax, double(std::fabs(rg[sp_.offset + x])));
          for (int64_t lr = 0; lr < p.shape[0]; ++lr) {
            for (int64_t lc = 0; lc < lcols; ++lc) {
              int64_t gr = lr, gc = lc;
              if (p.split_axis == 0) {
                if (lr >= int64_t(map.size())) {  // vocabulary padding: never trained
                  EXPECT_EQ(g[p.offset + lr * lcols + lc], 0.0f) << p.name << " padding row";
                  continue;
                }
                gr = map[size_t(lr)];
              } else if (p.split_axis == 1) {
                gc = map[size_t(lc)];
              }
              const double want = rg[sp_.offset + gr * gcols + gc];
              const double got = g[p.offset + lr * lcols + lc];
              worst = std::max(worst, std::fabs(want - got));
            }
          }
          EXPECT_LE(worst, 1e-5 * gmax + 1e-9)
              << preset << " tp=" << tp << " sp=" << sp << " " << p.name << ": max |Δgrad| "
              << worst << " of max " << gmax;
        }
      }
    }
  }
}

}  // namespace
}  // namespace strata
