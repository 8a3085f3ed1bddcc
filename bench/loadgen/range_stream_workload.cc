// range-stream: loads N keys of a fixed value size under a prefix, then
// lists the prefix three ways, in turn, --lists times: by KV.RangeStream
// (etcd 3.7; time to the first chunk and to the end), by one full Range,
// and paginated as kube-apiserver pages (limit --page-limit, continuing from
// the last key + "\0" at the first page's revision). Each kind reports the
// server's RSS growth over its lists (peak during the list minus RSS before
// it, the largest of its lists), after one unmeasured list that fills the
// server's caches. A server without RangeStream (etcd before
// 3.7 answers Unimplemented) skips the stream phases.
//
// Responses are read as summaries (response_summary.h): counted on the
// wire, not decoded, so the client's CPU stays with the server.

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/list_util.h"
#include "bench/loadgen/load_driver.h"
#include "bench/loadgen/proc_stats.h"
#include "bench/loadgen/response_summary.h"
#include "bench/loadgen/workload.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace capstan::bench {

// One RangeStream chunk, summarized: the RangeResponse in field 1.
struct RangeStreamChunkSummary {
  RangeResponseSummary range;
};

}  // namespace capstan::bench

namespace grpc {
template <>
class SerializationTraits<capstan::bench::RangeStreamChunkSummary> {
 public:
  static Status Serialize(const capstan::bench::RangeStreamChunkSummary&, ByteBuffer*, bool*) {
    return Status(StatusCode::UNIMPLEMENTED, "a response summary is only decoded");
  }
  static Status Deserialize(ByteBuffer* buffer, capstan::bench::RangeStreamChunkSummary* msg) {
    std::vector<Slice> slices;
    Status s = buffer->Dump(&slices);
    buffer->Clear();
    if (!s.ok()) return s;
    std::string bytes;
    for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                              static_cast<int>(bytes.size()));
    in.SetTotalBytesLimit(INT32_MAX);
    msg->range.Clear();
    for (;;) {
      const uint32_t tag = in.ReadTag();
      if (tag == 0) return Status::OK;
      if (tag != ((1 << 3) | 2)) {
        if (!google::protobuf::internal::WireFormatLite::SkipField(&in, tag)) break;
        continue;
      }
      uint32_t len = 0;
      if (!in.ReadVarint32(&len)) break;
      const int pos = in.CurrentPosition();
      if (!msg->range.Parse(reinterpret_cast<const uint8_t*>(bytes.data()) + pos, len)) break;
      if (!in.Skip(static_cast<int>(len))) break;
    }
    return Status(StatusCode::INTERNAL, "bad RangeStreamResponse");
  }
};
}  // namespace grpc

namespace capstan::bench {

namespace {

uint64_t SinceNs(std::chrono::steady_clock::time_point start) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - start)
                                   .count());
}

// The server's peak RSS during fn minus its RSS before; 0 with no pid.
template <typename Fn>
double RssGrowthMiB(pid_t pid, Fn fn) {
  ProcSample before;
  if (pid == 0 || !ReadProcSample(pid, &before)) {
    fn();
    return 0;
  }
  ProcessSampler sampler(pid, std::chrono::milliseconds(10));
  fn();
  sampler.Stop();
  const uint64_t peak = std::max(sampler.PeakRss(), before.rss_bytes);
  return (peak - before.rss_bytes) / 1048576.0;
}

struct StreamList {
  grpc::Status status;
  uint64_t objects = 0;
  uint64_t chunks = 0;
  uint64_t first_chunk_ns = 0;
};

StreamList ListByStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& prefix) {
  static const grpc::internal::RpcMethod method("/etcdserverpb.KV/RangeStream",
                                                grpc::internal::RpcMethod::SERVER_STREAMING);
  etcdserverpb::RangeRequest req;
  req.set_key(prefix);
  std::string end = prefix;
  end.back() = static_cast<char>(end.back() + 1);
  req.set_range_end(end);
  grpc::ClientContext ctx;
  StreamList out;
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<grpc::ClientReader<RangeStreamChunkSummary>> reader(
      grpc::internal::ClientReaderFactory<RangeStreamChunkSummary>::Create(channel.get(), method,
                                                                           &ctx, req));
  RangeStreamChunkSummary chunk;
  while (reader->Read(&chunk)) {
    if (out.chunks++ == 0) out.first_chunk_ns = SinceNs(start);
    out.objects += chunk.range.kvs;
  }
  out.status = reader->Finish();
  return out;
}

class RangeStreamWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.Int64("objects", &objects_, "Keys to load under the prefix");
    f.Int("value-size", &value_size_, "Bytes of each value");
    f.String("prefix", &prefix_, "Key prefix");
    f.Int64("page-limit", &page_limit_, "Page size of paginated lists");
    f.Int("lists", &lists_, "Lists of each kind, taken in turn");
  }
  absl::Status Prepare(const std::vector<std::string>&) override {
    if (objects_ < 1 || value_size_ < 0 || lists_ < 1 || page_limit_ < 1 || prefix_.empty()) {
      return absl::InvalidArgumentError("range-stream: bad sizes or counts");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    RunReport r;
    r.workload = "range-stream";
    r.target = ctx.target;
    LoopOptions load{"load", static_cast<uint64_t>(objects_), absl::ZeroDuration(),
                     ctx.global->clients, 0};
    IssueFn load_issue = [&](uint64_t seq, size_t client, DoneFn done) {
      etcdserverpb::PutRequest req;
      req.set_key(absl::StrFormat("%s%08d", prefix_, seq));
      std::string v(static_cast<size_t>(value_size_), 'v');
      if (!v.empty()) v[0] = static_cast<char>('a' + seq % 26);
      req.set_value(std::move(v));
      AsyncPut(ctx.pool->Kv(client), std::move(req),
               [done = std::move(done)](const grpc::Status& s, auto&) { done(s); });
    };
    r.phases.push_back(RunClosedLoop(load, load_issue));

    PhaseResult stream, first, full, paged;
    stream.name = "range stream (whole)";
    first.name = "range stream (first chunk)";
    full.name = "full list (one Range)";
    paged.name = absl::StrCat("paginated list (limit ", page_limit_, ")");
    for (auto* p : {&first}) p->has_throughput = false;
    double rss_stream = 0, rss_full = 0, rss_paged = 0;
    uint64_t chunks = 0;
    bool stream_supported = true;
    auto count_error = [](PhaseResult& p, const std::string& what) {
      ++p.errors;
      ++p.error_counts[what];
    };
    auto check = [&](PhaseResult& p, const grpc::Status& s, uint64_t objects) {
      if (!s.ok()) {
        count_error(p, s.error_message());
        return false;
      }
      if (static_cast<int64_t>(objects) != objects_) {
        count_error(p, absl::StrCat("listed ", objects, " objects, want ", objects_));
        return false;
      }
      return true;
    };
    // One unmeasured paginated list first: the block cache (Capstan) or
    // the mapped file (etcd) fills once, and is not a list's own memory.
    CountPrefix(ctx.pool->Channel(0), prefix_, page_limit_, nullptr);
    const auto start = std::chrono::steady_clock::now();
    double stream_s = 0, full_s = 0, paged_s = 0;
    for (int i = 0; i < lists_; ++i) {
      auto channel = ctx.pool->Channel(i);
      if (stream_supported) {
        StreamList sl;
        const auto t = std::chrono::steady_clock::now();
        rss_stream = std::max(rss_stream, RssGrowthMiB(ctx.server_pid, [&] {
                                sl = ListByStream(channel, prefix_);
                              }));
        const uint64_t ns = SinceNs(t);
        stream_s += ns / 1e9;
        if (sl.status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
          stream_supported = false;
        } else if (check(stream, sl.status, sl.objects)) {
          stream.latency.Record(ns);
          first.latency.Record(sl.first_chunk_ns);
          chunks = sl.chunks;
        }
      }
      {
        ListResult lr;
        const auto t = std::chrono::steady_clock::now();
        rss_full = std::max(rss_full, RssGrowthMiB(ctx.server_pid, [&] {
                              lr = CountPrefix(channel, prefix_, 0, nullptr);
                            }));
        const uint64_t ns = SinceNs(t);
        full_s += ns / 1e9;
        if (check(full, lr.status, lr.objects)) full.latency.Record(ns);
      }
      {
        ListResult lr;
        const auto t = std::chrono::steady_clock::now();
        rss_paged = std::max(rss_paged, RssGrowthMiB(ctx.server_pid, [&] {
                               lr = CountPrefix(channel, prefix_, page_limit_, nullptr);
                             }));
        const uint64_t ns = SinceNs(t);
        paged_s += ns / 1e9;
        if (check(paged, lr.status, lr.objects)) paged.latency.Record(ns);
      }
    }
    (void)start;
    stream.seconds = first.seconds = stream_s;
    full.seconds = full_s;
    paged.seconds = paged_s;
    if (stream_supported) {
      r.phases.push_back(std::move(stream));
      r.phases.push_back(std::move(first));
      r.extras.push_back({"server RSS growth, range stream", rss_stream, "MiB", false});
      r.extras.push_back({"range stream chunks", static_cast<double>(chunks), "", false});
    }
    r.phases.push_back(std::move(full));
    r.phases.push_back(std::move(paged));
    r.extras.push_back({"server RSS growth, full list", rss_full, "MiB", false});
    r.extras.push_back({"server RSS growth, paginated list", rss_paged, "MiB", false});
    r.extras.push_back(
        {"stored MiB", static_cast<double>(objects_) * value_size_ / 1048576.0, "MiB", false});
    return r;
  }

 private:
  int64_t objects_ = 100000;
  int value_size_ = 4096;
  std::string prefix_ = "/registry/stream/";
  int64_t page_limit_ = 500;
  int lists_ = 5;
};

}  // namespace

std::unique_ptr<Workload> NewRangeStreamWorkload() { return std::make_unique<RangeStreamWorkload>(); }

}  // namespace capstan::bench
