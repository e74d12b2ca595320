#include "data/stream_lines.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "common/key_hash.h"
#include "data/click_log.h"

namespace hetu {
namespace data {
namespace {

// A finite number as std::from_chars reads the whole of `s` (Python's float() agrees there; what
// from_chars refuses, such as "+1", "1_0" or " 1", is left to it).
bool ParseNumber(std::string_view s, double* out) {
  if (s.empty()) return false;
  const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return error == std::errc() && end == s.data() + s.size() && std::isfinite(*out);
}

// Calls take(piece) for each piece of `s` between separators; false if take refuses one.
template <typename Take>
bool ForEachPiece(std::string_view s, std::string_view separator, Take take) {
  size_t start = 0;
  while (true) {
    const size_t at = separator.size() == 1 ? s.find(separator[0], start) : s.find(separator, start);
    if (at == std::string_view::npos) return take(s.substr(start));
    if (!take(s.substr(start, at - start))) return false;
    start = at + separator.size();
  }
}

}  // namespace

StreamLineEncoder::StreamLineEncoder(StreamLayout layout) : layout_(std::move(layout)) {
  if (layout_.delimiter.empty()) throw std::invalid_argument("StreamLineEncoder: an empty delimiter");
  for (const StreamColumn& c : layout_.columns) {
    const bool keyed = c.kind == StreamColumn::kCategorical || c.kind == StreamColumn::kBag || c.kind == StreamColumn::kId;
    const int width = c.kind == StreamColumn::kBag ? c.slots : 1;
    if (keyed && (c.output < 0 || c.output + width > layout_.num_sparse || c.field < 0))
      throw std::invalid_argument("StreamLineEncoder: a keyed column outside the sparse columns");
    if ((c.kind == StreamColumn::kNumber || (c.kind == StreamColumn::kInteger && c.output >= 0)) &&
        c.output >= layout_.num_dense)
      throw std::invalid_argument("StreamLineEncoder: a dense column outside the dense columns");
    if (c.kind == StreamColumn::kBag && (c.separator.empty() || c.slots < 1))
      throw std::invalid_argument("StreamLineEncoder: a bag needs a separator and slots");
    if (c.kind == StreamColumn::kId && c.side >= static_cast<int>(sides_.size())) sides_.resize(c.side + 1);
  }
}

void StreamLineEncoder::SetSide(int side, const std::vector<int64_t>& raw_ids, const std::vector<int64_t>& keys,
                                int width, int output) {
  if (side < 0 || side >= static_cast<int>(sides_.size()))
    throw std::invalid_argument("StreamLineEncoder: no id column has side table " + std::to_string(side));
  if (keys.size() != raw_ids.size() * static_cast<size_t>(width) || output < 0 || output + width > layout_.num_sparse)
    throw std::invalid_argument("StreamLineEncoder: side keys must be [ids, width] within the sparse columns");
  SideKeys& s = sides_[side];
  s.row.clear();
  for (size_t i = 0; i < raw_ids.size(); ++i) s.row.emplace(raw_ids[i], static_cast<int64_t>(i));
  s.keys = keys;
  s.width = width;
  s.output = output;
}

bool StreamLineEncoder::EncodeLine(std::string_view line, float* label, double* dense, int64_t* sparse) const {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  for (char ch : line)
    if (static_cast<unsigned char>(ch) >= 0x80 || ch == '\r') return false;  // for the Python definition
  size_t column = 0;
  const size_t num_columns = layout_.columns.size();
  const bool ok = ForEachPiece(line, layout_.delimiter, [&](std::string_view value) {
    if (column >= num_columns) return false;
    const StreamColumn& c = layout_.columns[column++];
    int64_t integer;
    double number;
    switch (c.kind) {
      case StreamColumn::kIgnore:
        return true;
      case StreamColumn::kClickLabel:
        if (value != "0" && value != "1") return false;
        *label = value[0] == '1' ? 1.0f : 0.0f;
        return true;
      case StreamColumn::kThresholdLabel:
        if (!ParseNumber(value, &number) || !(number > c.low && number <= c.high)) return false;
        *label = number >= c.threshold ? 1.0f : 0.0f;
        return true;
      case StreamColumn::kInteger:
        if ((value.empty() && !c.allow_empty) || !ParseInteger(value, &integer)) return false;
        if (c.output >= 0) dense[c.output] = static_cast<double>(integer);
        return true;
      case StreamColumn::kNumber:
        if (value.empty()) {
          dense[c.output] = 0.0;
          return true;
        }
        return ParseNumber(value, &dense[c.output]);
      case StreamColumn::kCategorical:
        sparse[c.output] = KeyHash(static_cast<uint32_t>(c.field), value);
        return true;
      case StreamColumn::kBag: {
        int used = 0;
        if (!value.empty() && !ForEachPiece(value, c.separator, [&](std::string_view item) {
              if (item.empty() || used == c.slots) return false;
              sparse[c.output + used++] = KeyHash(static_cast<uint32_t>(c.field), item);
              return true;
            }))
          return false;
        for (; used < c.slots; ++used) sparse[c.output + used] = kKeyHashPadding;
        return true;
      }
      case StreamColumn::kId: {
        if (value.empty() || !ParseInteger(value, &integer)) return false;
        sparse[c.output] = KeyHash(static_cast<uint32_t>(c.field), std::to_string(integer));
        if (c.side < 0) return true;
        const SideKeys& side = sides_[c.side];
        const auto found = side.row.find(integer);
        if (found == side.row.end()) return false;  // the Python definition names the file
        std::memcpy(sparse + side.output, side.keys.data() + found->second * side.width,
                    sizeof(int64_t) * side.width);
        return true;
      }
    }
    return false;
  });
  return ok && column == num_columns;
}

int64_t StreamLineEncoder::CountLines(std::string_view text, int64_t start, int64_t max_lines, bool final) {
  int64_t lines = 0;
  const char* p = text.data() + start;
  const char* const end = text.data() + text.size();
  while (p < end && lines < max_lines) {
    const void* nl = std::memchr(p, '\n', static_cast<size_t>(end - p));
    if (!nl) return lines + (final ? 1 : 0);
    ++lines;
    p = static_cast<const char*>(nl) + 1;
  }
  return lines;
}

int64_t StreamLineEncoder::Encode(std::string_view text, int64_t start, int64_t max_lines, bool final, float* labels,
                                  double* dense, int64_t* sparse, int64_t* ends) const {
  if (start < 0 || start > static_cast<int64_t>(text.size()))
    throw std::out_of_range("StreamLineEncoder::Encode: start outside the text");
  const int64_t nd = layout_.num_dense, ns = layout_.num_sparse;
  int64_t lines = 0;
  size_t pos = static_cast<size_t>(start);
  while (pos < text.size() && lines < max_lines) {
    size_t nl = text.find('\n', pos);
    size_t next = nl + 1;
    if (nl == std::string_view::npos) {
      if (!final) break;
      nl = next = text.size();
    }
    if (!EncodeLine(text.substr(pos, nl - pos), labels + lines, dense + lines * nd, sparse + lines * ns)) break;
    ends[lines++] = static_cast<int64_t>(next);
    pos = next;
  }
  return lines;
}

}  // namespace data
}  // namespace hetu
