// Reads an etcd member's write-ahead log (its data dir's member/wal), as etcd
// reads it when it starts: `capstan migrate` replays from it what the member
// logged (and may have acknowledged) but had not yet written to its bbolt
// backend when it stopped. etcd commits its backend every 100 ms, so after a
// crash, a SIGKILL or an OOM kill the newest writes are in the WAL only.
//
// The format (etcd's wal package): files named <seq>-<index>.wal, 16 hex
// digits each, read in name order. Each holds framed walpb.Records: an
// 8-byte little-endian length word (the record's size in the low 56 bits;
// when the top bit is set, bits 56-58 count the padding bytes that follow
// the record up to an 8-byte boundary), then the record. Every record but
// the CRC ones carries the CRC-32C of all record data so far; each file
// starts with a CRC record carrying the previous file's running CRC. A zero
// length word ends a file (the rest is preallocated space).
//
// The log is rebuilt as etcd's raft rebuilds it: an entry replaces every
// entry at its index or after (a new leader overwrote an uncommitted tail).
// The last file's last record may be torn by a crash (a sector of it never
// written): etcd drops it (it was never synced, so never acknowledged), and
// so does this reader. A bad record anywhere else is an error.
//
// Thread safety: a plain function; the result is a value.

#ifndef CAPSTAN_STORAGE_ETCDFMT_ETCD_WAL_H_
#define CAPSTAN_STORAGE_ETCDFMT_ETCD_WAL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "raftpb/raft.pb.h"

namespace capstan::etcdfmt {

struct EtcdWal {
  // The files read, in order.
  std::vector<std::string> files;
  // The log entries with an index above the `after_index` asked for, in
  // index order, consecutive.
  std::vector<raftpb::Entry> entries;
  // The index of the log's last entry (kept or not; 0: none).
  uint64_t last_index = 0;
  // The last hard state logged (term, vote, commit index).
  raftpb::HardState state;
  // The metadata record (an etcdserverpb.Metadata: the member and cluster
  // ids); empty if there was none.
  std::string metadata;
  // The last file ended with a record that was never completely written,
  // which was left out.
  bool torn_tail = false;
};

// Reads every WAL file in wal_dir, keeping the entries above after_index.
// A directory without WAL files gives an empty log; NotFound when wal_dir
// cannot be listed.
absl::StatusOr<EtcdWal> ReadEtcdWal(const std::string& wal_dir, uint64_t after_index);

// One WAL file's contents (exposed for tests): decodes the records of data,
// the file's bytes, continuing the running CRC *crc; `last` says whether a
// torn record at the end may be dropped. Calls on_record(type, data) for
// each record other than CRC records.
absl::Status DecodeEtcdWalFile(std::string_view data, bool last, uint32_t* crc, bool* torn,
                               const std::function<absl::Status(int64_t, std::string_view)>& on_record);

// Frames one record as etcd's encoder does (for tests that write WALs):
// appends it to *out and advances *crc.
void AppendEtcdWalRecord(int64_t type, std::string_view data, uint32_t* crc, std::string* out);

}  // namespace capstan::etcdfmt

#endif  // CAPSTAN_STORAGE_ETCDFMT_ETCD_WAL_H_
