// `capstan snapshot restore` and `capstan snapshot status`: offline commands
// over a snapshot file in etcd's format (what `etcdctl snapshot save` writes,
// from Capstan or from etcd; server/api/snapshot_stream.h writes Capstan's).
//
// `capstan snapshot restore` turns a snapshot into a Capstan data dir (as
// `capstan migrate` does); `capstan snapshot status` reports what `etcdctl
// snapshot status` reports.
//
// Thread safety: functions of their arguments only.

#ifndef CAPSTAN_CMD_SNAPSHOT_COMMAND_H_
#define CAPSTAN_CMD_SNAPSHOT_COMMAND_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace capstan::server {

// `capstan snapshot ARGS...`: returns the process's exit code.
int SnapshotCommand(const std::vector<std::string>& args);

// Who a restored member is, with etcd's `snapshot restore` flags and
// defaults: the new cluster's members (--initial-cluster, name=peerURL,...),
// its token, this member's name and peer URLs.
struct RestoreIdentity {
  std::string name = "default";
  std::string initial_cluster = "default=http://localhost:2380";
  std::string initial_cluster_token = "etcd-cluster";
  std::string initial_advertise_peer_urls = "http://localhost:2380";
};

// Creates data_dir (which must not exist) from a snapshot file, as a member
// of a new cluster (etcd's restore): the new members' IDs from the identity,
// the snapshot's member table replaced by --initial-cluster's members, so
// that every member of the new cluster restored from the same snapshot
// holds the same data, the same table and the same applied index.
absl::Status RestoreSnapshot(const std::string& file, const std::string& data_dir,
                             const RestoreIdentity& identity = {});

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

#endif  // CAPSTAN_CMD_SNAPSHOT_COMMAND_H_
