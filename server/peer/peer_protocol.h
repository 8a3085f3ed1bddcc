// The conventions of the capstan.v1.Peer service (proto/capstan/v1/peer.proto)
// that both ends share: the identity metadata, rafthttp's refusal texts, and
// reading a marshaled raftpb.Message's addresses without decoding it.
//
// Thread safety: pure functions and constants.

#ifndef CAPSTAN_SERVER_PEER_PEER_PROTOCOL_H_
#define CAPSTAN_SERVER_PEER_PEER_PROTOCOL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace capstan::server::peer {

// gRPC metadata keys, rafthttp's header names in lower case.
inline constexpr char kClusterIdKey[] = "x-etcd-cluster-id";
inline constexpr char kFromKey[] = "x-server-from";
inline constexpr char kToKey[] = "x-raft-to";

// rafthttp's texts (server/etcdserver/api/rafthttp/http.go, util.go).
inline constexpr char kClusterIdMismatch[] = "cluster ID mismatch";
inline constexpr char kMemberRemoved[] = "the member has been permanently removed from the cluster";
inline constexpr char kToFieldMismatch[] = "to field mismatch";
inline constexpr char kInvalidFrom[] = "invalid from";

// An ID as etcd prints it (types.ID.String: lower-case hex, no padding).
std::string IdText(uint64_t id);
// etcd's types.IDFromString: hex, at most 64 bits; nullopt otherwise.
std::optional<uint64_t> ParseIdText(std::string_view text);

// The `to` and `from` of a marshaled raftpb.Message (fields 2 and 3), read
// from the wire without decoding the rest. False when the bytes are not a
// message the scan can read up to both fields; a field that is absent reads
// as 0.
bool ReadMessageAddresses(std::string_view message, uint64_t* to, uint64_t* from);

}  // namespace capstan::server::peer

#endif  // CAPSTAN_SERVER_PEER_PEER_PROTOCOL_H_
