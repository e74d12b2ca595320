// hetu._C: the Python binding of src/, one file per area beside this one (bindings.h).
#include "bindings/bindings.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "hetu CPU kernels";
  hetu::bindings::bind_optim(m);
  hetu::bindings::bind_kernels(m);
  hetu::bindings::bind_cache(m);
  hetu::bindings::bind_herald(m);
  hetu::bindings::bind_data(m);
  hetu::bindings::bind_key_hash(m);
  hetu::bindings::bind_dynamic(m);
  hetu::bindings::bind_stream(m);
  hetu::bindings::bind_sample_ids(m);
  hetu::bindings::bind_candidate_logits(m);
}
