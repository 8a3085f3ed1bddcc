// Snapshots: a consistent point-in-time copy of the store in etcd's format,
// streamed by Maintenance.Snapshot, so `etcdctl snapshot save` saves what
// etcd would save and `etcdctl snapshot status` and `etcdctl snapshot
// restore` read it (the latter into a data dir for etcd itself).
//
// Format: a bbolt file (storage/etcdfmt/bbolt_writer.h) with etcd's buckets, made
// from a RocksDB checkpoint of the store (the column families are etcd's
// buckets, docs/MIGRATION.md) in two passes, the first laying it out so
// that the second can stream it, then the SHA-256 of it (32 bytes), as
// etcd's snapshots end and etcdctl checks. The members bucket holds this
// member.
//
// `capstan snapshot restore` and `capstan snapshot status` read such files
// (cmd/snapshot_command.h).

#ifndef CAPSTAN_SERVER_API_SNAPSHOT_STREAM_H_
#define CAPSTAN_SERVER_API_SNAPSHOT_STREAM_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "membership/member.h"
#include "mvcc/kv_store.h"

namespace capstan::server {

// A reactor that streams the snapshot of store in 32 KiB chunks, one write
// in flight, made on a thread of its own from a checkpoint taken when it is
// created (hard links, and the memtables flushed); nothing else is written
// to disk. Deletes itself when done.
grpc::ServerWriteReactor<etcdserverpb::SnapshotResponse>* NewSnapshotReactor(
    mvcc::KvStore* store, const membership::MemberInfo& member);

// Removes the temporary files of snapshots that a stopped server left beside
// its backend directory. Call before serving.
void RemoveSnapshotLeftovers(const std::string& backend_dir);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_SNAPSHOT_STREAM_H_
