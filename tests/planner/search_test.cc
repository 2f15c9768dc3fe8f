// The planner's search without MPI: what it enumerates, how fast, the device profiles, the
// configs it writes, and plans at scale that must come out the way the published runs were laid
// out (tensor parallelism inside a node, no layout that does not fit).
#include "strata/planner/search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "strata/config/config.h"
#include "strata/core/check.h"
#include "strata/cost/device_profile.h"
#include "tests/temp_dir_test.h"

namespace strata {
namespace {

planner::PlanInput input(const nlohmann::json& model, int batch, int devices, int per_node,
                         const std::string& device) {
  planner::PlanInput in;
  in.base = {{"train_batch_size", batch},
             {"bf16", {{"enabled", true}}},
             {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}},
             {"model", model}};
  in.cluster = planner::uniform_cluster(devices, per_node);
  in.device = cost::load_profile(device, "/nonexistent");
  return in;
}

TEST(PlannerSearch, EveryCandidateCoversTheClusterAndTheBatch) {
  const planner::PlanInput in = input({{"preset", "gpt2-tiny"}, {"layers", 4}}, 16, 8, 8, "h100");
  const std::vector<planner::Candidate> all = planner::enumerate(in);
  ASSERT_GT(all.size(), 1000u);
  for (const planner::Candidate& c : all) {
    EXPECT_EQ(c.dp * c.cp * c.tp * c.pp, 8) << planner::describe(c);
    EXPECT_EQ(c.micro_batch * c.accumulation * c.dp, 16) << planner::describe(c);
    if (!planner::evaluate(in, c).valid()) continue;
    Config cfg = parse_config(planner::candidate_config(in.base, c));
    resolve_batch(cfg, c.dp);
    EXPECT_EQ(cfg.parallelism.tensor, c.tp);
    EXPECT_EQ(cfg.parallelism.pipeline, c.pp);
    EXPECT_EQ(cfg.zero.stage, c.zero);
    EXPECT_EQ(cfg.train_micro_batch_size_per_gpu, c.micro_batch);
  }
}

// ZeRO-3 composes with every pipeline schedule: those layouts are valid, and keeping units for
// the step (stage3_reshard_after_forward false) gathers each once per step instead of once per
// pass and micro-batch, for more memory.
TEST(PlannerSearch, ZeroStage3IsPlannedUnderEveryPipelineSchedule) {
  planner::PlanInput in = input({{"preset", "gpt2-tiny"}, {"layers", 4}}, 16, 8, 8, "h100");
  in.base["zero_optimization"] = {{"stage3_param_persistence_threshold", 0},
                                  {"stage3_prefetch_bucket_size", 1}};
  std::vector<std::string> schedules;
  const planner::Candidate* probe = nullptr;
  const std::vector<planner::Row> rows = planner::plan(in);
  for (const planner::Row& r : rows) {
    if (!r.valid() || r.c.zero != 3 || r.c.pp < 2) continue;
    if (std::find(schedules.begin(), schedules.end(), r.c.schedule) == schedules.end()) {
      schedules.push_back(r.c.schedule);
    }
    if (probe == nullptr && r.c.accumulation > 1 && r.c.recompute == "none") probe = &r.c;
  }
  EXPECT_EQ(schedules.size(), 4u) << "gpipe, 1f1b, interleaved, zero_bubble";
  ASSERT_NE(probe, nullptr);
  const planner::Row resharded = planner::evaluate(in, *probe);
  in.base["zero_optimization"]["stage3_reshard_after_forward"] = false;
  const planner::Row kept = planner::evaluate(in, *probe);
  ASSERT_TRUE(resharded.valid() && kept.valid());
  EXPECT_EQ(resharded.p.gathers, kept.p.gathers * 2.0 * double(probe->accumulation));
  EXPECT_GT(kept.p.stage_bytes[0][size_t(MemCategory::Params)],
            resharded.p.stage_bytes[0][size_t(MemCategory::Params)]);
}

// Context parallelism is a fourth axis on the CPU (the CUDA backend refuses it): both
// implementations are enumerated, written into the config, and halve a rank's activations at cp 2
// for the price of their exchanges.
TEST(PlannerSearch, ContextParallelismIsPlannedOnTheCpu) {
  auto cpu = [](int devices) {
    planner::PlanInput in = input({{"preset", "llama-tiny"}, {"layers", 4}, {"seq_len", 256}}, 1,
                                  devices, devices, "h100");
    in.device.name = "cpu", in.device.gpu = false, in.device.cores = devices;
    in.device.memory_bytes = in.device.host_memory_bytes = 1ull << 40;
    return in;
  };
  const planner::PlanInput one = cpu(1), two = cpu(2);
  std::vector<std::string> impls;
  const planner::Row* ring = nullptr;
  const std::vector<planner::Row> rows = planner::plan(two);
  for (const planner::Row& r : rows) {
    if (!r.valid() || r.c.cp == 1) continue;
    EXPECT_EQ(r.c.dp * r.c.cp * r.c.tp * r.c.pp, 2);
    if (std::find(impls.begin(), impls.end(), r.c.context_impl) == impls.end()) {
      impls.push_back(r.c.context_impl);
    }
    if (ring == nullptr && r.c.context_impl == "ring" && r.c.recompute == "none" && r.c.zero == 0) {
      ring = &r;
    }
  }
  EXPECT_EQ(impls.size(), 2u) << "ulysses and ring";
  ASSERT_NE(ring, nullptr);
  EXPECT_NE(planner::describe(ring->c).find("cp2/ring"), std::string::npos);
  const Config cfg = parse_config(planner::candidate_config(two.base, ring->c));
  EXPECT_EQ(cfg.parallelism.context, 2);
  EXPECT_EQ(cfg.parallelism.context_impl, "ring");
  EXPECT_GT(ring->p.cp_comm_s, 0.0);
  // The same layout on one process: twice the activations.
  planner::Candidate whole = ring->c;
  whole.cp = 1;
  const planner::Row alone = planner::evaluate(one, whole);
  ASSERT_TRUE(alone.valid()) << alone.reason;
  const double acts = double(ring->p.bytes[size_t(MemCategory::Activations)]);
  const double acts1 = double(alone.p.bytes[size_t(MemCategory::Activations)]);
  EXPECT_LT(acts, 0.6 * acts1);
  EXPECT_GT(acts, 0.4 * acts1);
  EXPECT_GT(ring->p.collectives, alone.p.collectives);
  // On a GPU there is none.
  for (const planner::Candidate& c :
       planner::enumerate(input({{"preset", "gpt2-tiny"}}, 4, 4, 4, "h100"))) {
    EXPECT_EQ(c.cp, 1) << planner::describe(c);
  }
}

// Four CPU ranks on two cores: each op is timed at a core's speed and the step is at least the
// node's busy core-seconds over its cores. Data parallelism keeps every rank busy: that bound
// sets the step, each rank's work at half a core. One micro-batch through four stages runs them
// one after another, a core each while the other waits: the critical path sets the step, near
// the whole model's work on one core (plus the stages' sends), where charging
// each stage at half a core would double it.
TEST(PlannerSearch, RanksOutnumberingTheCoresShareThem) {
  auto cpu = [](int ranks, int cores) {
    planner::PlanInput in = input({{"preset", "llama-tiny"},
                                   {"layers", 4},
                                   {"seq_len", 256},
                                   {"hidden", 256},
                                   {"ffn_hidden", 512}},
                                  4, ranks, ranks, "h100");
    in.device.name = "cpu", in.device.gpu = false, in.device.cores = cores;
    in.device.threads_per_rank = 1,
    in.device.memory_bytes = in.device.host_memory_bytes = 1ull << 40;
    in.device.op_overhead_s = 3e-7;  // a CPU's kernel call and shared-memory link, not a GPU's
    in.device.intra_node = in.device.inter_node = {3e-7, 1e12};  // sends all but free
    return in;
  };
  planner::Candidate dp, pp, one, pipe;
  dp.dp = 4, dp.micro_batch = 1;
  pp.pp = 4, pp.micro_batch = 4, pp.schedule = "gpipe";
  one.micro_batch = 4;
  pipe.pp = 4, pipe.micro_batch = 1, pipe.accumulation = 4, pipe.schedule = "1f1b";
  const planner::Row a = planner::evaluate(cpu(4, 2), dp), b = planner::evaluate(cpu(4, 2), pp);
  const planner::Row alone = planner::evaluate(cpu(1, 1), one);
  const planner::Row shared = planner::evaluate(cpu(4, 2), pipe);
  const planner::Row own = planner::evaluate(cpu(4, 4), pipe);  // a core each
  ASSERT_TRUE(a.valid() && b.valid() && alone.valid() && shared.valid() && own.valid())
      << a.reason << b.reason << alone.reason << shared.reason << own.reason;
  EXPECT_GT(a.p.cores_bound_s, 0.0);
  // Four replicas, two on each core, all busy throughout: the node's busy time per core.
  EXPECT_NEAR(a.p.model_step_s, a.p.cores_bound_s, 1e-9 * a.p.cores_bound_s);
  // A four-stage pipeline of four micro-batches on two cores: its warm-up and cool-down leave a
  // core idle, so the simulated step exceeds the busy time per core.
  EXPECT_GT(shared.p.model_step_s, 1.05 * shared.p.cores_bound_s)
      << planner::explain(cpu(4, 2), shared);
  EXPECT_EQ(own.p.cores_bound_s, 0.0);
  // Busy: compute and optimizer (the columns, at half a core) and the reductions' copies and sums.
  EXPECT_GT(a.p.dp_comm_s, 0.0);
  EXPECT_NEAR(a.p.cores_bound_s, a.p.compute_s + a.p.optimizer_s + 2 * a.p.dp_comm_s,
              1e-9 * a.p.cores_bound_s);
  EXPECT_EQ(alone.p.cores_bound_s, 0.0);  // no more ranks than cores: no bound
  // One micro-batch through four stages runs one rank at a time (then the four optimizer steps,
  // two to a core): about one rank's step, not four ranks' work shared.
  EXPECT_GT(b.p.model_step_s, 1.5 * b.p.cores_bound_s);
  EXPECT_GT(b.p.model_step_s, 0.8 * alone.p.model_step_s);
  EXPECT_LT(b.p.model_step_s, 1.4 * alone.p.model_step_s)
      << planner::explain(cpu(4, 2), b) << planner::explain(cpu(1, 1), alone);
  EXPECT_NE(planner::explain(cpu(4, 2), a).find("ranks outnumber the cores"), std::string::npos);
  // On shared cores two replicas of a two-stage pipeline keep both cores busy under any schedule:
  // 1F1B and GPipe take the same step, and the plan ranks such ties by memory.
  planner::Candidate one_f = dp, g = dp;
  one_f.pp = 2, one_f.dp = 2, one_f.accumulation = 2, one_f.schedule = "1f1b";
  g.pp = 2, g.dp = 2, g.accumulation = 2, g.schedule = "gpipe";
  EXPECT_EQ(float(planner::evaluate(cpu(4, 2), one_f).p.step_s),
            float(planner::evaluate(cpu(4, 2), g).p.step_s));
  const std::vector<planner::Row> rows = planner::plan(cpu(4, 2));
  int ties = 0;
  for (size_t i = 1; i < rows.size() && rows[i].valid(); ++i) {
    if (float(rows[i].p.step_s) != float(rows[i - 1].p.step_s)) continue;
    ++ties;
    EXPECT_GE(rows[i].p.device_bytes, rows[i - 1].p.device_bytes) << i;
  }
  EXPECT_GT(ties, 0);
}

// Zero-bubble's deferred weight pass stashes each linear's output gradient and reads it and the
// input back: the same layout's compute costs more than under 1F1B (its bubble is smaller).
TEST(PlannerSearch, ZeroBubblePaysForItsDeferredWeightPass) {
  const planner::PlanInput in = input({{"preset", "gpt2-124M"}}, 32, 4, 4, "h100");
  planner::Candidate c;
  c.pp = 4, c.micro_batch = 2, c.accumulation = 16, c.schedule = "1f1b";
  const planner::Row one = planner::evaluate(in, c);
  c.schedule = "zero_bubble";
  const planner::Row zb = planner::evaluate(in, c);
  ASSERT_TRUE(one.valid() && zb.valid()) << one.reason << zb.reason;
  EXPECT_GT(zb.p.compute_s, 1.01 * one.p.compute_s);
  EXPECT_LT(zb.p.compute_s, 1.5 * one.p.compute_s);
  EXPECT_LT(zb.p.bubble_fraction, one.p.bubble_fraction);
}

// ZeRO over a data-parallel group of one still reduces through a one-rank reduce-scatter (the
// gradients converted to the wire, MPI's copy, back through scratch): stage 1 once a step,
// stage 2 on every micro-batch and more (the unit buffer zeroed, the result added into the
// partition). Without ZeRO nothing is reduced.
TEST(PlannerSearch, ZeroOverAGroupOfOneStillReduces) {
  const planner::PlanInput in = input({{"preset", "gpt2-124M"}}, 8, 4, 4, "h100");
  planner::Candidate c;  // on 4 ranks (tp 2, pp 2): a data-parallel group of one
  c.tp = 2, c.pp = 2, c.micro_batch = 2, c.accumulation = 4, c.schedule = "1f1b";
  planner::Row z[3];
  for (int stage = 0; stage < 3; ++stage) {
    c.zero = stage;
    z[stage] = planner::evaluate(in, c);
    ASSERT_TRUE(z[stage].valid()) << z[stage].reason;
  }
  EXPECT_EQ(z[0].p.dp_comm_s, 0.0);
  EXPECT_GT(z[1].p.dp_comm_s, 0.0);
  EXPECT_EQ(z[1].p.dp_exposed_s, z[1].p.dp_comm_s);  // the rank's own work: never hidden
  EXPECT_GT(z[1].p.step_s, z[0].p.step_s);
  EXPECT_GT(z[2].p.dp_comm_s, 4.0 * z[1].p.dp_comm_s);  // four micro-batches, and more each
}

TEST(PlannerSearch, TenThousandLayoutsInUnderTwoSeconds) {
  const planner::PlanInput in = input({{"preset", "gpt2-124M"}}, 1024, 64, 8, "h100");
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<planner::Row> rows = planner::plan(in);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(rows.size(), 10000u);
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << rows.size() << " layouts in " << s << " s (not timed under the sanitizers)";
#else
  EXPECT_LT(s, 2.0) << rows.size() << " layouts";
#endif
}

// Valid rows first, by predicted step time; every refused row has a reason; the first row's
// time adds up from its parts.
TEST(PlannerSearch, RowsAreRankedAndTheirPartsAddUp) {
  const planner::PlanInput in = input({{"preset", "gpt2-124M"}}, 64, 16, 8, "h100");
  const std::vector<planner::Row> rows = planner::plan(in);
  bool refused_seen = false;
  for (size_t i = 0; i < rows.size(); ++i) {
    // Equal predicted steps rank by memory.
    if (i > 0 && rows[i].valid() && float(rows[i].p.step_s) == float(rows[i - 1].p.step_s)) {
      EXPECT_GE(rows[i].p.device_bytes, rows[i - 1].p.device_bytes) << i;
    }
    if (!rows[i].valid()) {
      refused_seen = true;
      EXPECT_FALSE(rows[i].reason.empty());
      continue;
    }
    EXPECT_FALSE(refused_seen) << "a valid row after a refused one";
    if (i > 0 && rows[i - 1].valid()) {
      EXPECT_LE(float(rows[i - 1].p.step_s), float(rows[i].p.step_s));
    }
  }
  const planner::Prediction& p = rows.front().p;
  EXPECT_NEAR(p.step_s, p.compute_s + p.tp_comm_s + p.bubble_s + p.dp_exposed_s + p.optimizer_s,
              1e-9 * p.step_s + 1e-12);
  EXPECT_GT(p.mfu, 0.0);
  EXPECT_LT(p.mfu, 1.0);
  const std::string text = planner::explain(in, rows.front());
  EXPECT_NE(text.find("optimizer_state"), std::string::npos) << text;
  EXPECT_NE(text.find("step "), std::string::npos) << text;
}

// GPT-3 175B (96 layers, hidden 12288, 96 heads, T 2048) on 1024 A100s with a batch of 1536:
// the published runs (Megatron-LM, arXiv 2104.04473) use tp 8 inside a node and a pipeline;
// nothing without model parallelism fits 80 GB.
TEST(PlannerSearch, Gpt3OnA100sKeepsTensorParallelismInANode) {
  const nlohmann::json gpt3 = {{"family", "gpt2"}, {"layers", 96},   {"hidden", 12288},
                               {"heads", 96},      {"vocab", 51200}, {"seq_len", 2048}};
  const planner::PlanInput in = input(gpt3, 1536, 1024, 8, "a100");
  const std::vector<planner::Row> rows = planner::plan(in);
  ASSERT_FALSE(rows.empty());
  ASSERT_TRUE(rows.front().valid()) << rows.front().reason;
  const planner::Candidate& best = rows.front().c;
  EXPECT_LE(best.tp, 8);
  EXPECT_GT(best.tp * best.pp, 1) << planner::describe(best);
  for (const planner::Row& r : rows) {
    if (r.c.tp == 1 && r.c.pp == 1 && r.c.zero < 3) {
      EXPECT_FALSE(r.valid()) << planner::describe(r.c) << " cannot fit 80 GB";
    }
    if (r.c.tp > 8) {
      EXPECT_FALSE(r.valid()) << planner::describe(r.c);
    }
  }
  EXPECT_GT(rows.front().p.mfu, 0.2);
  EXPECT_LT(rows.front().p.mfu, 0.8);
}

class PlannerProfiles : public test::TempDirTest {};

TEST_F(PlannerProfiles, BuiltInsAndFiles) {
  for (const std::string& name : cost::builtin_profile_names()) {
    const cost::DeviceProfile p = cost::load_profile(name, "/nonexistent");
    EXPECT_TRUE(p.gpu);
    EXPECT_GT(p.bf16_flops, p.fp32_flops);
    EXPECT_NE(p.source.find("datasheet"), std::string::npos) << p.source;
  }
  const std::string dir = dir_.string();
  cost::DeviceProfile p = cost::load_profile("h200", "/nonexistent");
  p.name = "mine";
  p.elementwise_bytes_per_s = {{"gpt2", 9e9}, {"llama", 6e9}};
  p.attention_flops = {{512, 1.5e11}, {128, 1e11}};
  cost::write_profile(p, dir + "/p.json");
  const cost::DeviceProfile q = cost::load_profile(dir + "/p.json", "/nonexistent");
  EXPECT_EQ(q.name, "mine");
  EXPECT_EQ(q.memory_bytes, p.memory_bytes);
  EXPECT_DOUBLE_EQ(q.bf16_flops, p.bf16_flops);
  EXPECT_EQ(q.gemm_efficiency.size(), p.gemm_efficiency.size());
  // The kernels' own rates: elementwise by family, attention by sequence length (sorted; log-T
  // interpolation between, the end points' rates beyond).
  ASSERT_EQ(q.elementwise_bytes_per_s.size(), 2u);
  EXPECT_DOUBLE_EQ(q.elementwise_seconds(9e9, "gpt2"), 1.0);
  EXPECT_DOUBLE_EQ(q.elementwise_seconds(6e9, "llama"), 1.0);
  EXPECT_DOUBLE_EQ(q.elementwise_seconds(1e9, "other"), q.memory_seconds(1e9));
  ASSERT_EQ(q.attention_flops.size(), 2u);
  EXPECT_DOUBLE_EQ(q.attention_flops.front().first, 128);
  EXPECT_DOUBLE_EQ(q.attention_seconds(1e11, 64, DType::BF16), 1.0);
  EXPECT_DOUBLE_EQ(q.attention_seconds(1.5e11, 4096, DType::BF16), 1.0);
  EXPECT_DOUBLE_EQ(q.attention_seconds(1.25e11, 256, DType::BF16), 1.0);  // halfway in log T
  // A machine never calibrated, a name that is not a device, a file that is not a profile.
  auto message = [](const std::string& name, const std::string& calib) {
    try {
      cost::load_profile(name, calib);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message("cpu", dir + "/none.json").find("strata bench --calibrate"), std::string::npos);
  EXPECT_NE(message("h300", "").find("unknown --device \"h300\""), std::string::npos);
  std::ofstream(dir + "/bad.json") << "{\"name\": 1}";
  EXPECT_NE(message(dir + "/bad.json", "").find("strata_device_profile"), std::string::npos);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/p.json"));
  j["attention_tflops"] = {{128, -1}};
  std::ofstream(dir + "/bad_attention.json") << j.dump();
  EXPECT_NE(message(dir + "/bad_attention.json", "").find("\"attention_tflops\""),
            std::string::npos);
  j.erase("attention_tflops");
  j["elementwise_gbps"] = {{"gpt2", "fast"}};
  std::ofstream(dir + "/bad_elementwise.json") << j.dump();
  EXPECT_NE(message(dir + "/bad_elementwise.json", "").find("\"elementwise_gbps\".gpt2"),
            std::string::npos);
}

TEST(PlannerSearch, AConfigWithoutAGlobalBatchIsRefused) {
  planner::PlanInput in = input({{"preset", "gpt2-tiny"}}, 8, 2, 2, "h100");
  in.base.erase("train_batch_size");
  try {
    planner::enumerate(in);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("train_batch_size"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata
