#include "auth.h"

#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "logging.h"
#include "postoffice.h"  // NowSeconds

namespace ps {
namespace auth {
namespace {

// SHA-256 (FIPS 180-4), here so that the module needs no crypto library of its own.
constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t Rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void Block(uint32_t h[8], const unsigned char* p) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 | p[4 * i + 3];
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = Rotr(w[i - 15], 7) ^ Rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = Rotr(w[i - 2], 17) ^ Rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t t1 = k + (Rotr(e, 6) ^ Rotr(e, 11) ^ Rotr(e, 25)) + ((e & f) ^ (~e & g)) + kK[i] + w[i];
    const uint32_t t2 = (Rotr(a, 2) ^ Rotr(a, 13) ^ Rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

}  // namespace

std::string Sha256(const std::string& msg) {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::string m = msg;
  const uint64_t bits = uint64_t(msg.size()) * 8;
  m += '\x80';
  while (m.size() % 64 != 56) m += '\0';
  for (int i = 7; i >= 0; --i) m += static_cast<char>(bits >> (8 * i));
  for (size_t at = 0; at < m.size(); at += 64) Block(h, reinterpret_cast<const unsigned char*>(m.data()) + at);
  std::string out(32, '\0');
  for (int i = 0; i < 32; ++i) out[i] = static_cast<char>(h[i / 4] >> (24 - 8 * (i % 4)));
  return out;
}

std::string HmacSha256(const std::string& key, const std::string& msg) {
  std::string k = key.size() > 64 ? Sha256(key) : key;
  k.resize(64, '\0');
  std::string inner(64, '\0'), outer(64, '\0');
  for (int i = 0; i < 64; ++i) {
    inner[i] = static_cast<char>(k[i] ^ 0x36);
    outer[i] = static_cast<char>(k[i] ^ 0x5c);
  }
  return Sha256(outer + Sha256(inner + msg));
}

bool SameBytes(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
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
