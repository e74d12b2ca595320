// The hot loop of a stream (hetu.data.stream): lines of a delimited log encoded as samples with
// hashed keys (common/key_hash.h), one pass over the bytes, on the stream's reader thread with
// the GIL released.
//
// hetu.data.stream_formats keeps the semantics and the error messages, as hetu.data.tabular does
// for ClickLogEncoder: this code takes only plainly clean lines, where the Python definition is
// known to give the same sample (ASCII bytes, '\n' or "\r\n" ends, exactly the layout's columns,
// numbers written plainly: an optional '-' and digits, a float as std::from_chars reads it and
// finite, ids known to their side table). It stops before the first other line, which the
// Python definition then parses (or reports as bad), and is called again after it.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hetu {
namespace data {

struct StreamColumn {
  enum Kind {
    kIgnore,          // any text
    kClickLabel,      // "0" or "1"
    kThresholdLabel,  // a number in (low, high]; label 1 when >= threshold
    kInteger,         // an integer (empty: 0 when allow_empty) -> dense[output] as a double, or only checked (output < 0)
    kNumber,          // a finite number (empty: 0) -> dense[output]
    kCategorical,     // the text's key -> sparse[output]
    kBag,             // values split by separator, up to slots keys -> sparse[output..], -1 padded
    kId,              // an integer; the key of its decimal text -> sparse[output], and its side table's keys
  };
  Kind kind = kIgnore;
  int field = -1;
  int output = -1;
  bool allow_empty = true;
  double threshold = 0.5, low = -1e308, high = 1e308;
  std::string separator;
  int slots = 1;
  int side = -1;
};

struct StreamLayout {
  std::string delimiter = "\t";
  std::vector<StreamColumn> columns;
  int num_dense = 0;
  int num_sparse = 0;  // int64 keys a sample
};

// The keys of a side file's fields for each raw id it describes (MovieLens users and items).
struct SideKeys {
  std::unordered_map<int64_t, int64_t> row;  // raw id -> row of keys
  std::vector<int64_t> keys;                 // [rows, width]
  int width = 0;
  int output = 0;                            // the sparse column of its first key
};

class StreamLineEncoder {
 public:
  explicit StreamLineEncoder(StreamLayout layout);
  // Side table `side` (kId columns name it): keys [raw_ids.size(), width], row-major.
  void SetSide(int side, const std::vector<int64_t>& raw_ids, const std::vector<int64_t>& keys, int width,
               int output);

  // Encodes the lines of text[start, text.size()), at most max_lines, stopping before the first
  // line that is not plainly clean or not ended by '\n' (unless `final`: the input's last line).
  // Writes each line's label, dense doubles ([lines, num_dense]), keys ([lines, num_sparse]) and
  // end (the offset in `text` after its '\n'); returns the lines encoded.
  int64_t Encode(std::string_view text, int64_t start, int64_t max_lines, bool final, float* labels,
                 double* dense, int64_t* sparse, int64_t* ends) const;

  // The lines Encode can see: '\n' ends in text[start, ...), plus a final unended line, at most max_lines.
  static int64_t CountLines(std::string_view text, int64_t start, int64_t max_lines, bool final);

  const StreamLayout& layout() const { return layout_; }

 private:
  bool EncodeLine(std::string_view line, float* label, double* dense, int64_t* sparse) const;

  StreamLayout layout_;
  std::vector<SideKeys> sides_;
};

}  // namespace data
}  // namespace hetu
