// Model chunks (DESIGN.md §3, §6): a model cut into chunks driven one after the other, with
// several micro-batches in flight and the weight gradients deferred, computes exactly what the
// whole model computes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "strata/core/check.h"
#include "strata/core/rng.h"
#include "strata/model/param_spec.h"
#include "strata/model/transformer.h"
#include "tests/model/tiny_model.h"

namespace strata {
namespace {

using test::Batch;
using test::tiny;

Batch batch(const ModelConfig& m, int B, uint64_t seed) {
  return test::batch(m, B, seed, "chunk_test", 7, 3);
}

std::vector<float> initial_params(const ModelSpec& spec) {
  std::vector<float> p(size_t(spec.numel), 0.0f);
  for (const ParamSpec& s : spec.params) init_param_slice(p.data() + s.offset, s, 7, 0, s.numel());
  return p;
}

// The index of the first unit of block l (its attention unit).
int block_unit(const ModelSpec& spec, int l) {
  return spec.units_of(UnitKind::Attention)[size_t(l)];
}

class Chunks : public ::testing::TestWithParam<std::string> {};

// Two chunks, [embedding, blocks 0-1] and [blocks 2-3, head], run micro-batches 0 and 1 with
// both in flight (F0 F1 B1 B0 across the chunks, as a pipeline would), the weight gradients of
// micro-batch 1 deferred past micro-batch 0's backward: the losses and every gradient equal the
// whole model's running the two micro-batches in turn, bit for bit.
TEST_P(Chunks, SplitDeferredAndInFlightEqualTheWholeModel) {
  const ModelConfig m = tiny(GetParam());
  const ModelSpec spec = build_model_spec(m);
  const int B = 2, N = B * m.seq_len;
  std::vector<float> params = initial_params(spec);
  const Batch b0 = batch(m, B, 1), b1 = batch(m, B, 2);
  const float dloss = 1.0f / float(2 * N);

  std::vector<float> whole_grads(size_t(spec.numel), 0.0f);
  auto whole = make_transformer(spec, DType::F32, DType::F32, params.data(), whole_grads.data(), B,
                                m.seq_len);
  const double w0 = whole->forward(b0.inputs.data(), b0.targets.data(), dloss, true);
  whole->backward();
  const double w1 = whole->forward(b1.inputs.data(), b1.targets.data(), dloss, true);
  whole->backward();

  const int cut = block_unit(spec, 2);
  auto expect_equal = [&](const std::vector<float>& grads, const char* how) {
    for (const ParamSpec& p : spec.params) {
      EXPECT_EQ(0, std::memcmp(grads.data() + p.offset, whole_grads.data() + p.offset,
                               sizeof(float) * size_t(p.numel())))
          << how << ": " << p.name;
    }
  };
  {  // In sequence: F0 B0 F1 B1 through the two chunks, weight gradients with the input's.
    std::vector<float> grads(size_t(spec.numel), 0.0f);
    auto c0 = make_transformer(spec, DType::F32, DType::F32, params.data(), grads.data(), B,
                               m.seq_len, ChunkOptions{0, cut, 1, false});
    auto c1 = make_transformer(spec, DType::F32, DType::F32, params.data(), grads.data(), B,
                               m.seq_len, ChunkOptions{cut, -1, 1, false});
    for (const Batch* b : {&b0, &b1}) {
      c0->forward(0, b->inputs.data(), Tensor(), nullptr, dloss, true);
      const double l = c1->forward(0, nullptr, c0->output(0), b->targets.data(), dloss, true);
      EXPECT_EQ(l, b == &b0 ? w0 : w1);
      EXPECT_EQ(c0->backward_input(0, c1->backward_input(0, Tensor())).data, nullptr);
    }
    expect_equal(grads, "two chunks in sequence");
  }
  {  // Both micro-batches in flight; micro-batch 1's input gradients first, every weight
     // gradient deferred until both input gradients ran (as a zero-bubble schedule does).
    std::vector<float> grads(size_t(spec.numel), 0.0f);
    auto c0 = make_transformer(spec, DType::F32, DType::F32, params.data(), grads.data(), B,
                               m.seq_len, ChunkOptions{0, cut, 2, true});
    auto c1 = make_transformer(spec, DType::F32, DType::F32, params.data(), grads.data(), B,
                               m.seq_len, ChunkOptions{cut, -1, 2, true});
    c0->forward(0, b0.inputs.data(), Tensor(), nullptr, dloss, true);
    c0->forward(1, b1.inputs.data(), Tensor(), nullptr, dloss, true);
    EXPECT_EQ(c1->forward(0, nullptr, c0->output(0), b0.targets.data(), dloss, true), w0);
    EXPECT_EQ(c1->forward(1, nullptr, c0->output(1), b1.targets.data(), dloss, true), w1);
    EXPECT_THROW(c0->forward(2, b0.inputs.data(), Tensor(), nullptr, dloss, true), Error)
        << "a third micro-batch needs a third slot";
    c0->backward_input(1, c1->backward_input(1, Tensor()));
    c0->backward_input(0, c1->backward_input(0, Tensor()));
    for (int mb : {0, 1}) {
      c1->backward_weight(mb);
      c0->backward_weight(mb);
    }
    expect_equal(grads, "two chunks, deferred weight gradients");
    EXPECT_THROW(c0->backward_weight(0), Error) << "micro-batch 0's slot was freed";
  }
  {  // Weight gradients deferred with one input slot (ZB-H1's pattern: F0 B0 F1 B1 W0 W1): what
     // only the input gradient reads is freed by it and reused by the next micro-batch.
    std::vector<float> grads(size_t(spec.numel), 0.0f);
    ChunkOptions o{0, -1, 2, true};
    o.input_slots = 1;
    auto whole2 = make_transformer(spec, DType::F32, DType::F32, params.data(), grads.data(), B,
                                   m.seq_len, o);
    EXPECT_EQ(whole2->forward(0, b0.inputs.data(), Tensor(), b0.targets.data(), dloss, true), w0);
    EXPECT_THROW(whole2->forward(1, b1.inputs.data(), Tensor(), b1.targets.data(), dloss, true),
                 Error)
        << "the only input slot is still held by micro-batch 0";
    whole2->backward_input(0, Tensor());
    EXPECT_EQ(whole2->forward(1, b1.inputs.data(), Tensor(), b1.targets.data(), dloss, true), w1);
    whole2->backward_input(1, Tensor());
    whole2->backward_weight(0);
    whole2->backward_weight(1);
    expect_equal(grads, "one chunk, one input slot, deferred weight gradients");
  }
}

INSTANTIATE_TEST_SUITE_P(Families, Chunks, ::testing::Values("gpt2", "llama"));

// The model holds no memory and runs no kernel but through the device-neutral interface: asked
// for a device without a backend, it fails at construction with the interface's message.
TEST(ChunkDevice, ADeviceWithoutABackendIsRefused) {
  const ModelSpec spec = build_model_spec(tiny("gpt2"));
  ChunkOptions on_gpu;
  on_gpu.device = Device::CUDA;
  try {
    make_transformer(spec, DType::F32, DType::F32, nullptr, nullptr, 1, 16, on_gpu);
    FAIL() << "a CUDA chunk was built without a CUDA backend or a selected GPU";
  } catch (const Error& e) {
    // The device's memory is the first thing asked for: built with the backend or without it,
    // CUDA memory needs the backend and a selected GPU (ops::init_device).
    EXPECT_NE(std::string(e.what()).find("needs the CUDA backend and a selected GPU"),
              std::string::npos)
        << e.what();
  }
}

// Chunk boundaries fall between whole blocks, and the head stays whole.
TEST(ChunkDevice, BoundariesInsideABlockOrTheHeadAreRefused) {
  ModelConfig m = tiny("llama");
  m.vocab = 1000;  // several vocabulary and output units
  const ModelSpec spec = build_model_spec(m);
  const int mlp0 = spec.units_of(UnitKind::Mlp)[0];
  const int out0 = spec.units_of(UnitKind::Output)[0];  // after the final norm
  ASSERT_GT(spec.units_of(UnitKind::Vocab).size(), 1u) << "the test needs several vocabulary units";
  const int U = int(spec.units.size());
  // Inside a block; ending inside the head; ending inside the embedding (its vocabulary units);
  // starting inside the head (past the final norm).
  for (ChunkOptions o : {ChunkOptions{0, mlp0}, ChunkOptions{mlp0, -1}, ChunkOptions{0, out0},
                         ChunkOptions{0, 1}, ChunkOptions{out0, U}}) {
    EXPECT_THROW(make_transformer(spec, DType::F32, DType::F32, nullptr, nullptr, 1, 16, o), Error)
        << o.unit_begin << ".." << o.unit_end;
  }
}

}  // namespace
}  // namespace strata
