// fuzz-sources: src/strata/core/crc32c.cc src/strata/core/check.cc
//
// CRC-32C: the hardware and table paths agree on any bytes, split anywhere (the first two bytes
// of the input choose the split), and continuing a CRC equals computing it whole.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "strata/core/crc32c.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t cut = (size_t(data[0]) << 8 | data[1]) % (size - 1);
  const uint8_t* p = data + 2;
  const size_t n = size - 2;
  const uint32_t table = strata::crc32c_table(p, n);
  const uint32_t split = strata::crc32c(p + cut, n - cut, strata::crc32c(p, cut));
  const uint32_t hardware =
      strata::crc32c_hardware_available() ? strata::crc32c_hardware(p, n) : table;
  if (table != split || table != hardware) {
    std::fprintf(stderr, "crc32c: table %08x, split at %zu %08x, hardware %08x\n", table, cut,
                 split, hardware);
    std::abort();
  }
  return 0;
}
