// Snapshots: a consistent point-in-time copy of the store in etcd's format,
// streamed by Maintenance.Snapshot, so `etcdctl snapshot save` saves what
// etcd would save and `etcdctl snapshot status` and `etcdctl snapshot
// restore` read it (the latter into a data dir for etcd itself).
//
// Format: a bbolt file (storage/bbolt_writer.h) with etcd's buckets, made
// from a RocksDB checkpoint of the store (the column families are etcd's
// buckets, docs/MIGRATION.md) in two passes, the first laying it out so
// that the second can stream it, then the SHA-256 of it (32 bytes), as
// etcd's snapshots end and etcdctl checks. The members bucket holds this
// member.
//
// `capstan snapshot restore` turns a snapshot, from Capstan or from etcd,
// into a Capstan data dir (as `capstan migrate` does); `capstan snapshot
// status` reports what `etcdctl snapshot status` reports.

#ifndef CAPSTAN_SERVER_SNAPSHOT_H_
#define CAPSTAN_SERVER_SNAPSHOT_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "mvcc/kv_store.h"
#include "server/member.h"

namespace capstan::server {

// A reactor that streams the snapshot of store in 32 KiB chunks, one write
// in flight, made on a thread of its own from a checkpoint taken when it is
// created (hard links, and the memtables flushed); nothing else is written
// to disk. Deletes itself when done.
grpc::ServerWriteReactor<etcdserverpb::SnapshotResponse>* NewSnapshotReactor(
    mvcc::KvStore* store, const MemberInfo& member);

// Removes the temporary files of snapshots that a stopped server left beside
// its backend directory. Call before serving.
void RemoveSnapshotLeftovers(const std::string& backend_dir);

// Creates data_dir (which must not exist) from a snapshot file. The restored
// member gets new cluster and member ids, as etcd's restore does.
absl::Status RestoreSnapshot(const std::string& file, const std::string& data_dir);

// What `etcdctl snapshot status` reports: the CRC-32C of every bucket's name
// and records, the revision of the last key record, the records of all
// buckets and the bbolt file's size (without the checksum).
struct SnapshotStatus {
  uint32_t hash = 0;
  int64_t revision = 0;
  int64_t total_keys = 0;
  int64_t total_size = 0;
};
absl::StatusOr<SnapshotStatus> ReadSnapshotStatus(const std::string& file);

// The status as `etcdctl snapshot status -w format` prints it: "simple"
// (etcdctl's default), "table" or "json". InvalidArgument for another.
absl::StatusOr<std::string> FormatSnapshotStatus(const SnapshotStatus& status,
                                                 std::string_view format);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_SNAPSHOT_H_
