// A cache's rows in the table's storage type (common/storage.h): `slots` rows of `width`
// elements, read and written as float32. A 16-bit row widens exactly and a stepped row (which the
// shared rule has rounded to the type) narrows exactly, so the cache holds the servers' bits in
// half the memory.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/storage.h"

namespace hetu {
namespace cache {

class StoredRows {
 public:
  StoredRows(int storage, int64_t slots, int64_t width)
      : storage_(storage), width_(width), row_bytes_(width * storage::bytes(storage)),
        bytes_(std::max<int64_t>(0, slots * row_bytes_)) {}

  void Get(int64_t slot, float* out) const { storage::widen_row(storage_, &bytes_[slot * row_bytes_], out, width_); }
  void Put(int64_t slot, const float* in) { storage::narrow_row(storage_, in, &bytes_[slot * row_bytes_], width_); }
  int storage() const { return storage_; }

 private:
  int storage_;
  int64_t width_, row_bytes_;
  std::vector<uint8_t> bytes_;
};

}  // namespace cache
}  // namespace hetu
