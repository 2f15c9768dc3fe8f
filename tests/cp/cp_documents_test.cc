// Document masking (Transformer::forward's doc_begin) where the rows of a sequence are split over
// ranks: context parallelism, each rank holding T/cp rows of every sequence (Ulysses' contiguous
// block, ring attention's zig-zag chunks) with the documents of the whole sequences, and sequence
// parallelism under tensor parallelism, each rank holding a block of the micro-batch's rows (the
// position table read from its first row's offset). Every rank's chunk, fed its rows of a batch
// whose sequences pack several documents, gives the single process's logits of those rows, its
// loss (summed over the ranks under context parallelism) and its gradients (summed over them), fp32
// within 1e-5, for a learned-position family (GPT-2) and a RoPE one (Llama, grouped queries), with
// and without activation recompute. Runs under mpirun with 2 and 4 ranks (tests/CMakeLists.txt).
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/communicator.h"
#include "strata/core/rng.h"
#include "strata/kernels/ops.h"
#include "strata/model/param_spec.h"
#include "strata/model/transformer.h"
#include "strata/tensor_parallel/mappings.h"
#include "tests/mpi_world.h"

namespace strata {
namespace {

using test::world_rank;
using test::world_size;

// One world communicator for the whole binary; a test that diverges aborts after 120 s.
class WorldEnv : public ::testing::Environment {
 public:
  void SetUp() override {
    comm = std::make_unique<comm::Communicator>(MPI_COMM_WORLD, "world");
    comm->set_timeout(std::chrono::seconds(120));
  }
  void TearDown() override { comm.reset(); }
  static inline std::unique_ptr<comm::Communicator> comm;
};
::testing::Environment* const kWorldEnv = ::testing::AddGlobalTestEnvironment(new WorldEnv);

constexpr int B = 2, T = 32;

// Heads 8 over 4 key/value groups: whole groups on each of 2 or 4 Ulysses or tensor ranks.
ModelConfig model(const std::string& family) {
  ModelConfig m;
  m.family = family;
  m.layers = 2, m.hidden = 64, m.heads = 8, m.kv_heads = 4, m.vocab = 96, m.seq_len = T;
  m.ffn_hidden = family == "gpt2" ? 128 : 96;
  m.tied_embeddings = family == "gpt2";
  return m;
}

// Documents across the ranks' rows: three in the first sequence (one of a single row), two in the
// second.
std::vector<int32_t> doc_begin() {
  const std::vector<std::vector<int>> starts = {{0, 7, 8, 21}, {0, 13}};
  std::vector<int32_t> d;
  for (const std::vector<int>& s : starts) {
    for (size_t i = 0; i < s.size(); ++i) {
      d.insert(d.end(), size_t((i + 1 < s.size() ? s[i + 1] : T) - s[i]), s[i]);
    }
  }
  return d;
}

struct Batch {
  std::vector<int32_t> inputs, targets;  // (B, T)
};

Batch batch(const ModelConfig& m) {
  Batch b;
  const uint64_t key = rng_key(11, "cp_documents_test");
  for (int i = 0; i < B * T; ++i) {
    b.inputs.push_back(int32_t(rng_uniform(key, uint64_t(2 * i)) * float(m.vocab)) % m.vocab);
    b.targets.push_back(
        i % 7 == 3 ? -1
                   : int32_t(rng_uniform(key, uint64_t(2 * i + 1)) * float(m.vocab)) % m.vocab);
  }
  return b;
}

std::vector<float> initial_params(const ModelSpec& spec) {
  std::vector<float> p(size_t(spec.numel), 0.0f);
  for (const ParamSpec& s : spec.params) init_param_slice(p.data() + s.offset, s, 7, 0, s.numel());
  return p;
}

struct Result {
  double loss = 0;
  std::vector<float> logits;  // (rows, Vl)
  std::vector<float> grads;
};

// Forward (documents given) and backward of one micro-batch: rows (its token ids and targets) of
// `rows_per_seq` per sequence.
Result run(const ModelSpec& spec, const Batch& b, int rows_per_seq, const int32_t* docs,
           const ChunkOptions& o, tp::Group* tp = nullptr) {
  std::vector<float> params = initial_params(spec);
  Result r;
  r.grads.assign(size_t(spec.numel), 0.0f);
  auto m = make_transformer(spec, DType::F32, DType::F32, params.data(), r.grads.data(), B,
                            rows_per_seq, o, tp);
  r.loss = m->forward(0, b.inputs.data(), Tensor(), b.targets.data(), 1.0f / float(B * T), true,
                      nullptr, docs);
  r.logits.resize(size_t(m->logits(0).numel()));
  ops::copy_to_host(r.logits.data(), m->logits(0));
  m->backward_input(0, Tensor());
  return r;
}

// max |a − b| / max |b| over pairs.
struct Err {
  double num = 0, den = 0;
  void add(double a, double b) {
    num = std::max(num, std::fabs(a - b)), den = std::max(den, std::fabs(b));
  }
  double rel() const { return num / std::max(den, 1e-30); }
};

std::vector<RecomputeOptions> policies(const ModelConfig& m) {
  RecomputeOptions none, full;
  full.full.assign(size_t(m.layers), 1);
  full.selective = true;
  return {none, full};
}

class Documents : public ::testing::TestWithParam<std::string> {};

// Context parallelism over the world, Ulysses and ring: rank r holds the rows of its positions
// (ContextOptions::positions) of both sequences and the whole sequences' documents.
TEST_P(Documents, ContextParallelEqualsOneProcess) {
  const ModelConfig m = model(GetParam());
  const ModelSpec spec = build_model_spec(m);
  const Batch whole = batch(m);
  const std::vector<int32_t> docs = doc_begin();
  const int P = world_size(), me = world_rank(), Tl = T / P;
  for (ContextOptions::Impl impl : {ContextOptions::Impl::Ulysses, ContextOptions::Impl::Ring}) {
    for (const RecomputeOptions& rc : policies(m)) {
      SCOPED_TRACE(std::string(impl == ContextOptions::Impl::Ring ? "ring" : "ulysses") +
                   (rc.any_full() ? ", recompute" : ""));
      ChunkOptions serial;
      serial.recompute = rc;
      const Result ref = run(spec, whole, T, docs.data(), serial);

      ChunkOptions o;
      o.recompute = rc;
      o.context = {P, me, impl, WorldEnv::comm.get()};
      const std::vector<int32_t> pos = o.context.positions(T);
      Batch mine;
      for (int s = 0; s < B; ++s) {
        for (int32_t p : pos) {
          mine.inputs.push_back(whole.inputs[size_t(s * T + p)]);
          mine.targets.push_back(whole.targets[size_t(s * T + p)]);
        }
      }
      Result r = run(spec, mine, Tl, docs.data(), o);
      MPI_Allreduce(MPI_IN_PLACE, &r.loss, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      MPI_Allreduce(MPI_IN_PLACE, r.grads.data(), int(r.grads.size()), MPI_FLOAT, MPI_SUM,
                    MPI_COMM_WORLD);
      EXPECT_NEAR(r.loss, ref.loss, 1e-5 * std::fabs(ref.loss));
      Err logits;
      for (int s = 0; s < B; ++s) {
        for (int i = 0; i < Tl; ++i) {
          const size_t at = size_t(s * Tl + i) * m.vocab, ref_at = size_t(s * T + pos[i]) * m.vocab;
          for (int v = 0; v < m.vocab; ++v) logits.add(r.logits[at + v], ref.logits[ref_at + v]);
        }
      }
      EXPECT_LT(logits.rel(), 1e-5) << "rank " << me;
      for (const ParamSpec& p : spec.params) {
        Err e;
        for (int64_t i = 0; i < p.numel(); ++i) {
          e.add(r.grads[size_t(p.offset + i)], ref.grads[size_t(p.offset + i)]);
        }
        EXPECT_LT(e.rel(), 1e-5) << p.name;
      }
    }
  }
}

// Tensor parallelism over the world with sequence parallelism: rank r holds rows [r·N/P,
// (r+1)·N/P) of the micro-batch's N between the layers (its position rows from there) and its
// slice of every split parameter. Its loss is the whole batch's; each parameter's gradient, where
// the rank holds it, the single process's.
TEST_P(Documents, SequenceParallelEqualsOneProcess) {
  const ModelConfig m = model(GetParam());
  const Batch b = batch(m);
  const std::vector<int32_t> docs = doc_begin();
  const int P = world_size(), me = world_rank();
  const ModelSpec serial = build_model_spec(m), spec = build_model_spec(m, 1, P, me);
  tp::Group group(WorldEnv::comm.get(), nullptr, true);
  for (const RecomputeOptions& rc : policies(m)) {
    SCOPED_TRACE(rc.any_full() ? "recompute" : "no recompute");
    ChunkOptions o;
    o.recompute = rc;
    const Result ref = run(serial, b, T, docs.data(), o);
    const Result r = run(spec, b, T, docs.data(), o, &group);
    EXPECT_NEAR(r.loss, ref.loss, 1e-5 * std::fabs(ref.loss));
    for (const ParamSpec& p : spec.params) {
      const ParamSpec& q = serial.param(p.name);
      const int64_t rows = p.shape[0], cols = p.shape.size() > 1 ? p.shape[1] : 1;
      const int64_t gcols = q.shape.size() > 1 ? q.shape[1] : 1;
      // Local (row, column) → the whole tensor's, through the split axis' ranges; padding rows
      // (past the ranges) have no counterpart.
      auto global = [&](int64_t local) {
        int64_t at = 0;
        for (const TpRange& range : p.ranges) {
          if (local < at + range.count) return range.begin + local - at;
          at += range.count;
        }
        return int64_t(-1);
      };
      Err e;
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) {
          const int64_t gi = p.split_axis == 0 ? global(i) : i;
          const int64_t gj = p.split_axis == 1 ? global(j) : j;
          if (gi < 0 || gj < 0) continue;
          e.add(r.grads[size_t(p.offset + i * cols + j)],
                ref.grads[size_t(q.offset + gi * gcols + gj)]);
        }
      }
      EXPECT_LT(e.rel(), 1e-5) << p.name << " on rank " << me;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Documents, ::testing::Values("gpt2", "llama"));

}  // namespace
}  // namespace strata
