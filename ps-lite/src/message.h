// A message: a protobuf meta header plus data blobs that travel as separate ZMQ frames.
// A Blob shares ownership of its bytes, so a received frame can be handed on (to NumPy, to a
// server table) without copying, and a sent array stays alive until the transport is done.
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "meta.pb.h"

namespace ps {

struct Blob {
  std::shared_ptr<void> owner;  // keeps `data` alive; null when the caller guarantees lifetime
  const char* data = nullptr;
  size_t size = 0;

  template <typename T>
  const T* as() const { return reinterpret_cast<const T*>(data); }
  template <typename T>
  size_t count() const { return size / sizeof(T); }

  // A blob that owns a copy of a vector's contents (moved, not copied).
  template <typename T>
  static Blob FromVector(std::vector<T>&& v) {
    auto holder = std::make_shared<std::vector<T>>(std::move(v));
    Blob b;
    b.data = reinterpret_cast<const char*>(holder->data());
    b.size = holder->size() * sizeof(T);
    b.owner = holder;
    return b;
  }
  // An uninitialised buffer of n elements (no zero-fill: it is about to be overwritten).
  template <typename T>
  static Blob Alloc(size_t n, T** out) {
    auto holder = std::shared_ptr<T[]>(new T[n > 0 ? n : 1]);
    *out = holder.get();
    Blob b;
    b.data = reinterpret_cast<const char*>(holder.get());
    b.size = n * sizeof(T);
    b.owner = holder;
    return b;
  }
  // A view of memory kept alive elsewhere (e.g. a NumPy array held by the request handle).
  static Blob View(const void* p, size_t n) {
    Blob b;
    b.data = static_cast<const char*>(p);
    b.size = n;
    return b;
  }
  // Received frames may sit at any offset in ZMQ's receive buffer; typed access needs
  // alignment, so misaligned blobs are copied once.
  void Align() {
    if (reinterpret_cast<uintptr_t>(data) % 8 == 0) return;
    auto holder = std::shared_ptr<char[]>(new char[size + 8]);
    std::memcpy(holder.get(), data, size);
    data = holder.get();
    owner = holder;
  }
};

struct Message {
  pb::Meta meta;
  std::vector<Blob> data;
};

}  // namespace ps
