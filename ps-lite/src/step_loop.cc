#include "step_loop.h"

#include "common/simd.h"

#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace ps {
namespace {

constexpr int64_t kAhead = 8;  // rows are scattered: start loading one this far ahead

// The loop itself, inlined into each version below and compiled for its instruction set:
// Adam's two divisions and square root per float make it compute-bound, and 16-float vectors
// take about half the time of SSE2's 4.
inline __attribute__((always_inline)) void StepBody(const hetu::optim::Config& cfg, float lr, const StepRowsView& t,
                                                    const int64_t* keys, int64_t b, int64_t e, const float* grads,
                                                    const int64_t* counts) {
  const int64_t w = t.width, sw = t.state_width, row_bytes = w * hetu::storage::bytes(t.storage);
  char* const values = static_cast<char*>(t.values);
  std::vector<float> wide(t.storage == hetu::storage::kF32 ? 0 : w);  // a 16-bit row, widened
  hetu::optim::BiasCache bias;
  for (int64_t i = b; i < e; ++i) {
    if (i + kAhead < e) {  // to be written: prefetch for writing
      const int64_t q = t.slot(keys[i + kAhead]);
      const char* row = values + q * row_bytes;
      for (int64_t k = 0; k < row_bytes; k += 64) __builtin_prefetch(row + k, 1);
      const char* st = reinterpret_cast<const char*>(t.state + q * sw);
      for (int64_t k = 0; k < sw * 4; k += 64) __builtin_prefetch(st + k, 1);
      t.counters->Prefetch(q);
    }
    const int64_t r = t.slot(keys[i]);
    float* state = sw ? t.state + r * sw : nullptr;
    char* row = values + r * row_bytes;
    t.counters->Stepped(r, counts ? counts[i] : 1, [&](int64_t* step) {
      if (wide.empty()) {
        hetu::optim::step_row(cfg, lr, reinterpret_cast<float*>(row), state, step, grads + i * w, w, &bias);
        return;
      }
      // step_row rounds to the storage type, so narrowing back is exact
      hetu::storage::widen_row(t.storage, row, wide.data(), w);
      hetu::optim::step_row(cfg, lr, wide.data(), state, step, grads + i * w, w, &bias);
      hetu::storage::narrow_row(t.storage, wide.data(), row, w);
    });
  }
}

#define HETU_STEP_VERSION(NAME, ATTR)                                                                          \
  ATTR void NAME(const hetu::optim::Config& cfg, float lr, const StepRowsView& t, const int64_t* keys, int64_t b, \
                 int64_t e, const float* grads, const int64_t* counts) {                                       \
    StepBody(cfg, lr, t, keys, b, e, grads, counts);                                                           \
  }
#if defined(__x86_64__)
HETU_STEP_VERSION(StepAvx512f, __attribute__((target("avx512f"))))
HETU_STEP_VERSION(StepAvx2, __attribute__((target("avx2"))))
#endif
HETU_STEP_VERSION(StepDefault, )
#undef HETU_STEP_VERSION

// The versions' names, comma-separated: all of them, or those this CPU can run.
std::string Names(bool runnable_only) {
  std::string s;
  for (const auto& v : SimdVariants())
    if (!runnable_only || SimdRunnable(v)) s += (s.empty() ? "" : ", ") + v;
  return s;
}

std::string ChooseVariant() {
  const char* env = std::getenv("HETU_SIMD");
  if (env && *env) {
    const std::string want = env;
    bool known = false;
    for (const auto& v : SimdVariants()) known = known || v == want;
    if (!known) throw std::runtime_error("HETU_SIMD='" + want + "': expected one of " + Names(false));
    if (!SimdRunnable(want))
      throw std::runtime_error("HETU_SIMD='" + want + "': this CPU cannot run it (it can run " + Names(true) + ")");
    return want;
  }
  for (const auto& v : SimdVariants())
    if (SimdRunnable(v)) return v;
  return "default";
}

}  // namespace

const std::vector<std::string>& SimdVariants() { return hetu::simd::variants(); }

bool SimdRunnable(const std::string& variant) { return hetu::simd::runnable(variant); }

const std::string& SimdVariant() {
  static const std::string chosen = ChooseVariant();
  return chosen;
}

StepLoopFn StepLoopOf(const std::string& variant) {
  if (!SimdRunnable(variant)) throw std::invalid_argument("HETU_SIMD: this CPU cannot run '" + variant + "'");
#if defined(__x86_64__)
  if (variant == "avx512f") return StepAvx512f;
  if (variant == "avx2") return StepAvx2;
#endif
  return StepDefault;
}

}  // namespace ps
