// The vector widths that hetu's per-CPU loops are compiled for (the servers' step loop,
// ps-lite/src/step_loop.cc; the batched small products, src/kernels/batched_matmul.cpp), best
// first, and whether this CPU can run one. HETU_SIMD names one of them for both.
#pragma once
#include <string>
#include <vector>

namespace hetu {
namespace simd {

inline const std::vector<std::string>& variants() {
  static const std::vector<std::string> all{"avx512f", "avx2", "default"};
  return all;
}

inline bool runnable(const std::string& variant) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (variant == "avx512f") return __builtin_cpu_supports("avx512f");
  if (variant == "avx2") return __builtin_cpu_supports("avx2");
#endif
  return variant == "default";
}

}  // namespace simd
}  // namespace hetu
