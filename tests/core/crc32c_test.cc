#include "strata/core/crc32c.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace strata {
namespace {

// The definition, one bit at a time.
uint32_t crc32c_bitwise(const unsigned char* p, size_t n, uint32_t crc) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1) ? (crc >> 1) ^ 0x82F63B78 : crc >> 1;
  }
  return ~crc;
}

std::vector<unsigned char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(gen());
  return v;
}

TEST(Crc32c, CheckValue) {
  const char* s = "123456789";
  EXPECT_EQ(crc32c(s, 9), 0xE3069283u);
  EXPECT_EQ(crc32c_table(s, 9), 0xE3069283u);
  if (crc32c_hardware_available()) {
    EXPECT_EQ(crc32c_hardware(s, 9), 0xE3069283u);
  }
  EXPECT_EQ(crc32c(s, 0), 0u);
}

// RFC 3720 (iSCSI) appendix B.4.
TEST(Crc32c, Rfc3720Vectors) {
  unsigned char zeros[32] = {}, ones[32], up[32], down[32];
  for (int i = 0; i < 32; ++i) {
    ones[i] = 0xff;
    up[i] = static_cast<unsigned char>(i);
    down[i] = static_cast<unsigned char>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros, 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones, 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up, 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down, 32), 0x113FDB5Cu);
}

TEST(Crc32c, TableMatchesBitwiseDefinition) {
  const auto data = random_bytes(4099, 1);
  for (size_t n : {0, 1, 7, 8, 9, 63, 64, 4099}) {
    EXPECT_EQ(crc32c_table(data.data(), n, 0x1234), crc32c_bitwise(data.data(), n, 0x1234)) << n;
  }
}

TEST(Crc32c, IncrementalEqualsWhole) {
  const auto data = random_bytes(100000, 2);
  const uint32_t whole = crc32c(data.data(), data.size());
  for (size_t cut : {size_t(0), size_t(1), size_t(5), size_t(8), size_t(767), size_t(24576),
                     size_t(50001), data.size()}) {
    const uint32_t head = crc32c(data.data(), cut);
    EXPECT_EQ(crc32c(data.data() + cut, data.size() - cut, head), whole) << "cut at " << cut;
    EXPECT_EQ(crc32c_table(data.data() + cut, data.size() - cut, crc32c_table(data.data(), cut)),
              whole)
        << "cut at " << cut;
  }
}

// Lengths around the 8-byte words and the 3×256 and 3×8192 interleaved blocks, at every
// alignment, from several starting CRCs.
TEST(Crc32c, HardwareAgreesWithTable) {
  if (!crc32c_hardware_available()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  const auto data = random_bytes((1 << 20) + 64, 3);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 80; ++n) lengths.push_back(n);
  for (size_t n : {767, 768, 769, 775, 776, 1543, 1544, 24575, 24576, 24577, 24576 + 768 + 13,
                   49152 + 767, 100003, 1 << 20}) {
    lengths.push_back(n);
  }
  for (size_t align = 0; align < 8; ++align) {
    for (size_t n : lengths) {
      for (uint32_t start : {0u, 0xffffffffu, 0xE3069283u}) {
        const unsigned char* p = data.data() + align;
        ASSERT_EQ(crc32c_hardware(p, n, start), crc32c_table(p, n, start))
            << "length " << n << ", alignment " << align << ", start " << start;
      }
    }
  }
}

// Prints the throughput of each path (the hardware one should reach several GB/s) and checks
// that they agree on a large buffer.
TEST(Crc32c, Throughput256MiB) {
  const size_t n = size_t(256) << 20;
  std::vector<unsigned char> data(n);
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<unsigned char>(i * 2654435761u >> 13);
  auto measure = [&](const char* name, uint32_t (*f)(const void*, size_t, uint32_t)) {
    const auto t0 = std::chrono::steady_clock::now();
    const uint32_t crc = f(data.data(), n, 0);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("crc32c %-8s 256 MiB in %.3f s: %.2f GB/s\n", name, s, double(n) / s / 1e9);
    return crc;
  };
  const uint32_t table = measure("table", crc32c_table);
  if (crc32c_hardware_available()) {
    EXPECT_EQ(measure("hardware", crc32c_hardware), table);
  }
  EXPECT_EQ(crc32c(data.data(), n), table);
}

}  // namespace
}  // namespace strata
