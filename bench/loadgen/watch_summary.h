// What the watch benchmarks read of a WatchResponse, decoded straight from
// the wire: the response's own fields and, per event, its type, the
// KeyValue's mod_revision and version and whether it carries a prev_kv.
//
// A benchmark with 1,000 watchers on a key receives millions of events a
// second; parsing each into an etcdserverpb::WatchResponse (a KeyValue and
// its key and value strings per event) cost the client more CPU than the
// server spent producing them, and on a machine the client shares with the
// server that capped the rate it could measure. Skipping what it never reads
// leaves that CPU to the server under test. Both servers send the same bytes;
// only the client's reading of them changes.

#ifndef CAPSTAN_BENCH_LOADGEN_WATCH_SUMMARY_H_
#define CAPSTAN_BENCH_LOADGEN_WATCH_SUMMARY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <grpcpp/impl/codegen/serialization_traits.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

namespace capstan::bench {

struct EventSummary {
  int type = 0;  // mvccpb::Event::EventType: 0 PUT, 1 DELETE
  int64_t mod_revision = 0;
  int64_t version = 0;
  bool has_prev_kv = false;
};

struct WatchResponseSummary {
  int64_t watch_id = 0;
  bool created = false;
  bool canceled = false;
  int64_t compact_revision = 0;
  std::string cancel_reason;
  std::vector<EventSummary> events;

  void Clear();
  // Decodes a serialized etcdserverpb.WatchResponse; false if the bytes are
  // not one. Fields it does not keep are skipped, not checked.
  bool Parse(const uint8_t* data, size_t size);
};

}  // namespace capstan::bench

namespace grpc {

// Lets a gRPC stream read WatchResponseSummary in place of a WatchResponse.
template <>
class SerializationTraits<capstan::bench::WatchResponseSummary> {
 public:
  // Never sent: only read.
  static Status Serialize(const capstan::bench::WatchResponseSummary&, ByteBuffer*, bool*) {
    return Status(StatusCode::UNIMPLEMENTED, "WatchResponseSummary is only decoded");
  }
  static Status Deserialize(ByteBuffer* buffer, capstan::bench::WatchResponseSummary* msg);
};

}  // namespace grpc

#endif  // CAPSTAN_BENCH_LOADGEN_WATCH_SUMMARY_H_
