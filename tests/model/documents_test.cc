// Document masking in the model (Transformer::forward's doc_begin): a micro-batch whose sequences
// pack two or three documents gives every token the logits, and the parameters the gradients, of
// each document run alone as a sequence of its own (the gradients summed over those runs), for a
// learned-position family (GPT-2) and a RoPE one (Llama, grouped queries), on both CPU attention
// paths. Activation recompute (full and selective) and micro-batches in flight with other
// documents (deferred weight gradients) change no bit of it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "strata/core/check.h"
#include "strata/kernels/cpu/attention.h"
#include "strata/kernels/ops.h"
#include "strata/model/param_spec.h"
#include "strata/model/transformer.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/model/tiny_model.h"

namespace strata {
namespace {

using test::Batch;
using test::doc_begin;
using test::tiny;

constexpr int B = 2;

// Where each sequence's documents start: three documents beside two.
const std::vector<std::vector<int>> kStarts = {{0, 5, 12}, {0, 9}};
// Another packing, for a second micro-batch.
const std::vector<std::vector<int>> kOtherStarts = {{0, 2}, {0, 7, 8}};

std::vector<float> initial_params(const ModelSpec& spec) {
  std::vector<float> p(size_t(spec.numel), 0.0f);
  for (const ParamSpec& s : spec.params) init_param_slice(p.data() + s.offset, s, 7, 0, s.numel());
  return p;
}

// max |a − b| / max |b| over a range.
double rel_err(const float* a, const float* b, size_t n) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return num / std::max(den, 1e-30);
}

struct Result {
  double loss = 0;
  std::vector<float> logits;  // (B·T, V) in the packed rows' order
  std::vector<float> grads;
};

// The logits of micro-batch mb, read before its backward overwrites them.
void read_logits(Transformer& m, int mb, float* out) {
  ops::copy_to_host(out, m.logits(mb));
}

// One micro-batch through the whole model with documents (docs: doc_begin, or nullptr).
Result packed(const ModelSpec& spec, std::vector<float>& params, const Batch& b,
              const int32_t* docs, const ChunkOptions& o = {}) {
  const ModelConfig& m = spec.config;
  const int N = B * m.seq_len;
  Result r;
  r.grads.assign(size_t(spec.numel), 0.0f);
  r.logits.resize(size_t(N) * m.vocab);
  auto model = make_transformer(spec, DType::F32, DType::F32, params.data(), r.grads.data(), B,
                                m.seq_len, o);
  r.loss = model->forward(0, b.inputs.data(), Tensor(), b.targets.data(), 1.0f / float(N), true,
                          nullptr, docs);
  read_logits(*model, 0, r.logits.data());
  model->backward();
  return r;
}

// Each document alone, as a micro-batch of one sequence of its own length; the gradients summed.
Result separate(const ModelSpec& spec, std::vector<float>& params, const Batch& b,
                const std::vector<std::vector<int>>& starts) {
  const ModelConfig& m = spec.config;
  const int T = m.seq_len, V = m.vocab, N = B * T;
  Result r;
  r.grads.assign(size_t(spec.numel), 0.0f);
  r.logits.resize(size_t(N) * V);
  for (int s = 0; s < B; ++s) {
    const std::vector<int>& st = starts[size_t(s)];
    for (size_t i = 0; i < st.size(); ++i) {
      const int begin = st[i], n = (i + 1 < st.size() ? st[i + 1] : T) - begin;
      const size_t first = size_t(s) * T + size_t(begin);
      auto model =
          make_transformer(spec, DType::F32, DType::F32, params.data(), r.grads.data(), 1, n);
      r.loss +=
          model->forward(b.inputs.data() + first, b.targets.data() + first, 1.0f / float(N), true);
      read_logits(*model, 0, r.logits.data() + first * V);
      model->backward();
    }
  }
  return r;
}

void expect_close(const ModelSpec& spec, const Result& got, const Result& want, double tol) {
  EXPECT_NEAR(got.loss, want.loss, tol * std::fabs(want.loss));
  EXPECT_LT(rel_err(got.logits.data(), want.logits.data(), got.logits.size()), tol);
  for (const ParamSpec& p : spec.params) {
    EXPECT_LT(rel_err(got.grads.data() + p.offset, want.grads.data() + p.offset, size_t(p.numel())),
              tol)
        << p.name;
  }
}

void expect_identical(const ModelSpec& spec, const Result& got, const Result& want) {
  EXPECT_EQ(got.loss, want.loss);
  EXPECT_EQ(got.logits, want.logits);
  for (const ParamSpec& p : spec.params) {
    EXPECT_TRUE(std::equal(got.grads.begin() + p.offset, got.grads.begin() + p.offset + p.numel(),
                           want.grads.begin() + p.offset))
        << p.name;
  }
}

class Documents : public ::testing::TestWithParam<std::string> {};

// The packed micro-batch is its documents run alone, fp32 within 1e-5, on both attention paths;
// and the documents matter (one document per sequence gives other logits).
TEST_P(Documents, PackedEqualsEachDocumentAlone) {
  const ModelConfig m = tiny(GetParam());
  const ModelSpec spec = build_model_spec(m);
  std::vector<float> params = initial_params(spec);
  const Batch b = test::batch(m, B, 3, "documents_test", 7, 3);
  const std::vector<int32_t> docs = doc_begin(m.seq_len, kStarts);
  for (kernels::AttentionPath path :
       {kernels::AttentionPath::Materialized, kernels::AttentionPath::Tiled}) {
    SCOPED_TRACE(kernels::attention_path_name(path));
    kernels::set_attention_path(path);
    const Result p = packed(spec, params, b, docs.data());
    expect_close(spec, p, separate(spec, params, b, kStarts), 1e-5);
    const Result whole = packed(spec, params, b, nullptr);
    EXPECT_GT(rel_err(whole.logits.data(), p.logits.data(), p.logits.size()), 1e-3);
  }
  kernels::set_attention_path(std::nullopt);
}

// Full recompute of every block, with selective recompute too, and the host pool: the same bits
// as keeping everything (the recomputes read the micro-batch's documents).
TEST_P(Documents, RecomputeChangesNothing) {
  const ModelConfig m = tiny(GetParam());
  const ModelSpec spec = build_model_spec(m);
  std::vector<float> params = initial_params(spec);
  const Batch b = test::batch(m, B, 4, "documents_test", 5, 2);
  const std::vector<int32_t> docs = doc_begin(m.seq_len, kStarts);
  const Result base = packed(spec, params, b, docs.data());
  for (int policy = 0; policy < 3; ++policy) {
    SCOPED_TRACE(policy == 0 ? "full" : policy == 1 ? "selective" : "full, selective, host");
    ChunkOptions o;
    if (policy != 1) o.recompute.full.assign(size_t(m.layers), 1);
    o.recompute.selective = policy >= 1;
    o.recompute.host = policy == 2;
    expect_identical(spec, packed(spec, params, b, docs.data(), o), base);
  }
}

// Two micro-batches in flight with different documents (one of them none), input gradients in
// reverse and weight gradients deferred (F0 F1 B1 B0 W0 W1), under full recompute of two blocks:
// each pass reads its own micro-batch's documents, so the losses, logits and gradients are those
// of the two run one after the other.
TEST_P(Documents, MicroBatchesInFlightKeepTheirDocuments) {
  const ModelConfig m = tiny(GetParam());
  const ModelSpec spec = build_model_spec(m);
  std::vector<float> params = initial_params(spec);
  const int N = B * m.seq_len;
  const Batch b0 = test::batch(m, B, 5, "documents_test", 7, 3);
  const Batch b1 = test::batch(m, B, 6, "documents_test", 7, 3);
  const std::vector<int32_t> d0 = doc_begin(m.seq_len, kStarts);
  const std::vector<int32_t> d1 = doc_begin(m.seq_len, kOtherStarts);
  for (const int32_t* docs1 : {d1.data(), static_cast<const int32_t*>(nullptr)}) {
    SCOPED_TRACE(docs1 != nullptr ? "both with documents" : "the second without");
    ChunkOptions o;
    o.recompute.full = {0, 1, 0, 1};
    o.recompute.selective = true;
    std::vector<float> seq_grads(size_t(spec.numel), 0.0f), grads(size_t(spec.numel), 0.0f);
    std::vector<float> seq_logits(2 * size_t(N) * m.vocab), logits(seq_logits.size());
    double seq_loss[2], loss[2];
    {
      auto model = make_transformer(spec, DType::F32, DType::F32, params.data(), seq_grads.data(),
                                    B, m.seq_len, o);
      seq_loss[0] = model->forward(b0.inputs.data(), b0.targets.data(), 1.0f / float(N), true,
                                   nullptr, d0.data());
      read_logits(*model, 0, seq_logits.data());
      model->backward();
      seq_loss[1] = model->forward(b1.inputs.data(), b1.targets.data(), 1.0f / float(N), true,
                                   nullptr, docs1);
      read_logits(*model, 0, seq_logits.data() + size_t(N) * m.vocab);
      model->backward();
    }
    o.slots = 2, o.defer_weight = true;
    auto model = make_transformer(spec, DType::F32, DType::F32, params.data(), grads.data(), B,
                                  m.seq_len, o);
    loss[0] = model->forward(0, b0.inputs.data(), Tensor(), b0.targets.data(), 1.0f / float(N),
                             true, nullptr, d0.data());
    read_logits(*model, 0, logits.data());
    loss[1] = model->forward(1, b1.inputs.data(), Tensor(), b1.targets.data(), 1.0f / float(N),
                             true, nullptr, docs1);
    read_logits(*model, 1, logits.data() + size_t(N) * m.vocab);
    model->backward_input(1, Tensor());
    model->backward_input(0, Tensor());
    model->backward_weight(0);
    model->backward_weight(1);
    EXPECT_EQ(loss[0], seq_loss[0]);
    EXPECT_EQ(loss[1], seq_loss[1]);
    EXPECT_EQ(logits, seq_logits);
    for (const ParamSpec& p : spec.params) {
      EXPECT_TRUE(std::equal(grads.begin() + p.offset, grads.begin() + p.offset + p.numel(),
                             seq_grads.begin() + p.offset))
          << p.name;
    }
  }
}

// An evaluation forward reads the documents too: its loss is the training forward's (to the
// rounding of the two cross-entropy kernels), not the one-document loss.
TEST_P(Documents, EvaluationForwardUsesTheDocuments) {
  const ModelConfig m = tiny(GetParam());
  const ModelSpec spec = build_model_spec(m);
  std::vector<float> params = initial_params(spec);
  const Batch b = test::batch(m, B, 7, "documents_test", 7, 3);
  const std::vector<int32_t> docs = doc_begin(m.seq_len, kStarts);
  auto model = make_transformer(spec, DType::F32, DType::F32, params.data(), nullptr, B, m.seq_len);
  const double eval =
      model->forward(b.inputs.data(), b.targets.data(), 1.0f, false, nullptr, docs.data());
  const double plain = model->forward(b.inputs.data(), b.targets.data(), 1.0f, false);
  const double train = packed(spec, params, b, docs.data()).loss;
  EXPECT_NEAR(eval, train, 1e-6 * std::fabs(train));
  EXPECT_GT(std::fabs(eval - plain), 1e-4 * std::fabs(train));
}

// A doc_begin that is no packing is refused, naming the position, before the forward takes a slot.
TEST(DocumentsInput, BadStartsAreRefused) {
  const ModelConfig m = tiny("llama");
  const ModelSpec spec = build_model_spec(m);
  std::vector<float> params = initial_params(spec);
  const Batch b = test::batch(m, 1, 8, "documents_test", 7, 3);
  auto model = make_transformer(spec, DType::F32, DType::F32, params.data(), nullptr, 1, m.seq_len);
  std::vector<int32_t> docs = doc_begin(m.seq_len, {{0, 6}});
  docs[3] = 4;  // position 3's document would start after it
  EXPECT_THROW(model->forward(b.inputs.data(), b.targets.data(), 1.0f, false, nullptr, docs.data()),
               Error);
  docs[3] = 0;  // refused before it took a slot: the next forward runs
  EXPECT_NO_THROW(
      model->forward(b.inputs.data(), b.targets.data(), 1.0f, false, nullptr, docs.data()));
}

INSTANTIATE_TEST_SUITE_P(Families, Documents, ::testing::Values("gpt2", "llama"));

}  // namespace
}  // namespace strata
