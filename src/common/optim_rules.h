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
#include <cstdint>

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
    case kAdamW: {
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

}  // namespace optim
}  // namespace hetu
