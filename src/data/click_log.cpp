#include "data/click_log.h"

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <utility>

#include "common/key_hash.h"
#include "common/parallel.h"

namespace hetu {
namespace data {
namespace {

uint64_t HashBytes(std::string_view s) {
  // FNV-1a, then a final mix so that linear probing sees well-spread low bits.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h ? h : 1;
}

}  // namespace

bool ParseInteger(std::string_view s, int64_t* out) {
  if (s.empty()) {
    *out = 0;
    return true;
  }
  size_t i = 0;
  const bool negative = s[0] == '-';
  if (negative) i = 1;
  const size_t digits = s.size() - i;
  if (digits == 0 || digits > 18) return false;
  int64_t v = 0;
  for (; i < s.size(); ++i) {
    const unsigned d = static_cast<unsigned char>(s[i]) - '0';
    if (d > 9) return false;
    v = v * 10 + d;
  }
  *out = negative ? -v : v;
  return true;
}

FieldVocabulary::FieldVocabulary() : cells_(1024), mask_(1023) {}

const FieldVocabulary::Cell* FieldVocabulary::Find(std::string_view value, uint64_t hash) const {
  for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
    const Cell& c = cells_[i];
    if (!c.hash) return &c;
    if (c.hash == hash && Bytes(c) == value) return &c;
  }
}

void FieldVocabulary::Grow() {
  std::vector<Cell> old(cells_.size() * 2);
  old.swap(cells_);
  mask_ = cells_.size() - 1;
  for (const Cell& c : old) {
    if (!c.hash) continue;
    size_t i = c.hash & mask_;
    while (cells_[i].hash) i = (i + 1) & mask_;
    cells_[i] = c;
  }
}

void FieldVocabulary::Count(std::string_view value) {
  if (built_) throw std::logic_error("FieldVocabulary: Count after Build");
  const uint64_t hash = HashBytes(value);
  Cell* c = const_cast<Cell*>(Find(value, hash));
  if (c->hash) {
    ++c->count;
    return;
  }
  if (value.size() >= kMaxValueBytes) throw std::length_error("FieldVocabulary: a value of 16 MB or more");
  c->hash = hash;
  c->where = static_cast<uint64_t>(arena_.size()) << 24 | value.size();
  c->count = 1;
  arena_.append(value);
  if (++size_ * 2 > cells_.size()) Grow();
}

int64_t FieldVocabulary::Build(int64_t min_count) {
  if (built_) throw std::logic_error("FieldVocabulary: Build twice");
  built_ = true;
  std::vector<size_t> kept;
  for (size_t i = 0; i < cells_.size(); ++i) {
    const Cell& c = cells_[i];
    if (c.hash && (c.where & 0xffffff) > 0 && c.count >= min_count) kept.push_back(i);
  }
  std::sort(kept.begin(), kept.end(), [this](size_t a, size_t b) {
    const Cell &x = cells_[a], &y = cells_[b];
    if (x.count != y.count) return x.count > y.count;
    return Bytes(x) < Bytes(y);
  });
  for (Cell& c : cells_) c.count = 0;
  for (size_t rank = 0; rank < kept.size(); ++rank) cells_[kept[rank]].count = static_cast<int64_t>(rank) + 1;
  return static_cast<int64_t>(kept.size()) + 1;
}

int64_t FieldVocabulary::Id(std::string_view value) const {
  if (!built_) throw std::logic_error("FieldVocabulary: Id before Build");
  const Cell* c = Find(value, HashBytes(value));
  return c->hash ? c->count : 0;
}

std::vector<std::string_view> FieldVocabulary::Kept() const {
  if (!built_) throw std::logic_error("FieldVocabulary: Kept before Build");
  std::vector<std::string_view> kept;
  for (const Cell& c : cells_)
    if (c.hash && c.count > 0) kept.push_back({});
  for (const Cell& c : cells_)
    if (c.hash && c.count > 0) kept[c.count - 1] = Bytes(c);
  return kept;
}

ClickLogEncoder::ClickLogEncoder(ClickLogLayout layout)
    : layout_(std::move(layout)), fields_(layout_.categorical_columns.size()) {
  auto check = [this](int column, const char* what) {
    if (column < 0 || column >= layout_.num_columns)
      throw std::invalid_argument(std::string("ClickLogEncoder: ") + what + " column outside the line");
  };
  check(layout_.label_column, "label");
  for (int c : layout_.dense_columns) check(c, "dense");
  for (int c : layout_.categorical_columns) check(c, "categorical");
}

bool ClickLogEncoder::Split(std::string_view line, std::vector<std::string_view>* columns) const {
  // Too long for a dictionary slot: the Python path raises that on the calling thread (a worker
  // thread of the pool must not throw).
  if (line.size() >= kMaxValueBytes) return false;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  columns->clear();
  size_t start = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(line[i]);
    // Non-ASCII bytes (Python decodes them, replacing invalid ones) and a lone '\r' (a line end
    // to Python's universal newlines) are for the Python parser.
    if (c >= 0x80 || c == '\r') return false;
    if (c == static_cast<unsigned char>(layout_.delimiter)) {
      columns->push_back(line.substr(start, i - start));
      start = i + 1;
    }
  }
  columns->push_back(line.substr(start));
  if (static_cast<int>(columns->size()) != layout_.num_columns) return false;
  const std::string_view label = (*columns)[layout_.label_column];
  if (label != "0" && label != "1") return false;
  int64_t unused;
  for (int c : layout_.dense_columns)
    if (!ParseInteger((*columns)[c], &unused)) return false;
  return true;
}

