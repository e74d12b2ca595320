// Row-wise optimizer steps, shared by every place that updates parameters: hetu's local
// dense and sparse updates, the parameter server's tables and the worker caches. One
// definition keeps a parameter-server run bit-compatible with a single-process run; the rules'
// arithmetic is in optim_step.h, which the GPU kernels compile too.
//
// A "row" is `width` contiguous floats. A dense tensor is updated as one row of its full size
// (element-wise kinds only: see `rowwise`). Optimizer state lives beside the row:
// `state_width(kind, width)` floats, plus a per-row step count (used by Adam's bias correction;
// each row counts its own steps, which for a dense tensor is the global step).
//
// The registry (kHyperparameters, kKinds) is where every other place reads the kinds from:
// hetu._C binds it (src/bindings/optim.cpp), and hetu.optim, hetu.ps, the CLI and the benches
// take their names, hyperparameters and defaults from there.
#pragma once
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "common/optim_step.h"
#include "common/storage.h"

namespace hetu {
namespace optim {

static_assert(storage::kF32 == Config{}.storage, "Config's default storage is float32");

// A hyperparameter: its name (Python's keyword) and the float of Config that holds it.
struct Hyperparameter {
  const char* name;
  float Config::*member;
};
constexpr Hyperparameter kHyperparameters[] = {
    {"momentum", &Config::momentum}, {"beta1", &Config::beta1}, {"beta2", &Config::beta2},
    {"eps", &Config::eps},           {"l2reg", &Config::l2reg}, {"weight_decay", &Config::weight_decay},
    {"catch_up_lr", &Config::catch_up_lr},
};
constexpr int kNumHyperparameters = sizeof(kHyperparameters) / sizeof(kHyperparameters[0]);

// A hyperparameter a kind reads, with the kind's default: Config's, unless the kind has its own.
struct Setting {
  float Config::*member;
  float value;
};
constexpr Setting uses(float Config::*member) { return {member, Config{}.*member}; }
constexpr Setting uses(float Config::*member, float own_default) { return {member, own_default}; }

// A kind as Python names it: the hyperparameters it reads (then empty Settings), and the kind
// dense tensors take under it (itself, or a row-wise kind's element-wise sibling).
struct KindInfo {
  const char* name;
  Kind kind;
  Kind dense_kind;
  Setting settings[kNumHyperparameters];
};
constexpr KindInfo kKinds[] = {
    {"sgd", kSGD, kSGD, {uses(&Config::l2reg)}},
    {"momentum", kMomentum, kMomentum, {uses(&Config::momentum), uses(&Config::l2reg)}},
    {"nesterov", kNesterov, kNesterov, {uses(&Config::momentum), uses(&Config::l2reg)}},
    {"adagrad", kAdaGrad, kAdaGrad, {uses(&Config::eps), uses(&Config::l2reg)}},
    {"adam", kAdam, kAdam, {uses(&Config::beta1), uses(&Config::beta2), uses(&Config::eps), uses(&Config::l2reg)}},
    // AdamW decays by 0.01 unless told otherwise (torch's default); a server table made by name
    // alone keeps Config's 0.
    {"adamw", kAdamW, kAdamW,
     {uses(&Config::beta1), uses(&Config::beta2), uses(&Config::eps), uses(&Config::weight_decay, 0.01f)}},
    {"rowwise_adagrad", kRowwiseAdaGrad, kAdaGrad, {uses(&Config::eps), uses(&Config::l2reg)}},
    // Dense tensors are stepped every step anyway: they take plain Adam and AdamW.
    {"adam_catchup", kAdamCatchUp, kAdam,
     {uses(&Config::beta1), uses(&Config::beta2), uses(&Config::eps), uses(&Config::l2reg),
      uses(&Config::catch_up_lr)}},
    {"adamw_catchup", kAdamWCatchUp, kAdamW,
     {uses(&Config::beta1), uses(&Config::beta2), uses(&Config::eps), uses(&Config::weight_decay, 0.01f),
      uses(&Config::catch_up_lr)}},
};

constexpr int kNumKinds = sizeof(kKinds) / sizeof(kKinds[0]);

constexpr bool kinds_in_order() {
  for (int k = 0; k < kNumKinds; ++k)
    if (kKinds[k].kind != k || rowwise(kKinds[k].dense_kind)) return false;
  return true;
}
static_assert(kinds_in_order(), "kKinds lists every Kind once, in order, each with an element-wise dense kind");

// Adam's bias corrections for one step count, kept by a caller that steps many rows: rows
// stepped together mostly share their count, and two pow() per 128-float row cost as much as
// the row's arithmetic. The values are those computed without it, bit for bit.
struct BiasCache {
  int64_t t = -1;
  float bc1 = 0.0f, bc2 = 0.0f;
};

// One step of one row. w: the row; state: state_width(kind, width) floats (may be null for SGD);
// step: the row's step count, incremented here; g: the row's summed gradient; cache: optional,
// used by one thread at a time. The kinds hetu ships loop over their own rule, so that each
// loop vectorizes; any other element-wise kind goes through step_element.
inline void step_row(const Config& c, float lr, float* w, float* state, int64_t* step, const float* g,
                     int64_t width, BiasCache* cache = nullptr) {
  const int64_t t = ++*step;
  switch (c.kind) {
    case kSGD:
      for (int64_t i = 0; i < width; ++i) sgd(c, lr, w[i], g[i]);
      break;
    case kMomentum:
    case kNesterov:
      for (int64_t i = 0; i < width; ++i) momentum(c, lr, w[i], state[i], g[i]);
      break;
    case kAdaGrad:
      for (int64_t i = 0; i < width; ++i) adagrad(c, lr, w[i], state[i], g[i]);
      break;
    case kAdam:
    case kAdamW:
    case kAdamCatchUp:
    case kAdamWCatchUp: {
      BiasCache local;
      BiasCache& bc = cache ? *cache : local;
      if (bc.t != t) {
        bc.bc1 = bias_correction(c.beta1, t);
        bc.bc2 = bias_correction(c.beta2, t);
        bc.t = t;
      }
      const float bc1 = bc.bc1, bc2 = bc.bc2;
      float* m = state;
      float* v = state + width;
      for (int64_t i = 0; i < width; ++i) adam(c, lr, w[i], m[i], v[i], g[i], bc1, bc2);
      break;
    }
    default:
      if (rowwise(c.kind)) {
        step_rowwise(c, lr, w, state, g, width);
      } else {
        for (int64_t i = 0; i < width; ++i) step_element(c, lr, w + i, state ? state + i : nullptr, width, g[i], t);
      }
  }
  storage::round_row(c.storage, w, width);
}

// ---- catch-up kinds (docs/design.md section 4) -------------------------------------------------
//
// A row's step count s is the global step it was last brought to (0: never). Before step t reads
// or steps it, the steps u = s+1 .. t-1 it skipped are applied as dense Adam applies them, with
// zero gradient, in order, each rounded to the storage type: so a row caught up here equals the
// row stepped at every step, bit for bit, and every copy of a row (a server's, a cache's) caught
// up to the same step is the same. Without l2reg or decoupled decay a skipped step only decays
// the moments, and the value moves by terms shrinking by about beta1 / sqrt(beta2) a step: past
// catch_up_horizon() steps they are below float32 rounding, and the rest decays m and v at once.
// A row whose moments are zero (never stepped) does not move at all then.

// Adam's bias corrections of steps 1, 2, ..., as bias_correction computes them, kept once per
// process and (beta1, beta2): catching a row up applies up to a few hundred steps, and two pow() a
// step cost more than the step's own arithmetic on a narrow row. Entries are written once, in
// chunks that never move, so readers need no lock; steps past kChunks * kChunk take pow().
class BiasCorrections {
 public:
  // The corrections of (beta1, beta2), computed up to step `upto` first.
  static const BiasCorrections& Of(float beta1, float beta2, int64_t upto) {
    static std::mutex mu;
    static std::map<std::pair<float, float>, std::unique_ptr<BiasCorrections>> all;
    std::lock_guard<std::mutex> lock(mu);
    auto& slot = all[{beta1, beta2}];
    if (!slot) slot.reset(new BiasCorrections(beta1, beta2));
    slot->Extend(upto);
    return *slot;
  }
  float bc1(int64_t u) const {
    return u <= known_.load(std::memory_order_acquire) ? chunks_[u / kChunk][2 * (u % kChunk)]
                                                        : bias_correction(beta1_, u);
  }
  float bc2(int64_t u) const {
    return u <= known_.load(std::memory_order_acquire) ? chunks_[u / kChunk][2 * (u % kChunk) + 1]
                                                        : bias_correction(beta2_, u);
  }

