// The optimizer rules' arithmetic, one element (or one row) at a time: the one definition that
// g++ compiles for the host (hetu's updates, the servers, the caches: optim_rules.h loops over
// it) and NVRTC for the GPU (hetu/optim.py prepends this file, installed as
// hetu/include/optim_step.h, to its kernels). Written so that both round alike: the host build
// has -ffp-contract=off and the kernels --fmad=false, and every rule keeps one order of
// operations. Self-contained (no project headers; no standard headers under NVRTC) and C++11.
//
// Adding a kind: its Kind value, its arithmetic below, a case in step_element (element-wise) or
// in step_rowwise and rowwise() (row-wise), its state_width if it keeps state, and its entry in
// optim_rules.h's kKinds (name, hyperparameters, defaults). A hyperparameter: a float of Config
// and its line in optim_rules.h's kHyperparameters. Python, the CLI and the kernels follow.
#ifndef HETU_COMMON_OPTIM_STEP_H_  // a guard, not #pragma once: NVRTC sees this as its main file
#define HETU_COMMON_OPTIM_STEP_H_

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define HETU_HOST_DEVICE __host__ __device__
#else
#define HETU_HOST_DEVICE
#endif
#if !defined(__CUDACC_RTC__)
#include <cmath>
#include <cstdint>
#endif

