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

#endif  // CAPSTAN_CMD_SNAPSHOT_COMMAND_H_
