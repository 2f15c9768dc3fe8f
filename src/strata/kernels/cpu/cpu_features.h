// What this CPU can do, detected at run time (CPUID, and the ISA oneDNN dispatches to, which
// also knows whether the OS enabled AMX), and which path bf16 matrix multiplies take on it.
// Machines differ from run to run: nothing here is assumed at build time.
#pragma once

#include <string>
#include <vector>

namespace strata::kernels {

struct CpuFeatures {
  std::string model;  // the CPUID brand string, e.g. "Intel(R) Xeon(R) Platinum 8480+"
  bool avx2 = false, fma = false, avx512f = false, avx512_vnni = false, avx512_bf16 = false,
       amx_tile = false, amx_bf16 = false;
  std::string onednn_isa;  // the instruction set oneDNN's kernels use, e.g. "avx512_core_amx"
  // A bf16 dot product the CPU has and oneDNN dispatches to (AMX also needs the OS's consent,
  // which oneDNN's effective ISA reflects).
  bool native_bf16() const;
  // oneDNN 2.6 builds a bf16 matmul at all (natively or emulated): from AVX-512 on; on a CPU
  // with AVX2 only it has none, and bf16 products can only be widened.
  bool onednn_bf16() const;
  // The flags above that are present, space-separated ("avx2 fma avx512f ...").
  std::string flags() const;
};
const CpuFeatures& cpu_features();

// How a bf16 × bf16 matmul runs. Native: oneDNN's bf16 kernels, only where the CPU has a bf16
// dot product (AVX512_BF16 or AMX-BF16) — elsewhere oneDNN 2.6 still builds a bf16 matmul but
// emulates it several times slower than fp32. Widened: the operands are widened to fp32 (exact)
// and the fp32 result rounded to bf16 where the output is bf16, so the math is that of a bf16
// GEMM with fp32 accumulation at fp32 GEMM speed.
enum class Bf16Matmul { Native, Widened };

// Detected once; STRATA_BF16_MATMUL=native|widened in the environment overrides the detection
// (to measure or test either path on any CPU that has it).
Bf16Matmul bf16_matmul_path();
// The paths this CPU can run: Widened always, Native where oneDNN builds a bf16 matmul.
std::vector<Bf16Matmul> bf16_matmul_paths();
// Forces a path of bf16_matmul_paths() for this process from now on (tests); later matmuls follow
// it.
void set_bf16_matmul_path(Bf16Matmul path);
const char* bf16_matmul_path_name(Bf16Matmul path);
// One line for logs and results files: model, flags, oneDNN ISA, bf16 path and why.
std::string describe_cpu();

}  // namespace strata::kernels
