// Row-wise optimizer steps, shared by every place that updates parameters: hetu's local
// dense and sparse updates, the parameter server's tables and the worker caches. One
// definition keeps a parameter-server run bit-compatible with a single-process run.
//
// A "row" is `width` contiguous floats. A dense tensor is updated as one row of its full size
// (element-wise kinds only: see `rowwise`). Optimizer state lives beside the row:
// `state_width(kind, width)` floats, plus a per-row step count (used by Adam's bias correction;
// each row counts its own steps, which for a dense tensor is the global step).
#pragma once
#include <cmath>
#include <cstdint>

#include "common/storage.h"

namespace hetu {
namespace optim {

enum Kind : int { kSGD = 0, kMomentum = 1, kNesterov = 2, kAdaGrad = 3, kAdam = 4, kAdamW = 5, kRowwiseAdaGrad = 6 };
constexpr int kNumKinds = 7;

struct Config {
  int kind = kSGD;
  float momentum = 0.9f;      // Momentum, Nesterov
  float beta1 = 0.9f;         // Adam, AdamW
  float beta2 = 0.999f;       // Adam, AdamW
  float eps = 1e-7f;          // AdaGrad, Adam, AdamW, row-wise AdaGrad
  float l2reg = 0.0f;         // added to the gradient: g + l2reg * w (all kinds but AdamW)
  float weight_decay = 0.0f;  // AdamW's decoupled decay
  // The rows' storage type (hetu::storage::Type): a step computes in float32 and rounds the row
  // to it. Embedding rows only; dense tensors are float32.
  int storage = storage::kF32;
};

// Whether the kind's state belongs to the row as a whole rather than to its elements. Such a
// rule steps embedding rows only: a dense tensor cut into pieces (threads, server shards) would
// change its result, so dense tensors take the optimizer's element-wise dense rule instead.
inline bool rowwise(int kind) { return kind == kRowwiseAdaGrad; }

// Floats of optimizer state beside a row of `width` floats: whole arrays of `width` floats for
// the element-wise kinds (Adam's m, then v), one accumulator for row-wise AdaGrad.
inline int64_t state_width(int kind, int64_t width) {
  switch (kind) {
    case kMomentum:
    case kNesterov:
    case kAdaGrad: return width;
    case kAdam:
    case kAdamW: return 2 * width;
    case kRowwiseAdaGrad: return 1;
    default: return 0;
  }
}

// Adam's bias corrections for one step count, kept by a caller that steps many rows: rows
// stepped together mostly share their count, and two pow() per 128-float row cost as much as
// the row's arithmetic. The values are those computed without it, bit for bit.
struct BiasCache {
  int64_t t = -1;
  float bc1 = 0.0f, bc2 = 0.0f;
};

// One step of one row. w: the row; state: state_width(kind, width) floats (may be null for SGD);
// step: the row's step count, incremented here; g: the row's summed gradient; cache: optional,
// used by one thread at a time.
inline void step_row(const Config& c, float lr, float* w, float* state, int64_t* step, const float* g,
                     int64_t width, BiasCache* cache = nullptr) {
  const int64_t t = ++*step;
  switch (c.kind) {
    case kSGD:
      for (int64_t i = 0; i < width; ++i) w[i] -= lr * (g[i] + c.l2reg * w[i]);
      break;
    case kMomentum:
    case kNesterov: {
      float* v = state;
      for (int64_t i = 0; i < width; ++i) {
        const float gi = g[i] + c.l2reg * w[i];
        v[i] = c.momentum * v[i] + gi;
        w[i] -= lr * (c.kind == kNesterov ? gi + c.momentum * v[i] : v[i]);
      }
      break;
    }
    case kAdaGrad: {
      float* acc = state;
      for (int64_t i = 0; i < width; ++i) {
        const float gi = g[i] + c.l2reg * w[i];
        acc[i] += gi * gi;
        w[i] -= lr * gi / (std::sqrt(acc[i]) + c.eps);
      }
      break;
    }
    case kRowwiseAdaGrad: {
      // FBGEMM's EXACT_ROWWISE_ADAGRAD: the accumulator grows by the mean of the row's squared
      // gradient, summed in index order (every build and device sums it the same way).
      float sum_sq = 0.0f;
      for (int64_t i = 0; i < width; ++i) {
        const float gi = g[i] + c.l2reg * w[i];
        sum_sq += gi * gi;
      }
      *state += sum_sq / static_cast<float>(width);
      const float denom = std::sqrt(*state) + c.eps;
      for (int64_t i = 0; i < width; ++i) {
        const float gi = g[i] + c.l2reg * w[i];
        w[i] -= lr * gi / denom;
      }
      break;
    }
    case kAdam:
    case kAdamW: {
      float* m = state;
      float* v = state + width;
      BiasCache local;
      BiasCache& bc = cache ? *cache : local;
      if (bc.t != t) {
        bc.bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(t)));
        bc.bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(t)));
        bc.t = t;
      }
      const float bc1 = bc.bc1, bc2 = bc.bc2;
      const bool decoupled = c.kind == kAdamW;
      for (int64_t i = 0; i < width; ++i) {
        if (decoupled) w[i] -= lr * c.weight_decay * w[i];
        const float gi = decoupled ? g[i] : g[i] + c.l2reg * w[i];
        m[i] = c.beta1 * m[i] + (1.0f - c.beta1) * gi;
        v[i] = c.beta2 * v[i] + (1.0f - c.beta2) * gi * gi;
        const float mhat = m[i] / bc1;
        const float vhat = v[i] / bc2;
        w[i] -= lr * mhat / (std::sqrt(vhat) + c.eps);
      }
      break;
    }
  }
  storage::round_row(c.storage, w, width);
}

}  // namespace optim
}  // namespace hetu
