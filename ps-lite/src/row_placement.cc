#include "row_placement.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

namespace ps {

RowPlacement::Kind RowPlacement::KindFromEnv() {
  const char* env = std::getenv("PS_ROW_PLACEMENT");
  const std::string v = env ? env : "";
  if (v.empty() || v == "strided") return kStrided;
  if (v == "contiguous") return kContiguous;
  throw std::runtime_error("PS_ROW_PLACEMENT='" + v + "': expected strided (row r on server r mod S) or contiguous");
}

const char* RowPlacement::Name(Kind kind) { return kind == kStrided ? "strided" : "contiguous"; }

RowPlacement::RowPlacement(Kind kind, int64_t rows, int num_servers)
    : kind_(kind), rows_(rows), servers_(std::max(1, num_servers)),
      per_(std::max<int64_t>(1, (rows + servers_ - 1) / servers_)) {}

int64_t RowPlacement::Rows(int server) const {
  if (kind_ == kStrided) return server < rows_ ? (rows_ - 1 - server) / servers_ + 1 : 0;
  return std::min(rows_, per_ * (server + 1)) - First(server);
}

std::string RowPlacement::Describe(int server) const {
  const int64_t n = Rows(server);
  if (kind_ == kContiguous || servers_ == 1 || n == 0)
    return "rows [" + std::to_string(First(server)) + ", " + std::to_string(First(server) + n) + ")";
  return "rows r < " + std::to_string(rows_) + " with r mod " + std::to_string(servers_) + " == " +
         std::to_string(server);
}

}  // namespace ps
