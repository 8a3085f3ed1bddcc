// What the benchmarks read of the responses they receive most of, decoded
// straight from the wire:
//
// - WatchResponseSummary: a WatchResponse's own fields and, per event, its
//   type, the KeyValue's mod_revision and version and whether it carries a
//   prev_kv; read whole by a small reader over contiguous bytes (a watch
//   response is small);
// - RangeResponseSummary: a RangeResponse's revision, more and count, how
//   many KeyValues it holds, the sum of their value sizes and the last key;
//   read slice by slice with protobuf's CodedInputStream (a full list is
//   hundreds of megabytes, never copied whole).
//
// A gRPC call reads a summary in place of the response through a generic
// stub (grpc::TemplatedGenericStub<Request, Summary>) and the
// SerializationTraits below, with the method names WatchMethod() and
// RangeMethod(). Summaries are plain values: one per call or stream, not
// shared between threads.
//
// A benchmark with 1,000 watchers on a key receives millions of events a
// second, and a full list of 100,000 pods hundreds of megabytes; parsing
// them into etcdserverpb messages (a KeyValue and its key and value strings
// each) cost the client more CPU than the server spent producing them, and
// on a machine the client shares with the server that capped what it could
// measure. Skipping what it never reads leaves that CPU to the server under
// test. Both servers send the same bytes; only the client's reading of them
// changes.

#ifndef CAPSTAN_BENCH_LOADGEN_RESPONSE_SUMMARY_H_
#define CAPSTAN_BENCH_LOADGEN_RESPONSE_SUMMARY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <google/protobuf/io/coded_stream.h>
#include <grpcpp/impl/codegen/serialization_traits.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/status.h>

namespace capstan::bench {

// The full gRPC method names, for generic stubs. They live as long as the
// process: gRPC keeps a pointer to a call's method name (its interceptors
// read it) after the stub call returns.
const std::string& WatchMethod();
const std::string& RangeMethod();

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

struct RangeResponseSummary {
  int64_t revision = 0;  // header.revision
  bool more = false;
  int64_t count = 0;
  uint64_t kvs = 0;          // KeyValues in the response
  uint64_t value_bytes = 0;  // the sum of their value sizes
  std::string last_key;      // the last KeyValue's key

  void Clear();
  // Decodes a serialized etcdserverpb.RangeResponse; false if the bytes are
  // not one. Fields it does not keep are skipped, not checked. The stream
  // must have a limit at the message's end (an array-backed one has).
  bool Parse(const uint8_t* data, size_t size);
  bool Parse(google::protobuf::io::CodedInputStream* in);
};

}  // namespace capstan::bench

namespace grpc {

namespace internal {
Status DeserializeSummary(ByteBuffer* buffer, capstan::bench::WatchResponseSummary* msg);
Status DeserializeSummary(ByteBuffer* buffer, capstan::bench::RangeResponseSummary* msg);

// Lets a gRPC call read a summary in place of the response it summarizes.
// Summaries are never sent.
template <typename Summary>
class SummaryTraits {
 public:
  static Status Serialize(const Summary&, ByteBuffer*, bool*) {
    return Status(StatusCode::UNIMPLEMENTED, "a response summary is only decoded");
  }
  static Status Deserialize(ByteBuffer* buffer, Summary* msg) {
    return DeserializeSummary(buffer, msg);
  }
};
}  // namespace internal

template <>
class SerializationTraits<capstan::bench::WatchResponseSummary>
    : public internal::SummaryTraits<capstan::bench::WatchResponseSummary> {};

template <>
class SerializationTraits<capstan::bench::RangeResponseSummary>
    : public internal::SummaryTraits<capstan::bench::RangeResponseSummary> {};

}  // namespace grpc

#endif  // CAPSTAN_BENCH_LOADGEN_RESPONSE_SUMMARY_H_
