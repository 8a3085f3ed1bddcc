#include "server/api/range_stream.h"

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "mvcc/errors.h"
#include "mvcc/kv_codec.h"
#include "mvcc/kv_range_stream.h"
#include "server/api/bulk_reads.h"
#include "server/api/cache_range.h"
#include "server/api/client_traffic.h"
#include "server/api/errors.h"
#include "server/api/grpc_buffers.h"
#include "util/coding.h"
#include "util/mutex.h"

namespace capstan::server {

namespace {

struct Counters {
  std::atomic<int64_t> active{0}, buffered_chunks{0}, buffered_bytes{0};
  std::atomic<uint64_t> started{0}, chunks{0};
};
Counters& counters() {
  static Counters c;
  return c;
}

class StringSink final : public mvcc::ByteSink {
 public:
  void Append(std::string_view bytes) override { bytes_.append(bytes); }
  std::string& bytes() { return bytes_; }

 private:
  std::string bytes_;
};

// One chunk, read: its kvs (in bulk blocks or a string) and the rest.
struct Chunk {
  std::unique_ptr<mvcc::ByteSink> kvs;
  size_t kvs_bytes = 0;
  mvcc::RangeStreamChunk meta;
};

// Where a stream's chunks come from: the watch cache when it can answer the
// whole request at its revision, else the store. Used by one task at a time.
class ChunkSource {
 public:
  ChunkSource(mvcc::KvStore* store, BulkReads* bulk, CacheRange* cache,
              etcdserverpb::RangeRequest req)
      : store_(store), bulk_(bulk), cache_(cache), req_(std::move(req)),
        limiter_(req_.limit(), store->options().max_request_bytes) {}

  absl::Status Next(Chunk* out) {
    if (first_) {
      first_ = false;
      if (cache_ != nullptr && cache_->TryRange(req_, &cached_)) {
        from_cache_ = true;
        pinned_ = req_.revision() > 0 ? req_.revision() : cached_.header_rev;
        return NextCached(out, cached_.header_rev);
      }
      reader_ = std::make_unique<mvcc::RangeStreamReader>(store_, req_);
    }
    if (from_cache_) {
      // As from the store: a compaction past the pinned revision ends it.
      auto view = store_->View();
      if (pinned_ < view->compact_rev) return mvcc::MakeError(mvcc::Error::kCompacted);
      return NextCached(out, view->rev);
    }
    out->kvs = NewSink();
    auto s = reader_->Next(out->kvs.get(), &out->meta);
    out->kvs_bytes = SinkSize(*out->kvs);
    return s;
  }

 private:
  std::unique_ptr<mvcc::ByteSink> NewSink() {
    if (bulk_ != nullptr) return bulk_->NewSink();
    return std::make_unique<StringSink>();
  }
  size_t SinkSize(mvcc::ByteSink& sink) const {
    if (bulk_ != nullptr) return static_cast<BulkReads::BlockSink&>(sink).size();
    return static_cast<StringSink&>(sink).bytes().size();
  }

  // The next chunk of the cache's answer, cut as the store's reader cuts
  // it (store_rev: the store's revision now, which etcd's sizing counts).
  absl::Status NextCached(Chunk* out, int64_t store_rev) {
    out->kvs = NewSink();
    if (req_.count_only()) {
      out->meta.last = true;
      out->meta.header_rev = cached_.header_rev;
      out->meta.count = cached_.count;
      return absl::OkStatus();
    }
    // The keys left in the range at the pinned revision, of which the
    // store's reader would fetch limit + 1.
    const int64_t left = cached_.count - static_cast<int64_t>(pos_);
    const int64_t limit = limiter_.limit();
    const int64_t fetched = limit > 0 ? std::min(limit + 1, left) : left;
    const bool more = limit > 0 && fetched > limit;
    const size_t n = static_cast<size_t>(more ? limit : fetched);
    std::string field;
    size_t bytes = 0;
    for (size_t i = pos_; i < pos_ + n; ++i) {
      field.clear();
      mvcc::AppendRecordField(2, cached_.objects[i]->kv(), req_.keys_only(), &field);
      bytes += field.size();
      out->kvs->Append(field);
    }
    // The refs sent are dropped as the stream goes.
    for (size_t i = pos_; i < pos_ + n; ++i) cached_.objects[i] = watchcache::ObjectRef();
    pos_ += n;
    out->kvs_bytes = bytes;
    out->meta.num_kvs = static_cast<int64_t>(n);
    const size_t size = mvcc::EtcdChunkSize(store_rev, bytes, more, fetched);
    if (!limiter_.Advance(size, static_cast<int64_t>(n), more)) return absl::OkStatus();
    out->meta.last = true;
    out->meta.header_rev = cached_.header_rev;
    out->meta.more = more;
    out->meta.count = more ? cached_.count : limiter_.sent();
    return absl::OkStatus();
  }

