// fuzz-sources: src/strata/core/safetensors.cc src/strata/core/check.cc
//
// The safetensors header parser on arbitrary bytes, taken as a whole file. An InputError is the
// expected answer to garbage; a finding is a crash, a sanitizer report, any other exception, or
// an index the parser accepted that breaks what it promises (run by scripts/fuzz.sh).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "strata/core/check.h"
#include "strata/core/safetensors.h"

namespace {

void require(bool ok, const char* promise) {
  if (!ok) {
    std::fprintf(stderr, "accepted index breaks its promise: %s\n", promise);
    std::abort();
  }
}

// Every tensor lies inside the data section, its size is numel × dtype size, no two overlap, and
// parsing just the header bytes gives the same index.
void check_index(const strata::SafetensorsIndex& index, const char* file, size_t size) {
  require(index.file_size == size && index.data_start >= 8 && index.data_start <= size,
          "data section within the file");
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, e] : index.tensors) {
    require(e.offset >= index.data_start && e.bytes <= size - e.offset, "tensor within the file");
    require(uint64_t(e.numel()) * strata::safetensors_dtype_bytes(e.dtype) == e.bytes,
            "bytes == numel × dtype size");
    if (e.bytes != 0) {
      // ASan reports these if the bounds above were wrong.
      volatile char first = file[e.offset], last = file[e.offset + e.bytes - 1];
      (void)first;
      (void)last;
      ranges.emplace_back(e.offset, e.offset + e.bytes);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    require(ranges[i].first >= ranges[i - 1].second, "no overlap");
  }
  const strata::SafetensorsIndex head =
      strata::parse_safetensors_header(file, size_t(index.data_start), size, "fuzz");
  require(head.tensors.size() == index.tensors.size() && head.metadata == index.metadata,
          "the header alone parses the same");
}

// The end of the last tensor, or 0 if the file holds none with bytes.
uint64_t data_end(const strata::SafetensorsIndex& index) {
  uint64_t end = 0;
  for (const auto& [name, e] : index.tensors) end = std::max(end, e.offset + e.bytes);
  return end;
}

}  // namespace

// A file cut short of its last tensor's end must be refused (check_index aborts if it is not).
// Mutations seldom cut exactly there, and without this the fuzzer would not notice a missing
// bound: reading past the cut stays inside libFuzzer's buffer, where ASan cannot see it.
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const char* file = reinterpret_cast<const char*>(data);
  uint64_t end = 0;
  try {
    const strata::SafetensorsIndex index = strata::parse_safetensors_header(file, size, "fuzz");
    check_index(index, file, size);
    end = data_end(index);
  } catch (const strata::InputError&) {
  }
  if (end > 0) {
    try {
      const size_t cut = size_t(end - 1);
      check_index(strata::parse_safetensors_header(file, cut, "fuzz"), file, cut);
      require(false, "a file cut inside its last tensor is refused");
    } catch (const strata::InputError&) {
    }
  }
  return 0;
}