std::vector<std::string_view> ClickLogEncoder::Lines(std::string_view text, int64_t max_rows) {
  std::vector<std::string_view> lines;
  size_t pos = 0;
  while (pos < text.size() && (max_rows < 0 || static_cast<int64_t>(lines.size()) < max_rows)) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    lines.push_back(text.substr(pos, end - pos));
    pos = end + 1;
  }
  return lines;
}

template <typename Take>
bool ClickLogEncoder::ForEachLine(const std::vector<std::string_view>& lines, Take take) const {
  std::atomic<bool> clean{true};
  parallel_for(static_cast<int64_t>(lines.size()), kLinesPerPart, [&](int64_t begin, int64_t end) {
    std::vector<std::string_view> columns;
    for (int64_t i = begin; i < end && clean.load(std::memory_order_relaxed); ++i) {
      if (!Split(lines[i], &columns)) {
        clean = false;
        return;
      }
      take(i, columns);
    }
  });
  return clean;
}

bool ClickLogEncoder::CheckChunk(const std::vector<std::string_view>& lines) const {
  return ForEachLine(lines, [](int64_t, const std::vector<std::string_view>&) {});
}

bool ClickLogEncoder::CountChunk(const std::vector<std::string_view>& lines) {
  // Every line is checked first: a chunk is counted whole or not at all.
  if (!CheckChunk(lines)) return false;
  // Each thread counts the values of its own fields, so that no field's table is shared, and
  // splits every line again for them (cheap next to the hash-table probes of a large field).
  const auto& categorical = layout_.categorical_columns;
  parallel_for(static_cast<int64_t>(fields_.size()), 1, [&](int64_t first, int64_t last) {
    std::vector<std::string_view> columns;
    for (std::string_view line : lines) {
      Split(line, &columns);
      for (int64_t f = first; f < last; ++f) fields_[f].Count(columns[categorical[f]]);
    }
  });
  return true;
}

std::vector<int64_t> ClickLogEncoder::Build(int64_t min_count) {
  std::vector<int64_t> sizes;
  for (FieldVocabulary& field : fields_) sizes.push_back(field.Build(min_count));
  return sizes;
}

template <typename Key>
bool ClickLogEncoder::EncodeLines(const std::vector<std::string_view>& lines, float* labels, int64_t* dense,
                                  int64_t* sparse, Key key) const {
  const auto& categorical = layout_.categorical_columns;
  const auto& dense_columns = layout_.dense_columns;
  const int64_t nf = static_cast<int64_t>(categorical.size()), nd = static_cast<int64_t>(dense_columns.size());
  return ForEachLine(lines, [&](int64_t r, const std::vector<std::string_view>& columns) {
    labels[r] = columns[layout_.label_column] == "1" ? 1.0f : 0.0f;
    for (int64_t k = 0; k < nd; ++k) ParseInteger(columns[dense_columns[k]], &dense[r * nd + k]);
    for (int64_t f = 0; f < nf; ++f) sparse[r * nf + f] = key(f, columns[categorical[f]]);
  });
}

bool ClickLogEncoder::EncodeChunk(const std::vector<std::string_view>& lines, const std::vector<int64_t>& offsets,
                                  float* labels, int64_t* dense, int64_t* sparse) const {
  if (offsets.size() != layout_.categorical_columns.size())
    throw std::invalid_argument("EncodeChunk: one offset per field");
  return EncodeLines(lines, labels, dense, sparse,
                     [&](int64_t f, std::string_view value) { return fields_[f].Id(value) + offsets[f]; });
}

bool ClickLogEncoder::HashChunk(const std::vector<std::string_view>& lines, float* labels, int64_t* dense,
                                int64_t* sparse) const {
  return EncodeLines(lines, labels, dense, sparse,
                     [](int64_t f, std::string_view value) { return KeyHash(static_cast<uint32_t>(f), value); });
}

}  // namespace data
}  // namespace hetu
