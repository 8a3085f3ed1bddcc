// etcd's WAL as `capstan migrate` reads it (server/etcd_wal): any bytes, as
// the last file or an earlier one, decode to records or an error, never a
// crash; a record passed on carries data whose CRC chain was checked; every
// entry record is then decoded as the replay decodes it.

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "etcdserverpb/raft_internal.pb.h"
#include "raftpb/raft.pb.h"
#include "storage/etcdfmt/etcd_wal.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (bool last : {false, true}) {
    uint32_t crc = 0;
    bool torn = false;
    auto s = capstan::etcdfmt::DecodeEtcdWalFile(
        bytes, last, &crc, &torn, [](int64_t type, std::string_view record) {
          if (type == 4) std::abort();  // CRC records are consumed by the reader
          if (type == 2) {
            raftpb::Entry e;
            if (e.ParseFromArray(record.data(), static_cast<int>(record.size()))) {
              etcdserverpb::InternalRaftRequest r;
              (void)r.ParseFromString(e.data());
            }
          }
          return absl::OkStatus();
        });
    // Only the last file may end in a torn record.
    if (torn && !last) std::abort();
    if (!s.ok() && s.code() != absl::StatusCode::kDataLoss) std::abort();
  }
  return 0;
}