  mvcc::KvStore* const store_;
  BulkReads* const bulk_;
  CacheRange* const cache_;
  const etcdserverpb::RangeRequest req_;
  bool first_ = true;
  bool from_cache_ = false;
  std::unique_ptr<mvcc::RangeStreamReader> reader_;
  CachedRange cached_;
  mvcc::RangeChunkLimiter limiter_;  // the cache's chunks
  size_t pos_ = 0;                   // objects sent from cached_
  int64_t pinned_ = 0;
};

// Streams the chunks, one write in flight and at most kQueuedChunks read
// ahead. A chunk is read by a task on the bulk threads; the next task is
// queued when the chunk is in and there is room, or when a write makes room.
// producing_ (a task queued or running) keeps the reactor alive: OnDone
// deletes it only when no task is, else the task does when it ends.
class RangeStreamReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  RangeStreamReactor(mvcc::KvStore* store, const membership::MemberInfo* member, BulkReads* bulk,
                     CacheRange* cache, etcdserverpb::RangeRequest req)
      : member_(member), bulk_(bulk), source_(store, bulk, cache, req) {
    counters().active.fetch_add(1);
    counters().started.fetch_add(1);
    {
      util::MutexLock l(&mu_);
      producing_ = true;
    }
    // The first chunk holds at most 10 keys (or only a count): read here,
    // as a small Range is, so that it does not wait behind the bulk queue.
    // A negative limit makes it the whole range: that one goes to the bulk
    // threads.
    if (req.limit() >= 0) {
      Produce();
    } else {
      Schedule();
    }
  }

  ~RangeStreamReactor() override { counters().active.fetch_sub(1); }

  void OnWriteDone(bool ok) override {
    mu_.Lock();
    in_flight_ = false;
    Unbuffer(in_flight_bytes_);
    written_.Clear();
    if (!ok) {
      StopLocked();
      FinishOnceAndUnlock(grpc::Status(grpc::UNAVAILABLE, "range stream broken"));
      return;
    }
    SendNextThenProduceAndUnlock();
  }

  void OnCancel() override {
    mu_.Lock();
    StopLocked();
    // With a write in flight, its OnWriteDone finishes (with ok or not).
    if (in_flight_) {
      mu_.Unlock();
      return;
    }
    FinishOnceAndUnlock(grpc::Status(grpc::CANCELLED, "context canceled"));
  }

  void OnDone() override {
    mu_.Lock();
    StopLocked();
    done_ = true;
    const bool owned_by_task = producing_;
    mu_.Unlock();
    if (!owned_by_task) delete this;
  }

 private:
  struct Encoded {
    grpc::ByteBuffer buffer;
    size_t bytes = 0;
  };

  void Schedule() {
    if (bulk_ != nullptr) {
      bulk_->Run([this] { Produce(); });
    } else {
      Produce();
    }
  }

  // A task: reads one chunk and queues it.
  void Produce() {
    mu_.Lock();
    if (stop_) {
      producing_ = false;
      const bool del = done_;
      mu_.Unlock();
      if (del) delete this;
      return;
    }
    mu_.Unlock();
    Chunk chunk;
    absl::Status s = source_.Next(&chunk);
    Encoded e;
    if (s.ok()) e = Encode(std::move(chunk));
    mu_.Lock();
    producing_ = false;
    if (done_) {
      mu_.Unlock();
      delete this;
      return;
    }
    if (!stop_) {
      if (!s.ok()) {
        error_ = s;
        produced_all_ = true;
      } else {
        counters().chunks.fetch_add(1);
        counters().buffered_chunks.fetch_add(1);
        counters().buffered_bytes.fetch_add(static_cast<int64_t>(e.bytes));
        produced_all_ = chunk.meta.last;
        queue_.push_back(std::move(e));
      }
    }
    SendNextThenProduceAndUnlock();
  }