 private:
  static constexpr int64_t kChunk = 1 << 16, kChunks = 64;  // 4M steps, 32 MiB at most
  BiasCorrections(float beta1, float beta2) : beta1_(beta1), beta2_(beta2) {}
  void Extend(int64_t upto) {
    upto = upto < kChunk * kChunks - 1 ? upto : kChunk * kChunks - 1;
    const int64_t known = known_.load(std::memory_order_relaxed);
    for (int64_t u = known + 1; u <= upto; ++u) {
      auto& chunk = chunks_[u / kChunk];
      if (!chunk) chunk.reset(new float[2 * kChunk]);
      chunk[2 * (u % kChunk)] = bias_correction(beta1_, u);
      chunk[2 * (u % kChunk) + 1] = bias_correction(beta2_, u);
    }
    if (upto > known) known_.store(upto, std::memory_order_release);
  }
  const float beta1_, beta2_;
  std::atomic<int64_t> known_{0};  // steps 1 .. known_ are in the chunks
  std::array<std::unique_ptr<float[]>, kChunks> chunks_;
};

// The skipped steps applied one by one (the rest only decay the moments, and AdamW's row); 0:
// all of them. With l2reg the gradient l2reg * w keeps feeding the moments, so every skipped
// step is applied: a row's catch-up then costs as many steps as it skipped.
inline int64_t catch_up_horizon(const Config& c) {
  if (c.l2reg != 0.0f) return 0;
  const double ratio = static_cast<double>(c.beta1) / std::sqrt(static_cast<double>(c.beta2));
  if (!(ratio > 0.0 && ratio < 1.0)) return 0;
  // ratio^K < 2^-32: the terms left sum to less than 2^-24 of the first (ratio <= 0.95).
  return static_cast<int64_t>(std::ceil(-32.0 * std::log(2.0) / std::log(ratio))) + 1;
}

// Brings one row (float32 values, its m then v, its step count) to step `target` (callers go
// through CatchUp below, which finds `horizon` and `bias` once); `bias`:
// BiasCorrections::Of(c.beta1, c.beta2, target).
inline void catch_up_row(const Config& c, float* w, float* state, int64_t* step, int64_t target, int64_t width,
                         int64_t horizon, const BiasCorrections& bias) {
  const int64_t s = *step;
  if (s >= target) return;
  float* m = state;
  float* v = state + width;
  const float decay = c.kind == kAdamWCatchUp ? c.catch_up_lr * c.weight_decay : 0.0f;  // AdamW's, a step
  if (horizon > 0 && decay == 0.0f) {
    bool moving = false;
    for (int64_t i = 0; i < width && !moving; ++i) moving = m[i] != 0.0f || v[i] != 0.0f;
    if (!moving) {  // zero moments stay zero, and w - lr * 0 / (0 + eps) is w
      *step = target;
      return;
    }
  }
  const int64_t skipped = target - s;
  const int64_t applied = horizon > 0 && skipped > horizon ? horizon : skipped;
  for (int64_t u = s + 1; u <= s + applied; ++u) {
    const float bc1 = bias.bc1(u), bc2 = bias.bc2(u);
    for (int64_t i = 0; i < width; ++i) adam(c, c.catch_up_lr, w[i], m[i], v[i], 0.0f, bc1, bc2);
    storage::round_row(c.storage, w, width);
  }
  if (applied < skipped) {
    const double rest = static_cast<double>(skipped - applied);
    const float d1 = static_cast<float>(std::pow(static_cast<double>(c.beta1), rest));
    const float d2 = static_cast<float>(std::pow(static_cast<double>(c.beta2), rest));
    for (int64_t i = 0; i < width; ++i) {
      m[i] *= d1;
      v[i] *= d2;
    }
    if (decay != 0.0f) {  // AdamW's decay of the rest, at once: (1 - lr wd)^rest
      const float dw = static_cast<float>(std::pow(1.0 - static_cast<double>(decay), rest));
      for (int64_t i = 0; i < width; ++i) w[i] *= dw;
      storage::round_row(c.storage, w, width);
    }
  }
  *step = target;
}

// Brings rows of a catch-up kind to step `target`: the horizon and the bias corrections found
// once for all of them (a lookup of BiasCorrections takes a lock).
class CatchUp {
 public:
  CatchUp(const Config& c, int64_t target)
      : c_(c), target_(target), horizon_(catch_up_horizon(c)), bias_(BiasCorrections::Of(c.beta1, c.beta2, target)) {}
  // One row: float32 values, its m then v (state), its step count.
  void Row(float* w, float* state, int64_t* step, int64_t width) const {
    catch_up_row(c_, w, state, step, target_, width, horizon_, bias_);
  }

 private:
  const Config c_;
  const int64_t target_, horizon_;
  const BiasCorrections& bias_;
};

}  // namespace optim
}  // namespace hetu
