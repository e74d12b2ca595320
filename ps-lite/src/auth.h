// The job's secret and what the vans derive from it (ps-lite/README.md, "Security").
// A launcher makes one secret per job and hands it to every process of the job in the
// environment (HETU_JOB_SECRET) or in a file only its user can read (HETU_JOB_SECRET_FILE);
// it never travels on the wire: peers prove they know it (ZMQ: CURVE keys derived from it;
// UCX: an HMAC of a fresh nonce), and every message carries an HMAC under a key of its
// connection (message_auth.h).
#pragma once
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace ps {
namespace auth {

// The secret of this process's job; "" when none is set. Throws when HETU_JOB_SECRET_FILE
// names a file that cannot be read or that others may read.
std::string JobSecret();

// HMAC-SHA256 (RFC 2104), 32 raw bytes, by libsodium (which libzmq's CURVE uses too).
std::string HmacSha256(const std::string& key, const std::string& msg);
// The same of the pieces' bytes one after another.
std::string HmacSha256(const std::string& key, std::initializer_list<std::string_view> pieces);
// Fresh random bytes (libsodium's randombytes: the kernel's generator).
std::string RandomBytes(size_t n);
// Constant-time comparison of two byte strings.
bool SameBytes(const std::string& a, const std::string& b);

// PS_AUTH: how the ZMQ van authenticates, "plain" (default) or "curve"; throws on others.
std::string ZmqMechanism();

// Says once per process that the job runs without authentication.
void WarnUnauthenticated(const char* van);

// At most one line per `interval_s`; the lines held back are counted in the next one.
class RateLimit {
 public:
  explicit RateLimit(double interval_s = 5) : interval_s_(interval_s) {}
  // True when a line may be written now; *suppressed: lines held back since the last one.
  bool Allow(long* suppressed);

 private:
  double interval_s_;
  std::atomic<double> last_{-1e18};
  std::atomic<long> held_{0};
};

}  // namespace auth
}  // namespace ps