  // RangeStreamResponse{range_response (1): RangeResponse{header (1) and
  // more (3), count (4) on the last chunk, kvs (2)}}, its kvs not copied.
  Encoded Encode(Chunk chunk) {
    std::string header_field, tail;
    if (chunk.meta.last) {
      etcdserverpb::ResponseHeader header;
      membership::FillHeader(*member_, &header);
      header.set_revision(chunk.meta.header_rev);
      util::AppendBytesField(1, header.SerializeAsString(), &header_field);
      if (chunk.meta.more) util::AppendVarintField(3, 1, &tail);
      util::AppendVarintField(4, static_cast<uint64_t>(chunk.meta.count), &tail);
    }
    const size_t inner = header_field.size() + chunk.kvs_bytes + tail.size();
    std::string head;
    util::AppendTag(1, 2, &head);
    util::AppendVarint(inner, &head);
    head += header_field;
    Encoded e;
    e.bytes = head.size() + inner - header_field.size();
    if (bulk_ != nullptr) {
      std::vector<std::unique_ptr<mvcc::ByteSink>> kvs;
      kvs.push_back(std::move(chunk.kvs));
      bulk_->Hold(std::move(head), std::move(kvs), std::move(tail), &e.buffer);
    } else {
      std::vector<std::string> parts;
      parts.push_back(std::move(head));
      parts.push_back(std::move(static_cast<StringSink&>(*chunk.kvs).bytes()));
      parts.push_back(std::move(tail));
      PartsToBuffer(std::move(parts), &e.buffer);
    }
    return e;
  }

  // Whether to queue the next read: none running, more to read, room.
  bool StartProducingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (producing_ || produced_all_ || stop_ || queue_.size() >= kQueuedChunks) return false;
    producing_ = true;
    return true;
  }

  void Unbuffer(size_t bytes) {
    counters().buffered_chunks.fetch_sub(1);
    counters().buffered_bytes.fetch_sub(static_cast<int64_t>(bytes));
  }

  // The call is over for the reads: queued chunks are dropped now.
  void StopLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    stop_ = true;
    for (auto& e : queue_) Unbuffer(e.bytes);
    queue_.clear();
  }

  // Starts the next write, or finishes the call when every chunk is
  // written (or reading failed), if no write is in flight; then queues the
  // next read if there is room. The room is judged after the write took its
  // chunk from the queue: judged before, a write completing on a full queue
  // left one chunk queued and no read coming until the next write completed,
  // which for a client that stopped reading is when it reads again. Releases
  // mu_ before calling into gRPC. REQUIRES: mu_ held.
  void SendNextThenProduceAndUnlock() ABSL_UNLOCK_FUNCTION(mu_) {
    enum class Step { kNone, kWrite, kFinish } step = Step::kNone;
    grpc::Status status;
    if (in_flight_ || finished_) {
      // Nothing to send now.
    } else if (stop_) {
      // Stopped with no write in flight: a cancellation that raced a write
      // completing with ok lands here, and the call must still finish.
      step = Step::kFinish;
      status = grpc::Status(grpc::CANCELLED, "context canceled");
    } else if (!queue_.empty()) {
      written_ = std::move(queue_.front().buffer);
      in_flight_bytes_ = queue_.front().bytes;
      queue_.pop_front();
      in_flight_ = true;
      step = Step::kWrite;
    } else if (produced_all_) {
      step = Step::kFinish;
      status = error_.ok() ? grpc::Status::OK : ToGrpcStatus(error_);
    }
    if (step == Step::kFinish) finished_ = true;
    const bool schedule = StartProducingLocked();
    mu_.Unlock();
    if (step == Step::kWrite) {
      // written_ is not touched again until OnWriteDone.
      ClientTraffic::Sent(written_.Length());
      StartWrite(&written_);
    } else if (step == Step::kFinish) {
      Finish(status);
    }
    if (schedule) Schedule();
  }

  void FinishOnceAndUnlock(const grpc::Status& status) ABSL_UNLOCK_FUNCTION(mu_) {
    if (finished_) {
      mu_.Unlock();
      return;
    }
    finished_ = true;
    mu_.Unlock();
    Finish(status);
  }

  const membership::MemberInfo* const member_;
  BulkReads* const bulk_;
  // Used by the one task running (producing_), never under mu_.
  ChunkSource source_;

  // A leaf; released before every call into gRPC and before reading.
  util::Mutex mu_;
  std::deque<Encoded> queue_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer written_;  // the write in flight (gRPC reads it meanwhile)
  size_t in_flight_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool producing_ ABSL_GUARDED_BY(mu_) = false;
  bool produced_all_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

RangeStreamStats GetRangeStreamStats() {
  RangeStreamStats s;
  s.active = counters().active.load();
  s.buffered_chunks = counters().buffered_chunks.load();
  s.buffered_bytes = counters().buffered_bytes.load();
  s.started = counters().started.load();
  s.chunks = counters().chunks.load();
  return s;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewRangeStreamReactor(
    mvcc::KvStore* store, const membership::MemberInfo* member, BulkReads* bulk,
    CacheRange* cache, etcdserverpb::RangeRequest req) {
  return new RangeStreamReactor(store, member, bulk, cache, std::move(req));
}

}  // namespace capstan::server