namespace hetu {
namespace optim {

#if defined(__CUDACC_RTC__)
typedef long long i64;
#else
typedef std::int64_t i64;
#endif

enum Kind : int {
  kSGD = 0,
  kMomentum = 1,
  kNesterov = 2,
  kAdaGrad = 3,
  kAdam = 4,
  kAdamW = 5,
  kRowwiseAdaGrad = 6,
  // Adam and AdamW whose table rows take every step, dense Adam's: the zero-gradient steps a
  // row was not read at are applied when it is next read or stepped (optim_rules.h: catch_up_row).
  kAdamCatchUp = 7,
  kAdamWCatchUp = 8
};

// A kind and its hyperparameters, with their defaults. optim_rules.h's kHyperparameters names
// the floats (Python reads them from there); which kinds read which is in its kKinds.
struct Config {
  int kind = kSGD;
  float momentum = 0.9f;      // Momentum, Nesterov
  float beta1 = 0.9f;         // Adam, AdamW
  float beta2 = 0.999f;       // Adam, AdamW
  float eps = 1e-7f;          // AdaGrad, Adam, AdamW, row-wise AdaGrad
  float l2reg = 0.0f;         // added to the gradient: g + l2reg * w (all kinds but AdamW)
  float weight_decay = 0.0f;  // AdamW's decoupled decay
  // The catch-up kinds' learning rate, constant: the rate of the steps a row skipped, which a
  // server applies when the row is next read (no message carries the rate of a past step).
  float catch_up_lr = 0.0f;
  // The rows' storage type (hetu::storage::Type, 0 being float32): a step computes in float32
  // and rounds the row to it. Embedding rows only; dense tensors are float32.
  int storage = 0;
};

// Whether the kind's state belongs to the row as a whole rather than to its elements. Such a
// rule steps embedding rows only: a dense tensor cut into pieces (threads, server shards) would
// change its result, so dense tensors take the optimizer's element-wise dense rule instead.
HETU_HOST_DEVICE constexpr bool rowwise(int kind) { return kind == kRowwiseAdaGrad; }

// Whether a row's step count is the global step it was last brought to, and the steps between
// are applied with zero gradient before it is read or stepped (optim_rules.h: catch_up_row).
HETU_HOST_DEVICE constexpr bool catches_up(int kind) { return kind == kAdamCatchUp || kind == kAdamWCatchUp; }

// Floats of optimizer state beside a row of `width` floats: whole arrays of `width` floats for
// the element-wise kinds (Adam's m, then v), one accumulator for row-wise AdaGrad.
HETU_HOST_DEVICE inline i64 state_width(int kind, i64 width) {
  switch (kind) {
    case kMomentum:
    case kNesterov:
    case kAdaGrad: return width;
    case kAdam:
    case kAdamW:
    case kAdamCatchUp:
    case kAdamWCatchUp: return 2 * width;
    case kRowwiseAdaGrad: return 1;
    default: return 0;
  }
}

HETU_HOST_DEVICE inline float square_root(float x) {
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

// Adam's bias correction 1 - beta^t, computed in double.
HETU_HOST_DEVICE inline float bias_correction(float beta, i64 t) {
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
  return static_cast<float>(1.0 - pow(static_cast<double>(beta), static_cast<double>(t)));
#else
  return static_cast<float>(1.0 - std::pow(static_cast<double>(beta), static_cast<double>(t)));
#endif
}

// ---- element-wise rules: one element w, its gradient g and its state --------------------------

HETU_HOST_DEVICE inline void sgd(const Config& c, float lr, float& w, float g) { w -= lr * (g + c.l2reg * w); }

// Momentum and Nesterov; v: the velocity.
HETU_HOST_DEVICE inline void momentum(const Config& c, float lr, float& w, float& v, float g) {
  const float gi = g + c.l2reg * w;
  v = c.momentum * v + gi;
  w -= lr * (c.kind == kNesterov ? gi + c.momentum * v : v);
}

// acc: the sum of squared gradients.
HETU_HOST_DEVICE inline void adagrad(const Config& c, float lr, float& w, float& acc, float g) {
  const float gi = g + c.l2reg * w;
  acc += gi * gi;
  w -= lr * gi / (square_root(acc) + c.eps);
}

// Adam and AdamW; bc1, bc2: bias_correction of beta1 and beta2 at the row's step count.
HETU_HOST_DEVICE inline void adam(const Config& c, float lr, float& w, float& m, float& v, float g, float bc1,
                                  float bc2) {
  const bool decoupled = c.kind == kAdamW || c.kind == kAdamWCatchUp;
  if (decoupled) w -= lr * c.weight_decay * w;
  const float gi = decoupled ? g : g + c.l2reg * w;
  m = c.beta1 * m + (1.0f - c.beta1) * gi;
  v = c.beta2 * v + (1.0f - c.beta2) * gi * gi;
  const float mhat = m / bc1;
  const float vhat = v / bc2;
  w -= lr * mhat / (square_root(vhat) + c.eps);
}

// One element of an element-wise kind: w, its gradient g, its first state float at state[0] and
// the further ones `stride` floats apart (the row's width); t: the row's step count, this step
// included. The device steps an element per thread with it; the host loops over rows of the
// kinds it knows (optim_rules.h: step_row), and over this for any other.
HETU_HOST_DEVICE inline void step_element(const Config& c, float lr, float* w, float* state, i64 stride, float g,
                                          i64 t) {
  switch (c.kind) {
    case kSGD: sgd(c, lr, *w, g); break;
    case kMomentum:
    case kNesterov: momentum(c, lr, *w, state[0], g); break;
    case kAdaGrad: adagrad(c, lr, *w, state[0], g); break;
    case kAdam:
    case kAdamW:
    case kAdamCatchUp:
    case kAdamWCatchUp:
      adam(c, lr, *w, state[0], state[stride], g, bias_correction(c.beta1, t), bias_correction(c.beta2, t));
      break;
    default: break;
  }
}

// ---- row-wise rules: a whole row of `width` floats ---------------------------------------------

// FBGEMM's EXACT_ROWWISE_ADAGRAD: the accumulator grows by the mean of the row's squared
// gradient, summed in index order (every build and device sums it the same way).
HETU_HOST_DEVICE inline void rowwise_adagrad(const Config& c, float lr, float* w, float& acc, const float* g,
                                             i64 width) {
  float sum_sq = 0.0f;
  for (i64 i = 0; i < width; ++i) {
    const float gi = g[i] + c.l2reg * w[i];
    sum_sq += gi * gi;
  }
  acc += sum_sq / static_cast<float>(width);
  const float denom = square_root(acc) + c.eps;
  for (i64 i = 0; i < width; ++i) {
    const float gi = g[i] + c.l2reg * w[i];
    w[i] -= lr * gi / denom;
  }
}

// One row of a row-wise kind; state: its state_width(kind, width) floats.
HETU_HOST_DEVICE inline void step_rowwise(const Config& c, float lr, float* w, float* state, const float* g,
                                          i64 width) {
  switch (c.kind) {
    case kRowwiseAdaGrad: rowwise_adagrad(c, lr, w, state[0], g, width); break;
    default: break;
  }
}

}  // namespace optim
}  // namespace hetu

#endif  // HETU_COMMON_OPTIM_STEP_H_
