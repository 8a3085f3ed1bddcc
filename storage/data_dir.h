// The layout of a Capstan data directory and the checks made before using one.
//
//   <data-dir>/capstan.version   format marker, "capstan-data 1"
//   <data-dir>/db/               RocksDB files (storage::Backend): the data
//   <data-dir>/raft/             RocksDB files of the member's Raft log (a
//                                second storage::Backend, replication/raft_log.h),
//                                apart so the data's checkpoints and snapshots
//                                never hold the log

#ifndef CAPSTAN_STORAGE_DATA_DIR_H_
#define CAPSTAN_STORAGE_DATA_DIR_H_

#include <string>

#include "absl/status/status.h"

namespace capstan::storage {

// Creates dir as a new Capstan data directory, or checks that an existing one
// is Capstan's. Refuses an etcd (bbolt/WAL) data directory and any other
// non-empty directory with a message saying what was found.
absl::Status PrepareDataDir(const std::string& dir);

// Where the backend lives inside a data directory.
std::string BackendDir(const std::string& dir);

// Where the Raft log's backend lives inside a data directory.
std::string RaftLogDir(const std::string& dir);

}  // namespace capstan::storage

#endif  // CAPSTAN_STORAGE_DATA_DIR_H_
