// Vectors whose resize leaves new elements of plain types uninitialised: for buffers of megabytes
// that are written whole before they are read (a plan's lists of rows). A value-initialising
// resize zeroes them first, a pass over the memory on one thread before the parallel steps that
// fill it.
#pragma once
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace hetu {

template <typename T>
struct NoInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = NoInitAllocator<U>;
  };
  NoInitAllocator() = default;
  template <typename U>
  NoInitAllocator(const NoInitAllocator<U>&) {}

  // Default-initialised (left as is, for plain types) where a vector would value-initialise.
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

template <typename T>
using NoInitVector = std::vector<T, NoInitAllocator<T>>;

}  // namespace hetu
