// Snapshots: a consistent point-in-time copy of a Capstan data directory,
// streamed by Maintenance.Snapshot (so `etcdctl snapshot save` works) and
// turned back into a data directory by `capstan snapshot restore`.
//
// Format: the line "capstan-snapshot 1\n"; then per file of a RocksDB
// checkpoint its name, a NUL, its size as 8 big-endian bytes and its bytes;
// then a lone NUL and zero padding to a multiple of 512 bytes; then the SHA-256 of everything before it (32 bytes, as
// etcd's snapshots end, which etcdctl checks).

#ifndef CAPSTAN_SERVER_SNAPSHOT_H_
#define CAPSTAN_SERVER_SNAPSHOT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "mvcc/kv_store.h"

namespace capstan::server {

// A reactor that checkpoints store and streams the snapshot in 32 KiB
// chunks, one write in flight. Deletes itself when done.
grpc::ServerWriteReactor<etcdserverpb::SnapshotResponse>* NewSnapshotReactor(
    mvcc::KvStore* store);

// Writes a snapshot of store to the file at path (for tools and tests).
absl::Status SaveSnapshot(mvcc::KvStore* store, const std::string& path);

// Creates data_dir (which must not exist) from a snapshot file. The restored
// member gets new cluster and member ids, as etcd's restore does.
absl::Status RestoreSnapshot(const std::string& file, const std::string& data_dir);

struct SnapshotStatus {
  uint32_t hash = 0;  // Maintenance.Hash of the restored data
  int64_t revision = 0;
  int64_t total_keys = 0;
  int64_t total_size = 0;  // bytes of the snapshot file
};
absl::StatusOr<SnapshotStatus> ReadSnapshotStatus(const std::string& file);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_SNAPSHOT_H_
