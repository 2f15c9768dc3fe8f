#include "strata/kernels/cpu/cpu_features.h"

#include <cpuid.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <dnnl.hpp>

#include "strata/core/check.h"

namespace strata::kernels {

namespace {

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub) {
  Regs r;
  if (__get_cpuid_max(leaf & 0x80000000u, nullptr) < leaf) return r;
  __cpuid_count(leaf, sub, r.a, r.b, r.c, r.d);
  return r;
}

bool bit(unsigned reg, int n) {
  return ((reg >> n) & 1u) != 0;
}

std::string brand() {
  char s[49] = {};
  for (unsigned i = 0; i < 3; ++i) {
    const Regs r = cpuid(0x80000002u + i, 0);
    std::memcpy(s + 16 * i, &r, 16);
  }
  std::string out(s);
  const size_t first = out.find_first_not_of(' ');
  return first == std::string::npos ? "unknown CPU" : out.substr(first);
}

const char* isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic:
      return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "generic";
  }
}

CpuFeatures detect() {
  CpuFeatures f;
  f.model = brand();
  const Regs l1 = cpuid(1, 0), l7 = cpuid(7, 0), l71 = cpuid(7, 1);
  f.fma = bit(l1.c, 12);
  f.avx2 = bit(l7.b, 5);
  f.avx512f = bit(l7.b, 16);
  f.avx512_vnni = bit(l7.c, 11);
  f.avx512_bf16 = bit(l71.a, 5);
  f.amx_bf16 = bit(l7.d, 22);
  f.amx_tile = bit(l7.d, 24);
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  f.onednn_isa = isa_name(isa);
  return f;
}

Bf16Matmul initial_path() {
  if (const char* env = std::getenv("STRATA_BF16_MATMUL"); env != nullptr && *env != '\0') {
    if (std::strcmp(env, "native") == 0) {
      if (!cpu_features().onednn_bf16()) {
        STRATA_INPUT_FAIL("STRATA_BF16_MATMUL=native: oneDNN has no bf16 matmul on this CPU ",
                          "(oneDNN ISA ", cpu_features().onednn_isa,
                          "); use widened, or leave it unset to detect the CPU");
      }
      return Bf16Matmul::Native;
    }
    if (std::strcmp(env, "widened") == 0) return Bf16Matmul::Widened;
    STRATA_INPUT_FAIL("STRATA_BF16_MATMUL=", env,
                      " is not a bf16 matmul path; use native, widened, or leave it unset to "
                      "detect the CPU");
  }
  return cpu_features().native_bf16() ? Bf16Matmul::Native : Bf16Matmul::Widened;
}

std::atomic<int>& forced_path() {
  static std::atomic<int> p{-1};
  return p;
}

}  // namespace

bool CpuFeatures::native_bf16() const {
  return (avx512_bf16 || amx_bf16) &&
         (onednn_isa == "avx512_core_bf16" || onednn_isa == "avx512_core_amx");
}

bool CpuFeatures::onednn_bf16() const {
  return onednn_isa.rfind("avx512_core", 0) == 0;
}

std::string CpuFeatures::flags() const {
  std::string s;
  const std::pair<bool, const char*> all[] = {{avx2, "avx2"},
                                              {fma, "fma"},
                                              {avx512f, "avx512f"},
                                              {avx512_vnni, "avx512_vnni"},
                                              {avx512_bf16, "avx512_bf16"},
                                              {amx_tile, "amx_tile"},
                                              {amx_bf16, "amx_bf16"}};
  for (const auto& [on, name] : all) {
    if (!on) continue;
    if (!s.empty()) s += ' ';
    s += name;
  }
  return s.empty() ? "none of avx2/avx512" : s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

Bf16Matmul bf16_matmul_path() {
  static const Bf16Matmul detected = initial_path();
  const int forced = forced_path().load(std::memory_order_relaxed);
  return forced < 0 ? detected : Bf16Matmul(forced);
}

std::vector<Bf16Matmul> bf16_matmul_paths() {
  if (!cpu_features().onednn_bf16()) return {Bf16Matmul::Widened};
  return {Bf16Matmul::Native, Bf16Matmul::Widened};
}

void set_bf16_matmul_path(Bf16Matmul path) {
  const std::vector<Bf16Matmul> paths = bf16_matmul_paths();
  STRATA_CHECK(std::find(paths.begin(), paths.end(), path) != paths.end(), "no ",
               bf16_matmul_path_name(path), " bf16 matmul on this CPU (oneDNN ISA ",
               cpu_features().onednn_isa, ")");
  forced_path().store(int(path), std::memory_order_relaxed);
}

const char* bf16_matmul_path_name(Bf16Matmul path) {
  return path == Bf16Matmul::Native ? "native" : "widened";
}

std::string describe_cpu() {
  const CpuFeatures& f = cpu_features();
  const Bf16Matmul p = bf16_matmul_path();
  std::string why;
  if (p == Bf16Matmul::Native) {
    why = f.native_bf16() ? "native: the CPU has a bf16 dot product"
                          : "native (forced: emulated by oneDNN on this CPU)";
  } else {
    why = f.native_bf16() ? "widened to fp32 (forced)"
                          : "widened to fp32: no AVX512_BF16/AMX-BF16 on this CPU";
  }
  return f.model + " | " + f.flags() + " | oneDNN ISA " + f.onednn_isa + " | bf16 matmul " + why;
}

}  // namespace strata::kernels
