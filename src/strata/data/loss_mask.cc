#include "strata/data/loss_mask.h"

#include <cstring>
#include <filesystem>

#include "strata/core/check.h"

namespace strata::data {

void add_loss_mask(MappedTokenDataset& ds, const std::string& prefix, int64_t first, int64_t ntok) {
  const std::string path = prefix + ".lossmask";
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return;
  MappedFile file(path);
  const uint8_t* p = file.data();
  const int64_t size = file.size();
  STRATA_INPUT_CHECK(size >= kLossMaskHeaderBytes && std::memcmp(p, kLossMaskMagic, 8) == 0, path,
                     ": not a loss mask (it must start with \"STRLMASK\" and a 24-byte header); "
                     "re-create it with strata data prepare --jsonl, or remove it to train on "
                     "every token");
  uint64_t version = 0, count = 0;
  std::memcpy(&version, p + 8, 8);
  std::memcpy(&count, p + 16, 8);
  STRATA_INPUT_CHECK(version == 1, path, ": unsupported loss mask version ", version,
                     ", expected 1");
  STRATA_INPUT_CHECK(count == uint64_t(ntok) && size == kLossMaskHeaderBytes + ntok, path,
                     ": the mask holds ", count, " tokens in ", size - kLossMaskHeaderBytes,
                     " bytes, but ", prefix, ".bin holds ", ntok,
                     "; the mask does not belong to this dataset: re-create both with strata data "
                     "prepare");
  for (int64_t i = 0; i < ntok; ++i) {
    STRATA_INPUT_CHECK(p[kLossMaskHeaderBytes + i] <= 1, path, ": byte ", kLossMaskHeaderBytes + i,
                       " (token ", i, ") is ", int(p[kLossMaskHeaderBytes + i]),
                       "; a loss mask holds 0 or 1 per token");
  }
  const int index = ds.add_file(std::move(file));
  ds.add_mask(index, kLossMaskHeaderBytes, first, ntok);
}

LossMaskWriter::LossMaskWriter(const std::string& prefix) : file_(prefix + ".lossmask") {
  const uint64_t version = 1, count = 0;
  file_.write(kLossMaskMagic, 8);
  file_.write(&version, 8);
  file_.write(&count, 8);
}

void LossMaskWriter::append(const uint8_t* mask, int64_t n) {
  file_.write(mask, size_t(n));
  tokens_ += n;
}

void LossMaskWriter::commit() {
  const uint64_t count = uint64_t(tokens_);
  file_.write_at(16, &count, 8);
  file_.commit();
}

}  // namespace strata::data
