// A sampled softmax's logits over each sample's own candidate rows (sequential recommenders,
// docs/design.md section 17): position p of sample s scores N candidates, chosen by an index into
// the sample's U distinct candidate rows, so each row is read from cache once per sample instead
// of once per (position, negative). The rows are L2-normalised here (x / max(||x||, 1e-6)).
#pragma once
#include <cstdint>

namespace hetu {
namespace kernels {

// user [samples, positions, width]; rows [samples, columns, width], whose columns [first,
// columns) are the candidates; index [samples, positions, negatives] into the candidates.
struct CandidateShape {
  int64_t samples, positions, negatives, columns, first, width;
  int64_t candidates() const { return columns - first; }
};

// out[s, p, j] = user[s, p] . normalised(rows[s, first + index[s, p, j]]) (0 where index is -1),
// each dot summed in float in eight lanes added pairwise (the same bits on every CPU and thread
// count). Returns -1, or the flat position of the first index outside [-1, candidates) (then
// nothing is written).
int64_t candidate_logits(const CandidateShape& shape, const float* user, const float* rows, const int64_t* index,
                         float* out);

// candidate_logits' gradients: duser[s, p] = sum over j (in order) of dlogits[s, p, j] times the
// normalised row; drows[s, first + u] = the normalisation's backward of the sum over (p, j) (p
// outer, j inner) with index == u of dlogits[s, p, j] * user[s, p]; 0 for candidates no position
// reads. Columns before `first` of drows are not written. A sample per thread at a time: the same
// bits at any thread count. The index is the one candidate_logits checked.
void candidate_logits_grad(const CandidateShape& shape, const float* dlogits, const float* user, const float* rows,
                           const int64_t* index, float* duser, float* drows);

}  // namespace kernels
}  // namespace hetu
