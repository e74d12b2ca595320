#include "message_auth.h"

#include <sodium.h>

#include <cstring>
#include <string_view>

#include "auth.h"

namespace ps {
namespace auth {
namespace {

constexpr char kMagic[4] = {'H', 'M', 'A', '1'};

bool Same(const char* a, const std::string& b) { return sodium_memcmp(a, b.data(), b.size()) == 0; }

std::string Frame(char kind, std::initializer_list<std::string_view> pieces) {
  std::string out(kMagic, 4);
  out += kind;
  for (std::string_view p : pieces) out += p;
  return out;
}

std::string_view Bytes(const void* p, size_t n) { return {static_cast<const char*>(p), n}; }

std::string HelloProof(const std::string& message_key, const std::string& nonce) {
  return HmacSha256(message_key, {"hello", nonce});
}
std::string WelcomeProof(const std::string& message_key, const std::string& theirs, const std::string& ours) {
  return HmacSha256(message_key, {"welcome", theirs, ours});
}
std::string ConnectionKey(const std::string& message_key, const std::string& sender_nonce,
                          const std::string& receiver_nonce) {
  return HmacSha256(message_key, {"connection", sender_nonce, receiver_nonce});
}

std::string Mac(const std::string& key, uint64_t seq, const Sealed& m) {
  const uint64_t head_bytes = m.head_bytes, blobs = m.blob_sizes.size();
  return HmacSha256(key, {Bytes(&seq, 8), Bytes(&head_bytes, 8), Bytes(m.head, m.head_bytes), Bytes(&blobs, 8),
                          Bytes(m.blob_sizes.data(), m.blob_sizes.size() * sizeof(uint64_t))});
}

}  // namespace

char FrameKind(const char* bytes, size_t n) {
  if (n < 5 || std::memcmp(bytes, kMagic, 4) != 0) return 0;
  const char kind = bytes[4];
  const size_t expected = kind == kHelloKind     ? kHelloBytes
                          : kind == kWelcomeKind ? kWelcomeBytes
                          : kind == kRefusalKind ? kRefusalBytes
                          : kind == kTagKind     ? kTagBytes
                                                 : 0;
  return n == expected ? kind : 0;
}

std::string MessageKey(const std::string& secret) { return HmacSha256(secret, {"hetu ps message key"}); }

Outbound::Outbound(const std::string& message_key) : message_key_(message_key), nonce_(RandomBytes(kNonceBytes)) {}

std::string Outbound::Hello() const {
  const std::string proof = HelloProof(message_key_, nonce_);
  return Frame(kHelloKind, {nonce_, proof});
}

bool Outbound::Accept(const char* frame, size_t n, bool* refused) {
  const char kind = FrameKind(frame, n);
  if ((kind != kWelcomeKind && kind != kRefusalKind) || !Same(frame + 5, nonce_)) return ready();
  if (kind == kRefusalKind) {
    *refused = true;
    return ready();
  }
  const std::string theirs(frame + 5 + kNonceBytes, kNonceBytes);
  if (!Same(frame + 5 + 2 * kNonceBytes, WelcomeProof(message_key_, nonce_, theirs))) {
    *refused = true;
    return ready();
  }
  if (!ready()) key_ = ConnectionKey(message_key_, nonce_, theirs);
  return true;
}

std::string Outbound::Seal(const Sealed& m) {
  const uint64_t seq = ++seq_;
  const std::string mac = Mac(key_, seq, m);
  return Frame(kTagKind, {nonce_, Bytes(&seq, 8), mac});
}

std::string Inbound::Answer(const char* hello, size_t n, bool* refused) {
  *refused = false;
  if (FrameKind(hello, n) != kHelloKind) return "";
  const std::string theirs(hello + 5, kNonceBytes);
  if (!Same(hello + 5 + kNonceBytes, HelloProof(message_key_, theirs))) {
    *refused = true;
    return Frame(kRefusalKind, {theirs});
  }
  auto it = connections_.find(theirs);
  if (it == connections_.end()) {
    // Only holders of the secret make hellos, and a recorded one finds its connection; still,
    // the table is bounded: a connection that never sent a message goes first.
    if (connections_.size() >= kMaxConnections) {
      for (auto old = connections_.begin(); old != connections_.end(); ++old) {
        if (old->second.last_seq == 0) {
          connections_.erase(old);
          break;
        }
      }
      if (connections_.size() >= kMaxConnections) {
        *refused = true;
        return Frame(kRefusalKind, {theirs});
      }
    }
    Connection c;
    c.nonce = RandomBytes(kNonceBytes);
    c.key = ConnectionKey(message_key_, theirs, c.nonce);
    it = connections_.emplace(theirs, std::move(c)).first;
  }
  const std::string proof = WelcomeProof(message_key_, theirs, it->second.nonce);
  return Frame(kWelcomeKind, {theirs, it->second.nonce, proof});
}

std::string Inbound::Open(const char* tag, size_t n, const Sealed& m, std::string* connection) {
  if (FrameKind(tag, n) != kTagKind) return "a message without this job's authentication tag";
  connection->assign(tag + 5, kNonceBytes);
  auto it = connections_.find(*connection);
  if (it == connections_.end()) return "a message of a connection that never said a good hello";
  Connection& c = it->second;
  uint64_t seq;
  std::memcpy(&seq, tag + 5 + kNonceBytes, 8);
  if (!Same(tag + 5 + kNonceBytes + 8, Mac(c.key, seq, m))) return "a message whose tag does not match its content";
  if (seq <= c.last_seq)
    return "a replayed message (sequence number " + std::to_string(seq) + ", after " + std::to_string(c.last_seq) +
           " on its connection)";
  c.last_seq = seq;
  return "";
}

std::string Inbound::Speaks(const std::string& connection, int sender) {
  Connection& c = connections_.at(connection);
  if (sender < -1) return "a message from node " + std::to_string(sender);
  if (c.speaker == -2 && sender >= 0) c.speaker = sender;
  if (c.speaker == sender || (c.speaker == -2 && sender == -1)) return "";
  return "a message that claims to come from node " + std::to_string(sender) + " on the connection of node " +
         std::to_string(c.speaker);
}

}  // namespace auth
}  // namespace ps
