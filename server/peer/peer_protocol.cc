#include "server/peer/peer_protocol.h"

#include "absl/strings/str_format.h"
#include "util/coding.h"

namespace capstan::server::peer {

std::string IdText(uint64_t id) { return absl::StrFormat("%x", id); }

std::optional<uint64_t> ParseIdText(std::string_view text) {
  if (text.empty() || text.size() > 16) return std::nullopt;
  uint64_t id = 0;
  for (char c : text) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return std::nullopt;
    }
    id = id << 4 | static_cast<uint64_t>(digit);
  }
  return id;
}

bool ReadMessageAddresses(std::string_view message, uint64_t* to, uint64_t* from) {
  *to = 0;
  *from = 0;
  const char* p = message.data();
  const char* end = p + message.size();
  // gogoproto writes raftpb.Message's fields in number order: type (1), to
  // (2), from (3), all varints. Any other order is read the same way until a
  // field after `from` or a non-varint field appears.
  while (p < end) {
    uint64_t tag = 0;
    if (!util::ReadVarint(&p, end, &tag)) return false;
    const uint64_t field = tag >> 3;
    if ((tag & 7) != 0 || field > 3) return true;
    uint64_t value = 0;
    if (!util::ReadVarint(&p, end, &value)) return false;
    if (field == 2) *to = value;
    if (field == 3) {
      *from = value;
      return true;
    }
  }
  return true;
}

}  // namespace capstan::server::peer
