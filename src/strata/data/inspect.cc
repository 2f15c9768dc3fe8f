#include "strata/data/inspect.h"

#include <algorithm>
#include <vector>

#include "strata/data/mapped_token_dataset.h"

namespace strata::data {

namespace {

void add_name(std::string& list, const std::string& name) {
  if (list.empty()) {
    list = name;
  } else if (("+" + list + "+").find("+" + name + "+") == std::string::npos) {
    list += "+" + name;
  }
}

}  // namespace

DatasetSummary summarize_dataset(const std::string& path, const std::string& format,
                                 std::optional<int32_t> delimiter) {
  const std::unique_ptr<TokenDataset> ds = open_dataset(path, format);
  const auto* mapped = dynamic_cast<const MappedTokenDataset*>(ds.get());
  DatasetSummary s;
  s.tokens = ds->num_tokens();
  s.max_id = ds->vocab_bound() - 1;
  if (!mapped) return s;
  constexpr int64_t kChunk = int64_t(1) << 20;
  std::vector<int32_t> buf;
  int64_t first = 0;
  for (const MappedTokenDataset::Part& part : mapped->parts()) {
    add_name(s.format, part.format);
    add_name(s.token_type, token_type_name(part.type));
    if (part.documents >= 0) {
      s.documents += part.documents;
    } else if (part.tokens > 0) {
      if (!delimiter) {
        int32_t t;
        ds->read(first, 1, &t);
        delimiter = t;
      }
      for (int64_t b = first; b < first + part.tokens; b += kChunk) {
        const int64_t n = std::min(kChunk, first + part.tokens - b);
        buf.resize(size_t(n));
        ds->read(b, n, buf.data());
        s.documents += std::count(buf.begin(), buf.end(), *delimiter);
      }
    }
    first += part.tokens;
  }
  s.delimiter = delimiter;
  if (ds->has_loss_mask()) {
    s.trained = 0;
    std::vector<uint8_t> mask;
    for (int64_t b = 0; b < s.tokens; b += kChunk) {
      mask.resize(size_t(std::min(kChunk, s.tokens - b)));
      ds->read_mask(b, int64_t(mask.size()), mask.data());
      s.trained += std::count(mask.begin(), mask.end(), uint8_t(1));
    }
  }
  return s;
}

}  // namespace strata::data
