// hetu._C's kernels: gather, bags, unique-and-sum, optimizer steps, batched small products, attention
// weights, initializers. Every call releases the GIL while it computes.
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "common/optim_rules.h"
#include "common/parallel.h"
#include "common/rng.h"
#include "kernels/kernels.h"

namespace hetu {
namespace bindings {

namespace {

using hetu::optim::Config;

py::object gather_rows(Array<float> table, Array<int64_t> ids, Array<float> out) {
  if (table.ndim() != 2) throw std::invalid_argument("gather_rows: table must be 2-D");
  const int64_t rows = table.shape(0), width = table.shape(1), n = ids.size();
  if (out.size() != n * width) throw std::invalid_argument("gather_rows: out has the wrong size");
  int64_t bad;
  {
    py::gil_scoped_release nogil;
    bad = hetu::kernels::gather_rows(table.data(), rows, width, ids.data(), n, mutable_data(out, "out"));
  }
  if (bad >= 0) return py::make_tuple(bad, ids.data()[bad]);
  return py::none();
}

// (ids [n], rows [n, width]) as NumPy arrays: a sparse gradient's two halves.
py::tuple ids_and_rows(const std::vector<int64_t>& ids, const std::vector<float>& rows, int64_t width) {
  const auto n = static_cast<py::ssize_t>(ids.size());
  Array<int64_t> out_ids(n);
  Array<float> out_rows(std::vector<py::ssize_t>{n, static_cast<py::ssize_t>(width)});
  std::copy(ids.begin(), ids.end(), out_ids.mutable_data());
  std::copy(rows.begin(), rows.end(), out_rows.mutable_data());
  return py::make_tuple(out_ids, out_rows);
}

// ids: [samples, slots]; bag_offsets: the bags' first slots and the end (kernels::pool_bags).
void check_bags(const char* what, const Array<int64_t>& ids, const Array<int64_t>& bag_offsets) {
  const int64_t slots = ids.ndim() == 2 ? ids.shape(1) : -1;
  const int64_t* o = bag_offsets.data();
  const int64_t bags = bag_offsets.size() - 1;
  bool ok = slots >= 0 && bags >= 1 && o[0] == 0 && o[bags] == slots;
  for (int64_t k = 0; ok && k < bags; ++k) ok = o[k] <= o[k + 1];
  if (!ok)
    throw std::invalid_argument(std::string(what) + ": ids must be [samples, slots] and bag_offsets ascend from 0 "
                                "to the slot count");
}

py::object pool_bags(Array<float> table, Array<int64_t> ids, Array<int64_t> bag_offsets, bool mean, Array<float> out) {
  if (table.ndim() != 2) throw std::invalid_argument("pool_bags: table must be 2-D");
  check_bags("pool_bags", ids, bag_offsets);
  const int64_t rows = table.shape(0), width = table.shape(1), n = ids.shape(0), bags = bag_offsets.size() - 1;
  if (out.size() != n * bags * width) throw std::invalid_argument("pool_bags: out must be [samples, bags, width]");
  int64_t bad;
  {
    py::gil_scoped_release nogil;
    bad = hetu::kernels::pool_bags(table.data(), rows, width, ids.data(), n, ids.shape(1), bag_offsets.data(), bags,
                                   mean, mutable_data(out, "out"));
  }
  if (bad >= 0) return py::make_tuple(bad, ids.data()[bad]);
  return py::none();
}

py::tuple bag_gradient(Array<int64_t> ids, Array<int64_t> bag_offsets, bool mean, Array<float> grads) {
  check_bags("bag_gradient", ids, bag_offsets);
  const int64_t n = ids.shape(0), bags = bag_offsets.size() - 1;
  if (grads.ndim() != 3 || grads.shape(0) != n || grads.shape(1) != bags)
    throw std::invalid_argument("bag_gradient: grads must be [samples, bags, width]");
  const int64_t width = grads.shape(2);
  std::vector<int64_t> uniq;
  std::vector<float> summed;
  {
    py::gil_scoped_release nogil;
    hetu::kernels::bag_gradient(ids.data(), n, ids.shape(1), bag_offsets.data(), bags, mean, grads.data(), width,
                                &uniq, &summed);
  }
  return ids_and_rows(uniq, summed, width);
}

// The table's rows, optimizer state and step counts (kernels::apply_rows) checked against the config.
void check_rows_state(const char* what, const Config& cfg, const Array<float>& table, const Array<float>& state,
                      const Array<int64_t>& steps) {
  if (table.ndim() != 2) throw std::invalid_argument(std::string(what) + ": table must be 2-D");
  const int64_t num_rows = table.shape(0), width = table.shape(1);
  if (state.size() != num_rows * hetu::optim::state_width(cfg.kind, width))
    throw std::invalid_argument(std::string(what) + ": state has the wrong size for this optimizer");
  if (steps.size() != num_rows) throw std::invalid_argument(std::string(what) + ": steps must have one entry per row");
}

py::object bag_gradient_step(Array<int64_t> ids, Array<int64_t> bag_offsets, bool mean, Array<float> grads,
                             const Config& cfg, float lr, Array<float> table, Array<float> state,
                             Array<int64_t> steps, bool empty_slots) {
  check_bags("bag_gradient_step", ids, bag_offsets);
  check_rows_state("bag_gradient_step", cfg, table, state, steps);
  const int64_t n = ids.shape(0), bags = bag_offsets.size() - 1, num_rows = table.shape(0), width = table.shape(1);
  if (grads.size() != n * bags * width)
    throw std::invalid_argument("bag_gradient_step: grads must be [samples, bags, width]");
  float* t = mutable_data(table, "table");
  float* s = mutable_data(state, "state");
  int64_t* st = mutable_data(steps, "steps");
  int64_t bad;
  {
    py::gil_scoped_release nogil;
    bad = hetu::kernels::bag_gradient_step(ids.data(), n, ids.shape(1), bag_offsets.data(), bags, mean, grads.data(),
                                           cfg, lr, t, num_rows, width, s, st, empty_slots);
  }
  if (bad >= 0) return py::make_tuple(bad, ids.data()[bad]);
  return py::none();
}

py::tuple unique_sum(Array<int64_t> ids, Array<float> grads) {
  const int64_t n = ids.size();
  if (n == 0) return py::make_tuple(Array<int64_t>(0), Array<float>(std::vector<py::ssize_t>{0, grads.ndim() == 2 ? grads.shape(1) : 0}));
  const int64_t width = grads.size() / n;
  if (grads.size() != n * width) throw std::invalid_argument("unique_sum: grads rows do not match ids");
  std::vector<int64_t> uniq;
  std::vector<float> summed;
  {
    py::gil_scoped_release nogil;
    hetu::kernels::unique_sum(ids.data(), grads.data(), n, width, &uniq, &summed);
  }
  return ids_and_rows(uniq, summed, width);
}

void apply_rows(const Config& cfg, float lr, Array<float> table, Array<float> state, Array<int64_t> steps,
                Array<int64_t> rows, Array<float> grads) {
  check_rows_state("apply_rows", cfg, table, state, steps);
  const int64_t num_rows = table.shape(0), width = table.shape(1), n = rows.size();
  if (grads.size() != n * width) throw std::invalid_argument("apply_rows: grads do not match rows x width");
  const int64_t* r = rows.data();
  for (int64_t i = 0; i < n; ++i)
    if (r[i] < 0 || r[i] >= num_rows) throw std::out_of_range("apply_rows: row " + std::to_string(r[i]) + " outside table of " + std::to_string(num_rows) + " rows");
  float* t = mutable_data(table, "table");
  float* s = mutable_data(state, "state");
  int64_t* st = mutable_data(steps, "steps");
  py::gil_scoped_release nogil;
  hetu::kernels::apply_rows(cfg, lr, t, s, st, width, r, grads.data(), n);
}

void catch_up_rows(const Config& cfg, Array<float> table, Array<float> state, Array<int64_t> steps,
                   Array<int64_t> rows, int64_t target) {
  if (!hetu::optim::catches_up(cfg.kind)) throw std::invalid_argument("catch_up_rows: the optimizer kind does not catch up");
  check_rows_state("catch_up_rows", cfg, table, state, steps);
  const int64_t num_rows = table.shape(0), width = table.shape(1), n = rows.size();
  float* t = mutable_data(table, "table");
  float* s = mutable_data(state, "state");
  int64_t* st = mutable_data(steps, "steps");
  py::gil_scoped_release nogil;
  hetu::kernels::catch_up_rows(cfg, t, s, st, num_rows, width, rows.data(), n, target);
}

void apply_dense(const Config& cfg, float lr, Array<float> w, Array<float> state, Array<int64_t> step,
                 Array<float> grad) {
  const int64_t size = w.size();
  if (grad.size() != size) throw std::invalid_argument("apply_dense: gradient size differs from parameter");
  if (hetu::optim::rowwise(cfg.kind))
    throw std::invalid_argument("apply_dense: a row-wise optimizer steps embedding rows; a dense tensor takes its "
                                "element-wise dense rule (Optimizer.dense_config)");
  if (state.size() != hetu::optim::state_width(cfg.kind, size))
    throw std::invalid_argument("apply_dense: state has the wrong size for this optimizer");
  if (step.size() != 1) throw std::invalid_argument("apply_dense: step must hold one count");
  float* wp = mutable_data(w, "parameter");
  float* sp = mutable_data(state, "state");
  int64_t* tp = mutable_data(step, "step");
  py::gil_scoped_release nogil;
  hetu::kernels::apply_dense(cfg, lr, wp, sp, tp, grad.data(), size);
}

// a [batch, m, k] (or [batch, k, m], trans_a) x b [batch, k, n] (or [batch, n, k], trans_b) -> out [batch, m, n].
void batched_matmul(Array<float> a, Array<float> b, bool trans_a, bool trans_b, Array<float> out,
                    const std::string& simd) {
  if (a.ndim() != 3 || b.ndim() != 3 || out.ndim() != 3 || a.shape(0) != b.shape(0) || out.shape(0) != a.shape(0))
    throw std::invalid_argument("batched_matmul: a, b and out must be 3-D stacks of as many matrices");
  const int64_t batch = a.shape(0), m = a.shape(trans_a ? 2 : 1), k = a.shape(trans_a ? 1 : 2);
  const int64_t k_b = b.shape(trans_b ? 2 : 1), n = b.shape(trans_b ? 1 : 2);
  if (k != k_b)
    throw std::invalid_argument("batched_matmul: inner dimensions differ (" + std::to_string(k) + " and " +
                                std::to_string(k_b) + ")");
  if (out.shape(1) != m || out.shape(2) != n)
    throw std::invalid_argument("batched_matmul: out must be [" + std::to_string(batch) + ", " + std::to_string(m) +
                                ", " + std::to_string(n) + "]");
  const std::string variant = hetu::kernels::runnable_matmul_variant(simd);   // checked with the GIL held
  float* o = mutable_data(out, "out");
  py::gil_scoped_release nogil;
  hetu::kernels::batched_matmul(a.data(), b.data(), batch, m, n, k, trans_a, trans_b, o, variant);
}

// times [batch, L] int64 -> out [batch, L, L]: each gap's bucket by the ascending thresholds.
void time_buckets(Array<int64_t> times, Array<int64_t> thresholds, Array<int64_t> out) {
  if (times.ndim() != 2 || out.ndim() != 3 || out.shape(0) != times.shape(0) || out.shape(1) != times.shape(1) ||
      out.shape(2) != times.shape(1) || thresholds.ndim() != 1)
    throw std::invalid_argument("time_buckets: times [batch, L], thresholds [n] and out [batch, L, L]");
  int64_t* o = mutable_data(out, "out");
  py::gil_scoped_release nogil;
  hetu::kernels::time_buckets(times.data(), times.shape(0), times.shape(1), thresholds.data(), thresholds.size(), o);
}

// out[b] = sum of values where index == b (np.bincount's bits); -1 or the first index outside.
int64_t bucket_sums(Array<int64_t> index, Array<float> values, Array<float> out) {
  if (index.size() != values.size())
    throw std::invalid_argument("bucket_sums: index and values must hold as many entries");
  float* o = mutable_data(out, "out");
  py::gil_scoped_release nogil;
  return hetu::kernels::bucket_sums(index.data(), values.data(), index.size(), out.size(), o);
}

// out = silu(x), or with g its gradient g * silu'(x): float32 arrays of one size.
void silu(Array<float> x, py::object g, Array<float> out, const std::string& simd) {
  Array<float> grad;
  if (!g.is_none()) grad = g.cast<Array<float>>();
  if (out.size() != x.size() || (!g.is_none() && grad.size() != x.size()))
    throw std::invalid_argument("silu: x, g and out must hold as many float32 values");
  float* o = mutable_data(out, "out");
  const float* gd = g.is_none() ? nullptr : grad.data();
  const std::string variant = hetu::kernels::runnable_matmul_variant(simd);   // checked with the GIL held
  py::gil_scoped_release nogil;
  if (gd == nullptr)
    hetu::kernels::silu(x.data(), x.size(), o, variant);
  else
    hetu::kernels::silu_backward(gd, x.data(), x.size(), o, variant);
}

// The kernels' AttentionShape of scores [batch, ..., lq, lk] (2-D without a mask: a batch of
// one) and a mask [batch, lk] or None; `mask` keeps the mask's array alive.
hetu::kernels::AttentionShape attention_shape(const std::string& what, const Array<float>& scores,
                                              const py::object& mask_or_none, bool causal, float scale,
                                              Array<float>* mask) {
  const auto nd = scores.ndim();
  if (nd < 2 || (nd < 3 && !mask_or_none.is_none()))
    throw std::invalid_argument(what + ": scores must be [batch, ..., lq, lk] (or [lq, lk] without a mask)");
  const int64_t lq = scores.shape(nd - 2), lk = scores.shape(nd - 1), batch = nd >= 3 ? scores.shape(0) : 1;
  const int64_t heads = batch * lq * lk == 0 ? 0 : scores.size() / (batch * lq * lk);
  hetu::kernels::AttentionShape shape{batch, heads, lq, lk, nullptr, causal, scale};
  if (!mask_or_none.is_none()) {
    *mask = mask_or_none.cast<Array<float>>();
    if (mask->ndim() != 2 || mask->shape(0) != batch || mask->shape(1) != lk)
      throw std::invalid_argument(what + ": mask must be [" + std::to_string(batch) + ", " + std::to_string(lk) +
                                  "] float32, as scores' batch and keys");
    shape.mask = mask->data();
  }
  return shape;
}

void check_same_size(const std::string& what, const Array<float>& scores, const Array<float>& other,
                     const char* name) {
  if (other.size() != scores.size()) throw std::invalid_argument(what + ": " + name + " must have the scores' shape");
}

using AttentionForward = void (*)(const hetu::kernels::AttentionShape&, const float*, float*);
using AttentionBackward = void (*)(const hetu::kernels::AttentionShape&, const float*, const float*, float*);

// scores -> out: one of the attention kernels' forwards.
void attention_forward(AttentionForward kernel, const std::string& what, Array<float> scores, py::object mask,
                       bool causal, float scale, Array<float> out) {
  Array<float> mask_array;
  const auto shape = attention_shape(what, scores, mask, causal, scale, &mask_array);
  check_same_size(what, scores, out, "out");
  float* o = mutable_data(out, "out");
  py::gil_scoped_release nogil;
  kernel(shape, scores.data(), o);
}

// (grad, saved) -> out: a backward, `saved` its forward's output or input as the kernel reads it.
void attention_backward(AttentionBackward kernel, const std::string& what, Array<float> grad, Array<float> saved,
                        py::object mask, bool causal, float scale, Array<float> out) {
  Array<float> mask_array;
  const auto shape = attention_shape(what, grad, mask, causal, scale, &mask_array);
  check_same_size(what, grad, saved, "the saved array");
  check_same_size(what, grad, out, "out");
  float* o = mutable_data(out, "out");
  py::gil_scoped_release nogil;
  kernel(shape, grad.data(), saved.data(), o);
}

void round_to_storage(Array<float> values, int storage) {
  if (storage < 0 || storage >= hetu::storage::kNumTypes)
    throw std::invalid_argument("round_to_storage: storage " + std::to_string(storage) + " is not a storage type");
  float* v = mutable_data(values, "values");
  const int64_t n = values.size();
  py::gil_scoped_release nogil;
  hetu::storage::round_row(storage, v, n);
}

void init_fill(int kind, double a, double b, uint64_t seed, uint64_t stream, int64_t row_begin,
               Array<float> out) {
  const int64_t rows = out.ndim() >= 1 ? out.shape(0) : 1;
  const int64_t width = rows ? out.size() / rows : 0;
  float* o = mutable_data(out, "out");
  py::gil_scoped_release nogil;
  hetu::kernels::init_fill(kind, a, b, seed, stream, row_begin, row_begin + rows, width, o);
}

void init_fill_rows(int kind, double a, double b, uint64_t seed, uint64_t stream, Array<int64_t> rows,
                    Array<float> out) {
  const int64_t n = rows.size();
  if (out.ndim() < 1 || out.shape(0) != n)
    throw std::invalid_argument("init_fill_rows: out must hold one row per entry of rows (" + std::to_string(n) + ")");
  const int64_t width = n ? out.size() / n : 0;
  float* o = mutable_data(out, "out");
  py::gil_scoped_release nogil;
  hetu::kernels::init_fill_rows(kind, a, b, seed, stream, rows.data(), n, width, o);
}

}  // namespace

void bind_kernels(py::module_& m) {
  m.def("gather_rows", &gather_rows, "out[i] = table[ids[i]]; returns None or (position, id) of a bad id");
  m.def("pool_bags", &pool_bags, py::arg("table"), py::arg("ids"), py::arg("bag_offsets"), py::arg("mean"),
        py::arg("out"), "out[s, k] = sum (mean) of table rows of bag k of sample s (-1: empty slot); None or "
        "(position, id) of a bad id");
  m.def("bag_gradient", &bag_gradient, py::arg("ids"), py::arg("bag_offsets"), py::arg("mean"), py::arg("grads"),
        "(distinct ids ascending, rows): pool_bags' sparse gradient summed per id");
  m.def("bag_gradient_step", &bag_gradient_step, py::arg("ids"), py::arg("bag_offsets"), py::arg("mean"),
        py::arg("grads"), py::arg("config"), py::arg("lr"), py::arg("table"), py::arg("state"), py::arg("steps"),
        py::arg("empty_slots") = true,
        "bag_gradient and apply_rows in one pass (the sums never written); None or (position, id) of a bad id. "
        "empty_slots=False: -1 is a bad id (a single-id lookup's gradient, as bags of one slot)");
  m.def("unique_sum", &unique_sum, "sorted unique ids and the summed rows of each");
  m.def("apply_rows", &apply_rows, "one optimizer step of the given unique rows of a table");
  m.def("apply_dense", &apply_dense, "one optimizer step of a dense tensor");
  m.def("catch_up_rows", &catch_up_rows,
        "a catch-up kind's rows (any order, repeats allowed; ids outside the table, as an empty slot's -1, "
        "skipped) brought to step `target`: the zero-gradient steps they skipped, applied",
        py::arg("config"), py::arg("table"), py::arg("state"), py::arg("steps"), py::arg("rows"), py::arg("target"));
  m.def("batched_matmul", &batched_matmul, py::arg("a"), py::arg("b"), py::arg("trans_a"), py::arg("trans_b"),
        py::arg("out"), py::arg("simd") = "",
        "out[s] = op(a[s]) @ op(b[s]) of float32 stacks, each element summed over k in order (the same bits on "
        "every CPU and thread count); simd: a version of MATMUL_VARIANTS, '' HETU_SIMD's or the best this CPU runs");
  m.attr("MATMUL_VARIANTS") = hetu::kernels::matmul_variants();
  m.def("matmul_variant", [](const std::string& want) { return hetu::kernels::runnable_matmul_variant(want); },
        py::arg("want") = "", "the batched_matmul version that runs: want checked, or '' HETU_SIMD's or the best this CPU runs");
  m.def("time_buckets", &time_buckets, py::arg("times"), py::arg("thresholds"), py::arg("out"),
        "out[b, i, j] = the number of thresholds (ascending) at or below |times[b, i] - times[b, j]|; threaded");
  m.def("bucket_sums", &bucket_sums, py::arg("index"), py::arg("values"), py::arg("out"),
        "out[k] = sum of values[i] with index[i] == k, in double in index order (np.bincount's bits); returns -1 "
        "or the first i whose index is outside out");
  m.def("silu", &silu, py::arg("x"), py::arg("g"), py::arg("out"), py::arg("simd") = "",
        "out = x * sigmoid(x) (g None), or g * d silu / dx at x; elementwise on the threads (the same bits on "
        "every CPU and thread count); simd: a version of MATMUL_VARIANTS, '' HETU_SIMD's or the best this CPU runs");
  const auto forward = [&m](const char* name, AttentionForward kernel, const char* doc) {
    m.def(name, [kernel, name](Array<float> scores, py::object mask, bool causal, float scale, Array<float> out) {
      attention_forward(kernel, name, scores, mask, causal, scale, out);
    }, py::arg("scores"), py::arg("mask"), py::arg("causal"), py::arg("scale"), py::arg("out"), doc);
  };
  const auto backward = [&m](const char* name, AttentionBackward kernel, const char* doc) {
    m.def(name, [kernel, name](Array<float> grad, Array<float> saved, py::object mask, bool causal, float scale,
                               Array<float> out) {
      attention_backward(kernel, name, grad, saved, mask, causal, scale, out);
    }, py::arg("grad"), py::arg("saved"), py::arg("mask"), py::arg("causal"), py::arg("scale"), py::arg("out"), doc);
  };
  forward("masked_softmax", hetu::kernels::masked_softmax,
          "out = softmax of scale * scores [batch, ..., lq, lk] over the keys allowed (mask [batch, lk] != 0 or None, "
          "and j <= i when causal); disallowed entries and rows without a key 0; threaded over rows, the same bits on "
          "every thread count");
  backward("masked_softmax_grad", hetu::kernels::masked_softmax_backward,
           "out = d scores of masked_softmax from grad and saved = its output");
  forward("pointwise_attention", hetu::kernels::pointwise_attention,
          "out = silu(scale * scores) / lk on the keys allowed (as masked_softmax), else 0 (HSTU)");
  backward("pointwise_attention_grad", hetu::kernels::pointwise_attention_backward,
           "out = d scores of pointwise_attention from grad and saved = its input scores");
  m.attr("STORAGE_TYPES") = std::vector<std::string>{hetu::storage::name(hetu::storage::kF32),
                                                     hetu::storage::name(hetu::storage::kBF16),
                                                     hetu::storage::name(hetu::storage::kF16)};
  m.def("round_to_storage", &round_to_storage, py::arg("values"), py::arg("storage"),
        "values (float32, in place) rounded to nearest even in storage type 0 fp32, 1 bf16, 2 fp16");
  m.def("init_fill", &init_fill, "rows [row_begin, row_begin + len(out)) of a counter-based initializer");
  m.def("init_fill_rows", &init_fill_rows, "out[k] = row rows[k] of a counter-based initializer (any rows, any order)");
  m.def("name_stream", [](const std::string& s) { return hetu::rng::name_stream(s.c_str()); });
  m.def("num_threads", &hetu::num_threads);
}

}  // namespace bindings
}  // namespace hetu
