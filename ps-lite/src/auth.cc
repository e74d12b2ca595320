#include "auth.h"

#include <sodium.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "logging.h"
#include "postoffice.h"  // NowSeconds

namespace ps {
namespace auth {
namespace {

void InitSodium() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (sodium_init() < 0) throw std::runtime_error("libsodium could not be initialised");
  });
}

}  // namespace

std::string HmacSha256(const std::string& key, std::initializer_list<std::string_view> pieces) {
  InitSodium();
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, reinterpret_cast<const unsigned char*>(key.data()), key.size());
  for (std::string_view p : pieces)
    crypto_auth_hmacsha256_update(&st, reinterpret_cast<const unsigned char*>(p.data()), p.size());
  std::string out(crypto_auth_hmacsha256_BYTES, '\0');
  crypto_auth_hmacsha256_final(&st, reinterpret_cast<unsigned char*>(&out[0]));
  return out;
}

std::string HmacSha256(const std::string& key, const std::string& msg) { return HmacSha256(key, {msg}); }

std::string RandomBytes(size_t n) {
  InitSodium();
  std::string out(n, '\0');
  randombytes_buf(&out[0], n);
  return out;
}

bool SameBytes(const std::string& a, const std::string& b) {
  return a.size() == b.size() && sodium_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string JobSecret() {
  const char* value = std::getenv("HETU_JOB_SECRET");
  if (value && *value) return value;
  const char* path = std::getenv("HETU_JOB_SECRET_FILE");
  if (!path || !*path) return "";
  struct stat st {};
  if (stat(path, &st) != 0) throw std::runtime_error(std::string("HETU_JOB_SECRET_FILE=") + path + ": no such file");
  // A secret others can read is no secret: refuse it rather than run with it.
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    throw std::runtime_error(std::string("HETU_JOB_SECRET_FILE=") + path +
                             " may be read by others (chmod 600 it)");
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.empty()) throw std::runtime_error(std::string("HETU_JOB_SECRET_FILE=") + path + " is empty");
  return s;
}

std::string ZmqMechanism() {
  const char* v = std::getenv("PS_AUTH");
  // PLAIN by default: CURVE encrypts every byte on ZMQ's one I/O thread, at a fifth or less
  // of the unencrypted rate on loopback (ps-lite/README.md, Security).
  const std::string m = v && *v ? v : "plain";
  if (m != "curve" && m != "plain") throw std::runtime_error("PS_AUTH='" + m + "': expected curve or plain");
  return m;
}

void WarnUnauthenticated(const char* van) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  LogLine() << "warning: no HETU_JOB_SECRET: the " << van
            << " van runs without authentication, and anyone who reaches its ports can join or command "
               "the job (the launcher always sets one; see ps-lite/README.md, Security)";
}

bool RateLimit::Allow(long* suppressed) {
  const double now = NowSeconds();
  double last = last_.load();
  if (now - last < interval_s_ || !last_.compare_exchange_strong(last, now)) {
    ++held_;
    return false;
  }
  *suppressed = held_.exchange(0);
  return true;
}

}  // namespace auth
}  // namespace ps
