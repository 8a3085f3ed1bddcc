// The two ends of capstan.v1.Peer/Snapshot (proto/capstan/v1/peer.proto):
// streaming the files of a checkpoint directory in CRC-32C-checked chunks,
// rate-limited, and writing them back into a directory, verified.
//
// Thread safety: functions over their arguments only.

#ifndef CAPSTAN_SERVER_PEER_PEER_SNAPSHOT_H_
#define CAPSTAN_SERVER_PEER_PEER_SNAPSHOT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "capstan/v1/peer.pb.h"

namespace capstan::server::peer {

inline constexpr size_t kSnapshotChunkBytes = 1 << 20;

// Calls write with every chunk of every regular file of dir (each file from
// offset 0, chunks of at most kSnapshotChunkBytes), then with the last
// message carrying message and the file sizes. Paces the data at
// rate_bytes_per_sec (0: unlimited). Stops with Unavailable when write
// returns false (the stream broke). Reads one chunk at a time.
absl::Status StreamSnapshotFiles(const std::string& dir, const std::string& message,
                                 int64_t rate_bytes_per_sec,
                                 const std::function<bool(const capstan::v1::SnapshotChunk&)>& write);

// Receives a snapshot into dir, which is cleared first: read yields each
// chunk in turn (false: the stream ended). Checks every chunk (a plain
// file name, the offset where the file ends, the CRC-32C) and, at the last
// message, that exactly the listed files exist with their sizes. On success
// *message is the MsgSnap. InvalidArgument "snapshot chunk ..." for a bad
// chunk, Aborted when the stream ended before its last message.
absl::Status ReceiveSnapshotFiles(const std::string& dir,
                                  const std::function<bool(capstan::v1::SnapshotChunk*)>& read,
                                  std::string* message);

}  // namespace capstan::server::peer

#endif  // CAPSTAN_SERVER_PEER_PEER_SNAPSHOT_H_
