// The hot loop of `python -m hetu.data.prepare criteo|avazu`: splitting lines, checking them,
// counting each field's categorical values (pass 1) and encoding them as local ids (pass 2), or,
// for hashed ids, encoding them as their keys in one pass (HashChunk).
//
// hetu.data.tabular keeps the semantics and the error messages. This code takes only chunks
// whose every line is plainly clean, where the Python parser is known to give the same result:
// ASCII bytes, '\n' or "\r\n" line ends, exactly the expected columns, a label of "0" or "1",
// integer columns empty or an optional '-' and 1-18 digits. For any other chunk it returns false
// having changed nothing, and the Python parser takes that chunk (and reports its bad lines);
// its values come back here through CountValue / Id. So both parsers give identical files.
//
// Chunks are worked on by hetu::parallel_for's threads (HETU_NUM_THREADS): lines are split and
// encoded in ranges, and values are counted field by field, each field by one thread, so the
// dictionaries and the files do not depend on the thread count.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hetu {
namespace data {

struct ClickLogLayout {
  char delimiter = '\t';
  int num_columns = 0;
  int label_column = 0;
  std::vector<int> dense_columns;
  std::vector<int> categorical_columns;
};

// One categorical field's distinct values: their bytes in one arena, and an open-addressing
// table of (hash, where the bytes are, count), 24 bytes a slot and at most half the slots used:
// about 2.5 GB for the 33.8 million values of the full Criteo file.
class FieldVocabulary {
 public:
  FieldVocabulary();
  void Count(std::string_view value);
  // Keeps values seen at least min_count times (the empty value never), most frequent first,
  // ties by value (bytewise, which for UTF-8 is code point order, as Python sorts str), and
  // numbers them from 1. Returns the field's size: kept values + 1 (id 0: missing or rare).
  int64_t Build(int64_t min_count);
  // Local id after Build: 0 for missing, rare or unseen values.
  int64_t Id(std::string_view value) const;
  // After Build: the kept values in local id order (id 1 first), the vocabulary a later encoding
  // of raw values needs (hetu.serve).
  std::vector<std::string_view> Kept() const;

 private:
  struct Cell {
    uint64_t hash = 0;    // 0: a free slot (HashBytes never returns 0)
    uint64_t where = 0;   // offset in the arena << 24 | length
    int64_t count = 0;    // after Build: the local id
  };
  std::string_view Bytes(const Cell& c) const { return {arena_.data() + (c.where >> 24), c.where & 0xffffff}; }
  const Cell* Find(std::string_view value, uint64_t hash) const;
  void Grow();

  std::vector<Cell> cells_;
  size_t mask_ = 0, size_ = 0;
  std::string arena_;
  bool built_ = false;
};

// Empty -> 0; otherwise an optional '-' and 1-18 digits (so no overflow). Anything else is left
// to Python's int(), which also accepts '+', spaces and underscores.
bool ParseInteger(std::string_view s, int64_t* out);

constexpr size_t kMaxValueBytes = size_t{1} << 24;  // values are stored with a 24-bit length

class ClickLogEncoder {
 public:
  explicit ClickLogEncoder(ClickLogLayout layout);

  // The first max_rows lines of a chunk of complete lines (all when max_rows < 0; the file's last
  // line may lack its newline), without their '\n'.
  static std::vector<std::string_view> Lines(std::string_view text, int64_t max_rows);

  // Pass 1: counts the values of `lines`, or returns false, having counted nothing, if one of
  // them is not plainly clean.
  bool CountChunk(const std::vector<std::string_view>& lines);
  void CountValue(int field, std::string_view value) { fields_.at(field).Count(value); }
  // Hashed ids' first pass: only checks that every line is plainly clean (no counting).
  bool CheckChunk(const std::vector<std::string_view>& lines) const;

  // Builds every field's vocabulary; returns the field sizes.
  std::vector<int64_t> Build(int64_t min_count);

  // Pass 2: like CountChunk, but writes each line's label, raw integers ([lines, dense]) and
  // local ids plus the field's offset ([lines, fields]).
  bool EncodeChunk(const std::vector<std::string_view>& lines, const std::vector<int64_t>& offsets, float* labels,
                   int64_t* dense, int64_t* sparse) const;
  int64_t Id(int field, std::string_view value) const { return fields_.at(field).Id(value); }
  std::vector<std::string_view> Values(int field) const { return fields_.at(field).Kept(); }

  // Hashed ids (`--ids hashed`): like EncodeChunk, with no vocabulary, each value's key
  // KeyHash(field, value) (common/key_hash.h), the field being its categorical field's index.
  bool HashChunk(const std::vector<std::string_view>& lines, float* labels, int64_t* dense, int64_t* sparse) const;

  const ClickLogLayout& layout() const { return layout_; }
  int num_fields() const { return static_cast<int>(fields_.size()); }

 private:
  // Splits and checks one line; false when it is not plainly clean.
  bool Split(std::string_view line, std::vector<std::string_view>* columns) const;
  // Calls take(i, columns) for every line, on several threads; false if one is not clean.
  template <typename Take>
  bool ForEachLine(const std::vector<std::string_view>& lines, Take take) const;
  // Writes each line's label, raw integers and key(field, value) of each categorical value.
  template <typename Key>
  bool EncodeLines(const std::vector<std::string_view>& lines, float* labels, int64_t* dense, int64_t* sparse,
                   Key key) const;
  static constexpr int64_t kLinesPerPart = 4096;

  ClickLogLayout layout_;
  std::vector<FieldVocabulary> fields_;
};

}  // namespace data
}  // namespace hetu
