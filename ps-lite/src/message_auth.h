// Message authentication on one connection (ps-lite/README.md, Security): what makes a message
// seen on the wire useless to anyone without the job's secret.
//
// A connection (a ZMQ DEALER, a UCX client endpoint) starts with a hello: the sender's fresh
// nonce and an HMAC of it, proving the job's secret. The receiver answers with a welcome: its
// own fresh nonce and an HMAC of both. Each side then holds the connection's key,
// HMAC(message key, both nonces), which no earlier connection or other job had. Every message
// carries a tag: the sender's nonce (which connection), a sequence number counting up from 1,
// and the HMAC under the connection's key of the sequence number, the meta header and the blob
// sizes. A receiver takes a message only with a known nonce, a good HMAC and a sequence number
// past the last one it took on that connection; the first node id a connection sends from is
// the only one it may use after. So a recorded message re-sent, on a new connection or the
// same, is refused, and so is any message made without the secret.
//
// The blobs' bytes are not in the HMAC (that would cost a hash of every row): they cannot be
// replayed, since they travel only inside a message, but one who can rewrite a live TCP stream
// could change them. The vans frame the tag: ZMQ as a frame of its own before the meta, UCX at
// the head of the active message's header.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace ps {
namespace auth {

constexpr size_t kNonceBytes = 16;
constexpr size_t kMacBytes = 32;
// "HMA1", then one byte of kind.
constexpr char kHelloKind = 'H', kWelcomeKind = 'W', kRefusalKind = 'R', kTagKind = 'M';
constexpr size_t kHelloBytes = 5 + kNonceBytes + kMacBytes;
constexpr size_t kWelcomeBytes = 5 + 2 * kNonceBytes + kMacBytes;
constexpr size_t kRefusalBytes = 5 + kNonceBytes;
constexpr size_t kTagBytes = 5 + kNonceBytes + 8 + kMacBytes;

// The kind of an authentication frame (kHelloKind, ...), or 0 when `bytes` is none.
char FrameKind(const char* bytes, size_t n);

// What a message's HMAC covers besides its sequence number.
struct Sealed {
  const char* head;  // the serialized meta
  size_t head_bytes;
  const std::vector<uint64_t>& blob_sizes;
};

// The sending side of one connection.
class Outbound {
 public:
  explicit Outbound(const std::string& message_key);  // draws this connection's nonce
  std::string Hello() const;
  // Takes the receiver's answer to this connection's hello: true once it welcomed us with
  // proof of the secret. *refused: it refused our hello, or its welcome proves another secret.
  bool Accept(const char* frame, size_t n, bool* refused);
  bool ready() const { return !key_.empty(); }
  const std::string& nonce() const { return nonce_; }
  // The tag of the next message (the caller sends messages in the order it seals them).
  std::string Seal(const Sealed& m);

 private:
  std::string message_key_, nonce_, key_;
  uint64_t seq_ = 0;
};

// The receiving side: every connection opened to this node. Not thread safe; each van uses
// it from one thread (ZMQ) or under its worker lock (UCX).
class Inbound {
 public:
  explicit Inbound(const std::string& message_key) : message_key_(message_key) {}
  // The answer to a hello frame: a welcome, or a refusal when it does not prove the secret
  // (*refused set). A hello of a known connection (repeated, or recorded and sent again) gets
  // that connection's welcome again and changes nothing.
  std::string Answer(const char* hello, size_t n, bool* refused);
  // Checks a message's tag; "" when it may be read (and its sequence number is taken), else
  // why not. Then Speaks says whether `sender` may speak on the tag's connection.
  std::string Open(const char* tag, size_t n, const Sealed& m, std::string* connection);
  std::string Speaks(const std::string& connection, int sender);

 private:
  struct Connection {
    std::string key, nonce;  // the receiver's nonce of its welcome
    uint64_t last_seq = 0;
    int speaker = -2;  // the node id it speaks for; -2 until its first message names one
  };
  static constexpr size_t kMaxConnections = 4096;
  std::string message_key_;
  std::unordered_map<std::string, Connection> connections_;  // by the sender's nonce
};

// The key every connection's key is derived from, from the job's secret.
std::string MessageKey(const std::string& secret);

}  // namespace auth
}  // namespace ps
