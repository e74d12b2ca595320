// The key of a categorical value in hashed datasets (`prepare ... --ids hashed`): a 64-bit hash
// of (field index, raw value bytes), the same on every machine, in C++ and in Python.
//
// Exactly what is hashed: XXH64 with seed 0 (xxHash's 64-bit hash, Yann Collet's published
// algorithm and test vectors) over the bytes
//
//     field as 4 bytes, little-endian (uint32)  ||  the value's raw bytes
//
// and the result is the uint64's bits read as an int64 (ids are int64 end to end). The one
// result -1 (all bits set) is the padding of a bag's empty slots, so a hash equal to -1 becomes
// -2 instead. Every multi-byte read is an explicit little-endian read, so the key does not
// depend on the CPU's byte order.
//
// What "the value's raw bytes" are is each reader's to say (docs/design.md section 9): the column
// text in UTF-8 for click logs and MovieLens, the 8 little-endian bytes of the field-local id for
// synthetic data.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace hetu {

namespace xxh64_detail {

constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kPrime3 = 0x165667B19E3779F9ull;
constexpr uint64_t kPrime4 = 0x85EBCA77C2B2AE63ull;
constexpr uint64_t kPrime5 = 0x27D4EB2F165667C5ull;

inline uint64_t Rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t Read64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline uint64_t Read32(const unsigned char* p) {
  return uint64_t{p[0]} | uint64_t{p[1]} << 8 | uint64_t{p[2]} << 16 | uint64_t{p[3]} << 24;
}

inline uint64_t Round(uint64_t acc, uint64_t input) { return Rotl(acc + input * kPrime2, 31) * kPrime1; }

inline uint64_t MergeRound(uint64_t acc, uint64_t v) { return (acc ^ Round(0, v)) * kPrime1 + kPrime4; }

}  // namespace xxh64_detail

// XXH64 of `size` bytes at `data` with `seed`.
inline uint64_t Xxh64(const void* data, size_t size, uint64_t seed = 0) {
  using namespace xxh64_detail;
  const unsigned char* p = static_cast<const unsigned char*>(data);
  const unsigned char* const end = p + size;
  uint64_t h;
  if (size >= 32) {
    uint64_t v1 = seed + kPrime1 + kPrime2, v2 = seed + kPrime2, v3 = seed, v4 = seed - kPrime1;
    for (; p + 32 <= end; p += 32) {
      v1 = Round(v1, Read64(p));
      v2 = Round(v2, Read64(p + 8));
      v3 = Round(v3, Read64(p + 16));
      v4 = Round(v4, Read64(p + 24));
    }
    h = Rotl(v1, 1) + Rotl(v2, 7) + Rotl(v3, 12) + Rotl(v4, 18);
    h = MergeRound(MergeRound(MergeRound(MergeRound(h, v1), v2), v3), v4);
  } else {
    h = seed + kPrime5;
  }
  h += static_cast<uint64_t>(size);
  for (; p + 8 <= end; p += 8) h = Rotl(h ^ Round(0, Read64(p)), 27) * kPrime1 + kPrime4;
  if (p + 4 <= end) {
    h = Rotl(h ^ (Read32(p) * kPrime1), 23) * kPrime2 + kPrime3;
    p += 4;
  }
  for (; p < end; ++p) h = Rotl(h ^ (*p * kPrime5), 11) * kPrime1;
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

constexpr int64_t kKeyHashPadding = -1;      // a bag's empty slot; no key equals it
constexpr int64_t kKeyHashInsteadOfPadding = -2;

// The key of `value` in field `field` (the layout above).
inline int64_t KeyHash(uint32_t field, std::string_view value) {
  // field || value in one buffer; on the stack for the short values of click logs
  char small[256];
  std::string large;
  char* buffer = small;
  if (value.size() + 4 > sizeof(small)) {
    large.resize(value.size() + 4);
    buffer = large.data();
  }
  for (int i = 0; i < 4; ++i) buffer[i] = static_cast<char>((field >> (8 * i)) & 0xff);
  if (!value.empty()) std::memcpy(buffer + 4, value.data(), value.size());
  uint64_t h = Xxh64(buffer, value.size() + 4, 0);
  int64_t key;
  std::memcpy(&key, &h, sizeof(key));
  return key == kKeyHashPadding ? kKeyHashInsteadOfPadding : key;
}

// The key of a field-local integer id: its 8 bytes, little-endian, as the value.
inline int64_t KeyHash(uint32_t field, int64_t id) {
  const uint64_t u = static_cast<uint64_t>(id);
  char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((u >> (8 * i)) & 0xff);
  return KeyHash(field, std::string_view(bytes, 8));
}

// How meta.json names the hash.
constexpr const char* kKeyHashName = "xxh64(field:u32le || value bytes), seed 0, -1 -> -2";

}  // namespace hetu
