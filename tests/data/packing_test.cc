// Packed windows, loss masks and document boundaries (data/sampler.h, data/loss_mask.h): which
// tokens a window holds, which targets it trains, where each position's document starts.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "strata/core/check.h"
#include "strata/data/llmc_shard.h"
#include "strata/data/loss_mask.h"
#include "strata/data/megatron_dataset.h"
#include "strata/data/sampler.h"
#include "strata/data/token_dataset.h"
#include "tests/data/data_test_util.h"

namespace strata::data {
namespace {

using test_util::read_bytes;
using test_util::TempDirTest;
using test_util::write_bytes;

class Packing : public TempDirTest {
 protected:
  // Documents of the given lengths, token ids 1, 2, 3, ... across the dataset (so every token
  // says where it came from), and, when masks is not empty, their loss masks.
  std::string write(const std::vector<int>& lengths,
                    const std::vector<std::vector<uint8_t>>& masks = {}) {
    const std::string prefix = path("ds");
    MegatronWriter w(prefix, TokenType::I32);
    std::unique_ptr<LossMaskWriter> m;
    if (!masks.empty()) m = std::make_unique<LossMaskWriter>(prefix);
    int32_t next = 1;
    for (size_t d = 0; d < lengths.size(); ++d) {
      std::vector<int32_t> ids;
      for (int i = 0; i < lengths[d]; ++i) ids.push_back(next++);
      w.add_document(ids.data(), int64_t(ids.size()));
      if (m) m->append(masks[d].data(), int64_t(masks[d].size()));
    }
    w.commit();
    if (m) m->commit();
    return prefix;
  }
  struct Window {
    std::vector<int32_t> in, tg, doc;
  };
  static Window window(const Sampler& s, int64_t w) {
    const size_t T = size_t(s.seq_len());
    Window x{std::vector<int32_t>(T), std::vector<int32_t>(T), std::vector<int32_t>(T)};
    s.get_window(w, x.in.data(), x.tg.data(), x.doc.data());
    return x;
  }
};

TEST_F(Packing, FirstFitPlacesWholeDocumentsAndTrainsEachTargetOnce) {
  // T = 8: documents 5, 3, 6, 2, 12 (cut into 8 + 5 overlapping by one), 1 (no target: left out).
  const auto ds = open_dataset(write({5, 3, 6, 2, 12, 1}), "megatron");
  ASSERT_EQ(ds->document_starts(), (std::vector<int64_t>{0, 5, 8, 14, 16, 28}));
  const Sampler s(*ds, 8, 1, {.pack = true, .document_mask = true});
  // First fit: [5 3] [6 2] [8] [5]: the 12-token document's pieces start at tokens 16 and 23.
  ASSERT_EQ(s.num_windows(), 4);
  EXPECT_EQ(s.packed_pieces(), 6);
  EXPECT_NEAR(s.packing_efficiency(), (5 + 3 + 6 + 2 + 8 + 5) / 32.0, 1e-12);
  const Window w0 = window(s, 0);
  EXPECT_EQ(w0.in, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(w0.tg, (std::vector<int32_t>{2, 3, 4, 5, -1, 7, 8, -1}));
  EXPECT_EQ(w0.doc, (std::vector<int32_t>{0, 0, 0, 0, 0, 5, 5, 5}));
  const Window w3 = window(s, 3);  // the second piece and three positions of padding
  EXPECT_EQ(w3.in, (std::vector<int32_t>{24, 25, 26, 27, 28, 0, 0, 0}));
  EXPECT_EQ(w3.tg, (std::vector<int32_t>{25, 26, 27, 28, -1, -1, -1, -1}));
  EXPECT_EQ(w3.doc, (std::vector<int32_t>{0, 0, 0, 0, 0, 5, 5, 5}));
  // Every token that follows another in its document is a target exactly once.
  std::map<int32_t, int> seen;
  int64_t trained = 0;
  for (int64_t w = 0; w < s.num_windows(); ++w) {
    const Window x = window(s, w);
    for (int32_t t : x.tg)
      if (t >= 0) ++seen[t];
    EXPECT_EQ(s.window_trained(w),
              std::count_if(x.tg.begin(), x.tg.end(), [](int32_t t) { return t >= 0; }));
    trained += s.window_trained(w);
  }
  std::map<int32_t, int> expected;
  for (int32_t t : {2, 3, 4, 5, 7, 8, 10, 11, 12, 13, 14, 16}) expected[t] = 1;
  for (int32_t t = 18; t <= 28; ++t) expected[t] = 1;
  EXPECT_EQ(seen, expected);
  EXPECT_EQ(trained, int64_t(expected.size()));
}

TEST_F(Packing, TheLossMaskDecidesWhichTargetsTrain) {
  const auto ds = open_dataset(write({4, 4}, {{0, 0, 1, 1}, {1, 0, 1, 0}}), "megatron");
  ASSERT_TRUE(ds->has_loss_mask());
  const Sampler s(*ds, 8, 1, {.pack = true});
  ASSERT_EQ(s.num_windows(), 1);
  const Window w = window(s, 0);
  // Targets: document 1's tokens 3, 4 (mask 1 at its positions 2, 3); document 2's token 7.
  EXPECT_EQ(w.tg, (std::vector<int32_t>{-1, 3, 4, -1, -1, 7, -1, -1}));
  EXPECT_EQ(s.trained_tokens(0), 3);
  EXPECT_EQ(s.trained_tokens(0, 3), 9);  // three epochs of the one window
}

TEST_F(Packing, ContiguousWindowsMaskDocumentBoundaries) {
  // Megatron's way: windows cut the stream; with document masking each position's document
  // start, and no target that opens a document.
  const auto ds = open_dataset(write({3, 4, 6}), "megatron");
  const Sampler plain(*ds, 6, 1);
  const Window p = window(plain, 0);
  EXPECT_EQ(p.tg, (std::vector<int32_t>{2, 3, 4, 5, 6, 7}));
  const Sampler s(*ds, 6, 1, {.document_mask = true});
  const Window w0 = window(s, 0), w1 = window(s, 1);
  EXPECT_EQ(w0.in, (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(w0.tg, (std::vector<int32_t>{2, 3, -1, 5, 6, 7}));
  EXPECT_EQ(w0.doc, (std::vector<int32_t>{0, 0, 0, 3, 3, 3}));
  // Window 1 (tokens 7..12) starts inside document 2; document 3 opens at its position 1, and the
  // target at window 0's end (token 7) does not open one.
  EXPECT_EQ(w1.tg, (std::vector<int32_t>{-1, 9, 10, 11, 12, 13}));
  EXPECT_EQ(w1.doc, (std::vector<int32_t>{0, 1, 1, 1, 1, 1}));
  EXPECT_EQ(s.window_trained(1), 5);
  const Sampler eod(*ds, 6, 1, {.eod_mask_loss = true});
  EXPECT_EQ(window(eod, 0).tg, w0.tg);
}

TEST_F(Packing, DataWithoutDocumentsIsRefused) {
  const std::string shard = path("x.bin");
  write_llmc_shard(shard, std::vector<int32_t>(32, 1), false);
  const auto ds = open_dataset(shard, "llmc");
  try {
    Sampler s(*ds, 8, 1, {.pack = true});
    FAIL() << "packed an llm.c shard";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("records no documents"), std::string::npos) << e.what();
  }
}

TEST_F(Packing, ABrokenLossMaskNamesTheFile) {
  const std::string prefix = write({4, 4}, {{0, 0, 1, 1}, {1, 0, 1, 0}});
  const std::string mask = prefix + ".lossmask";
  const std::vector<uint8_t> good = read_bytes(mask);
  auto expect_refused = [&](std::vector<uint8_t> bytes, const std::string& says) {
    write_bytes(mask, bytes);
    try {
      open_dataset(prefix, "megatron");
      FAIL() << "accepted a mask: " << says;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(mask), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  std::vector<uint8_t> bad = good;
  bad[0] = 'X';
  expect_refused(bad, "not a loss mask");
  bad = good;
  bad.pop_back();
  expect_refused(bad, "does not belong");
  bad = good;
  bad.back() = 2;
  expect_refused(bad, "0 or 1");
  // A new dataset written over the prefix drops the old mask with it.
  write_bytes(mask, good);
  MegatronWriter w(prefix, TokenType::I32);
  const int32_t ids[3] = {1, 2, 3};
  w.add_document(ids, 3);
  w.commit();
  EXPECT_FALSE(open_dataset(prefix, "megatron")->has_loss_mask());
}

}  // namespace
}  // namespace strata::data
