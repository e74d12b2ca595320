// Sampled logits over each sample's candidate rows (candidate_logits.h).
#include "kernels/candidate_logits.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/parallel.h"

namespace hetu {
namespace kernels {

namespace {

constexpr float kNormEps = 1e-6f;

// Eight running sums (lanes k mod 8) added pairwise at the end: a fixed order the compiler can
// vectorise, the same on every CPU.
inline float dot(const float* a, const float* b, int64_t width) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= width; k += 8)
    for (int i = 0; i < 8; ++i) lane[i] += a[k + i] * b[k + i];
  for (int i = 0; k < width; ++k, ++i) lane[i] += a[k] * b[k];
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

// 1 / max(||row||, eps) of each candidate of one sample.
void inverse_norms(const float* block, int64_t candidates, int64_t width, float* inv) {
  for (int64_t u = 0; u < candidates; ++u) {
    const float* r = block + u * width;
    inv[u] = 1.0f / std::max(std::sqrt(dot(r, r, width)), kNormEps);
  }
}

}  // namespace

int64_t candidate_logits(const CandidateShape& shape, const float* user, const float* rows, const int64_t* index,
                         float* out) {
  const int64_t per_sample = shape.positions * shape.negatives;
  const int64_t total = shape.samples * per_sample, U = shape.candidates();
  for (int64_t i = 0; i < total; ++i)
    if (index[i] < -1 || index[i] >= U) return i;
  const int64_t w = shape.width;
  parallel_for(shape.samples, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> inv(U);
    for (int64_t s = begin; s < end; ++s) {
      const float* block = rows + (s * shape.columns + shape.first) * w;
      inverse_norms(block, U, w, inv.data());
      for (int64_t p = 0; p < shape.positions; ++p) {
        const float* u = user + (s * shape.positions + p) * w;
        const int64_t* idx = index + s * per_sample + p * shape.negatives;
        float* o = out + s * per_sample + p * shape.negatives;
        for (int64_t j = 0; j < shape.negatives; ++j)
          o[j] = idx[j] < 0 ? 0.0f : dot(u, block + idx[j] * w, w) * inv[idx[j]];
      }
    }
  });
  return -1;
}

void candidate_logits_grad(const CandidateShape& shape, const float* dlogits, const float* user, const float* rows,
                           const int64_t* index, float* duser, float* drows) {
  const int64_t per_sample = shape.positions * shape.negatives;
  const int64_t w = shape.width, U = shape.candidates();
  parallel_for(shape.samples, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> inv(U);
    for (int64_t s = begin; s < end; ++s) {
      const float* block = rows + (s * shape.columns + shape.first) * w;
      float* dblock = drows + (s * shape.columns + shape.first) * w;
      inverse_norms(block, U, w, inv.data());
      std::memset(dblock, 0, sizeof(float) * U * w);
      // The gradient of each normalised row, gathered in dblock; duser from the normalised rows.
      for (int64_t p = 0; p < shape.positions; ++p) {
        const float* u = user + (s * shape.positions + p) * w;
        float* du = duser + (s * shape.positions + p) * w;
        std::fill(du, du + w, 0.0f);
        const int64_t* idx = index + s * per_sample + p * shape.negatives;
        const float* g = dlogits + s * per_sample + p * shape.negatives;
        for (int64_t j = 0; j < shape.negatives; ++j) {
          if (idx[j] < 0) continue;
          const float gj = g[j], scaled = g[j] * inv[idx[j]];
          const float* r = block + idx[j] * w;
          float* dr = dblock + idx[j] * w;
          for (int64_t k = 0; k < w; ++k) {
            du[k] += scaled * r[k];
            dr[k] += gj * u[k];
          }
        }
      }
      // Through the normalisation: dx = (dy - y (y . dy)) / max(||x||, eps), or dy / eps where
      // the norm is below eps (y = x / eps there).
      for (int64_t c = 0; c < U; ++c) {
        const float* r = block + c * w;
        float* dr = dblock + c * w;
        const float norm = std::sqrt(dot(r, r, w));
        if (norm > kNormEps) {
          const float along = dot(r, dr, w) * inv[c];   // y . dy
          for (int64_t k = 0; k < w; ++k) dr[k] = (dr[k] - r[k] * inv[c] * along) * inv[c];
        } else {
          for (int64_t k = 0; k < w; ++k) dr[k] *= inv[c];
        }
      }
    }
  });
}

}  // namespace kernels
}  // namespace hetu
