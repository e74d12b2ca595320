// A server's shard arrays: huge-page memory, and the step counts and versions of its rows.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>

namespace ps {

// Table storage: rows are read at random, so with 4 KiB pages nearly every row of a large
// gather is a TLB miss. Anonymous memory advised for transparent huge pages avoids that.
template <typename T>
class HugeArray {
 public:
  HugeArray() = default;
  ~HugeArray();
  HugeArray(const HugeArray&) = delete;
  HugeArray& operator=(const HugeArray&) = delete;
  void Reset(size_t n, T fill);  // n elements, all `fill`
  void Swap(HugeArray& o) {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(bytes_, o.bytes_);
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0, bytes_ = 0;
};

// Every unit's (row's) step count and version. Both take 32 bits while every one of them
// provably fits (upper bounds of both are kept as they grow) and are widened once, to 64 bits,
// before an update could take one past 2^31 - 1. So a row carries 8 bytes of them instead of 16
// for as long as a job runs short of about 2^31 / W iterations, and the counts are those of
// 64-bit counters in every case. Threads may step distinct units at once; the other methods
// are for one thread.
class UnitCounters {
 public:
  static constexpr int64_t kNarrowMax = std::numeric_limits<int32_t>::max();

  void Reset(size_t units) {  // zeros, 32 bits
    wide_ = false;
    wide_steps_.Reset(0, 0);
    wide_versions_.Reset(0, 0);
    steps_.Reset(units, 0);
    versions_.Reset(units, 0);
    max_step_ = max_version_ = 0;
  }
  bool wide() const { return wide_; }
  size_t size() const { return wide_ ? wide_steps_.size() : steps_.size(); }
  int64_t step(size_t u) const { return wide_ ? wide_steps_[u] : steps_[u]; }
  int64_t version(size_t u) const { return wide_ ? wide_versions_[u] : versions_[u]; }

  // Before an update that adds at most `step_add` to any step count (or, with `set_steps`, sets
  // them to at most that) and at most `version_add` to any version: widens first if a count
  // could pass 2^31 - 1. Returns whether it widened.
  bool Reserve(int64_t step_add, int64_t version_add, bool set_steps = false) {
    max_step_ = set_steps ? std::max(max_step_, step_add) : max_step_ + step_add;
    max_version_ += version_add;
    if (wide_ || (max_step_ <= kNarrowMax && max_version_ <= kNarrowMax)) return false;
    Widen();
    return true;
  }
  // After counts were written from outside (a checkpoint): the bounds become their maxima.
  void Rebound() {
    max_step_ = max_version_ = 0;
    for (size_t u = 0; u < size(); ++u) {
      max_step_ = std::max(max_step_, step(u));
      max_version_ = std::max(max_version_, version(u));
    }
  }
  // After counts were loaded into some units from outside while others hold more (a disk-tier
  // shard's lines): the bounds grow to at least these.
  void Raise(int64_t step, int64_t version) {
    max_step_ = std::max(max_step_, step);
    max_version_ = std::max(max_version_, version);
  }
  // `units` units: the first ones keep their counts, new ones are zero.
  void Resize(size_t units) {
    const size_t keep = std::min(size(), units);
    if (wide_) ResizeArrays(&wide_steps_, &wide_versions_, keep, units);
    else ResizeArrays(&steps_, &versions_, keep, units);
  }
  void Widen() {
    if (wide_) return;
    const size_t n = steps_.size();
    wide_steps_.Reset(n, 0);
    wide_versions_.Reset(n, 0);
    for (size_t u = 0; u < n; ++u) {
      wide_steps_[u] = steps_[u];
      wide_versions_[u] = versions_[u];
    }
    steps_.Reset(0, 0);
    versions_.Reset(0, 0);
    wide_ = true;
  }

  // One optimizer step of unit u: `step(int64_t*)` advances its step count, then the version
  // grows by `version_add` (in range: Reserve came first).
  template <typename Step>
  void Stepped(size_t u, int64_t version_add, Step&& step) {
    if (wide_) {
      step(&wide_steps_[u]);
      wide_versions_[u] += version_add;
      return;
    }
    int64_t s = steps_[u];
    step(&s);
    steps_[u] = static_cast<int32_t>(s);
    versions_[u] = static_cast<int32_t>(versions_[u] + version_add);
  }
  void Assign(size_t u, int64_t steps, int64_t version_add) {  // Reserve came first
    if (wide_) {
      wide_steps_[u] = steps;
      wide_versions_[u] += version_add;
    } else {
      steps_[u] = static_cast<int32_t>(steps);
      versions_[u] = static_cast<int32_t>(versions_[u] + version_add);
    }
  }
  void Load(size_t u, int64_t steps, int64_t version) {  // from a checkpoint; Rebound after
    if (!wide_ && (steps > kNarrowMax || version > kNarrowMax)) Widen();
    if (wide_) {
      wide_steps_[u] = steps;
      wide_versions_[u] = version;
    } else {
      steps_[u] = static_cast<int32_t>(steps);
      versions_[u] = static_cast<int32_t>(version);
    }
  }
  void Prefetch(size_t u) const {
    if (wide_) {
      __builtin_prefetch(wide_steps_.data() + u, 1);
      __builtin_prefetch(wide_versions_.data() + u, 1);
    } else {
      __builtin_prefetch(steps_.data() + u, 1);
      __builtin_prefetch(versions_.data() + u, 1);
    }
  }

 private:
  template <typename T>
  static void ResizeArrays(HugeArray<T>* steps, HugeArray<T>* versions, size_t n, size_t units) {
    HugeArray<T> s, v;
    s.Reset(units, 0);
    v.Reset(units, 0);
    std::copy(steps->data(), steps->data() + n, s.data());
    std::copy(versions->data(), versions->data() + n, v.data());
    steps->Swap(s);
    versions->Swap(v);
  }

  bool wide_ = false;
  HugeArray<int32_t> steps_, versions_;
  HugeArray<int64_t> wide_steps_, wide_versions_;
  int64_t max_step_ = 0, max_version_ = 0;  // upper bounds of every unit's counts
};

}  // namespace ps
