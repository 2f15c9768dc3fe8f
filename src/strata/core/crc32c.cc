#include "strata/core/crc32c.h"

#include <array>
#include <bit>
#include <cstring>

#include "strata/core/check.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace strata {

namespace {

constexpr uint32_t kPoly = 0x82F63B78;  // x^32 + x^28 + x^27 + ... + 1, bit-reversed

using ByteTables = std::array<std::array<uint32_t, 256>, 8>;

// tables[0][b]: the register after feeding byte b into a zero register; tables[k][b]: the same
// followed by k zero bytes. Slicing-by-8 looks up all eight bytes of a word at once.
constexpr ByteTables make_byte_tables() {
  ByteTables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t r = b;
    for (int i = 0; i < 8; ++i) r = (r & 1) ? (r >> 1) ^ kPoly : r >> 1;
    t[0][b] = r;
  }
  for (size_t k = 1; k < 8; ++k) {
    for (size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  }
  return t;
}
constexpr ByteTables kByteTables = make_byte_tables();

uint64_t load_le64(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  if constexpr (std::endian::native == std::endian::big) w = __builtin_bswap64(w);
  return w;
}

#if defined(__x86_64__)

// a·b mod P for polynomials in the reflected representation (x^0 is bit 31).
constexpr uint32_t multiply_mod_p(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return product;
}

// x^(8·bytes) mod P: the operator that appends `bytes` zero bytes to a raw CRC register.
constexpr uint32_t zeros_operator(size_t bytes) {
  uint32_t result = 1u << 31, power = 1u << (31 - 8);  // x^0, x^8
  for (; bytes != 0; bytes >>= 1) {
    if (bytes & 1) result = multiply_mod_p(result, power);
    power = multiply_mod_p(power, power);
  }
  return result;
}

// Appending zeros is linear in the register, so four byte-indexed tables apply it to all 32 bits.
using ShiftTables = std::array<std::array<uint32_t, 256>, 4>;
constexpr ShiftTables make_shift_tables(size_t bytes) {
  const uint32_t op = zeros_operator(bytes);
  std::array<uint32_t, 32> bit{};
  for (int i = 0; i < 32; ++i) bit[size_t(i)] = multiply_mod_p(op, 1u << i);
  ShiftTables t{};
  for (size_t j = 0; j < 4; ++j) {
    for (uint32_t b = 0; b < 256; ++b) {
      for (size_t k = 0; k < 8; ++k) {
        if (b >> k & 1) t[j][b] ^= bit[8 * j + k];
      }
    }
  }
  return t;
}

uint32_t shift(const ShiftTables& t, uint32_t r) {
  return t[0][r & 0xff] ^ t[1][r >> 8 & 0xff] ^ t[2][r >> 16 & 0xff] ^ t[3][r >> 24];
}

// The crc32 instruction has a latency of 3 cycles and a throughput of 1 per cycle: three
// independent streams over adjacent blocks keep it busy, and the shift tables join their CRCs.
constexpr size_t kLongBlock = 8192, kShortBlock = 256;
constexpr ShiftTables kShiftLong = make_shift_tables(kLongBlock);
constexpr ShiftTables kShiftShort = make_shift_tables(kShortBlock);

template <size_t kBlock>
__attribute__((target("sse4.2"))) uint64_t crc_three_way(uint64_t c0, const unsigned char*& p,
                                                         size_t& n, const ShiftTables& t) {
  for (; n >= 3 * kBlock; p += 3 * kBlock, n -= 3 * kBlock) {
    uint64_t c1 = 0, c2 = 0;
    for (size_t i = 0; i < kBlock; i += 8) {
      c0 = _mm_crc32_u64(c0, load_le64(p + i));
      c1 = _mm_crc32_u64(c1, load_le64(p + kBlock + i));
      c2 = _mm_crc32_u64(c2, load_le64(p + 2 * kBlock + i));
    }
    c0 = shift(t, uint32_t(c0)) ^ c1;
    c0 = shift(t, uint32_t(c0)) ^ c2;
  }
  return c0;
}

__attribute__((target("sse4.2"))) uint32_t crc_sse42(const unsigned char* p, size_t n,
                                                     uint32_t crc) {
  uint64_t c = ~crc;
  for (; n > 0 && reinterpret_cast<uintptr_t>(p) % 8 != 0; ++p, --n) {
    c = _mm_crc32_u8(uint32_t(c), *p);
  }
  c = crc_three_way<kLongBlock>(c, p, n, kShiftLong);
  c = crc_three_way<kShortBlock>(c, p, n, kShiftShort);
  for (; n >= 8; p += 8, n -= 8) c = _mm_crc32_u64(c, load_le64(p));
  for (; n > 0; ++p, --n) c = _mm_crc32_u8(uint32_t(c), *p);
  return ~uint32_t(c);
}

#endif  // __x86_64__

}  // namespace

uint32_t crc32c_table(const void* data, size_t n, uint32_t crc) {
  const auto& t = kByteTables;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t r = ~crc;
  for (; n >= 8; p += 8, n -= 8) {
    const uint64_t w = load_le64(p) ^ r;
    r = t[7][w & 0xff] ^ t[6][w >> 8 & 0xff] ^ t[5][w >> 16 & 0xff] ^ t[4][w >> 24 & 0xff] ^
        t[3][w >> 32 & 0xff] ^ t[2][w >> 40 & 0xff] ^ t[1][w >> 48 & 0xff] ^ t[0][w >> 56];
  }
  for (; n > 0; ++p, --n) r = t[0][(r ^ *p) & 0xff] ^ (r >> 8);
  return ~r;
}

bool crc32c_hardware_available() {
#if defined(__x86_64__)
  static const bool available = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return available;
#else
  return false;
#endif
}

uint32_t crc32c_hardware([[maybe_unused]] const void* data, [[maybe_unused]] size_t n,
                         [[maybe_unused]] uint32_t crc) {
#if defined(__x86_64__)
  STRATA_CHECK(crc32c_hardware_available(), "this CPU has no crc32 instruction (SSE4.2)");
  return crc_sse42(static_cast<const unsigned char*>(data), n, crc);
#else
  STRATA_FAIL("crc32c_hardware: this build has no crc32 instruction path (x86-64 only)");
#endif
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  if (crc32c_hardware_available())
    return crc_sse42(static_cast<const unsigned char*>(data), n, crc);
#endif
  return crc32c_table(data, n, crc);
}

}  // namespace strata
