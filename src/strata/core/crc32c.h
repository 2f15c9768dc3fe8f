// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of iSCSI, ext4 and
// Snappy/TFRecord framing: checkpoints store it per tensor to catch torn or corrupted bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata {

// The CRC of data[0, n) continuing from crc, the CRC of the bytes before them (0 for none), so
// crc32c(b, nb, crc32c(a, na)) == crc32c(a‖b). crc32c("123456789", 9) == 0xE3069283.
// Uses the SSE4.2 crc32 instruction when the CPU has it, else crc32c_table.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// The two implementations crc32c picks between, callable directly by tests and benchmarks.
// Slicing-by-8 tables: about 1 byte per cycle on any CPU.
uint32_t crc32c_table(const void* data, size_t n, uint32_t crc = 0);
// Three interleaved streams of the crc32 instruction, 8 bytes each: several GB/s. Only where
// crc32c_hardware_available().
uint32_t crc32c_hardware(const void* data, size_t n, uint32_t crc = 0);
bool crc32c_hardware_available();

}  // namespace strata
