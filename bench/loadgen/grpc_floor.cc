// capstan-grpc-floor: the least an etcd v3 server built on gRPC C++ can do
// per request, to tell how much of a benchmark's time is gRPC's and the
// kernel's rather than the server's own.
//
// It serves KV.Put, KV.Txn (of puts), KV.Range, Lease.LeaseGrant and
// Lease.LeaseKeepAlive, and on the callback API Watch (watchers of exact keys,
// each event written to its streams before the put is answered, as Capstan's
// committer starts them), with Capstan's channel settings, on one of gRPC C++'s
// two server models (--model): the callback API that Capstan's services use
// (gRPC's own threads run each call's reactions), or the asynchronous
// completion-queue API, with one queue per core and one thread polling each
// (--queues), every step of a call run by the thread that took it from its
// queue. It does nothing else: a put encodes its KeyValue once into an
// ordered map in memory (nothing is written to disk, nothing is versioned),
// a range answers with those encodings as they are, sharing their bytes
// (no copy, no encoding per response), a lease is a number, and every
// answer is written from the thread that received the
// request (unless --answer-thread: then puts are answered by one other
// thread, in batches, as Capstan's committer hands its groups to be
// answered; in either model). --durable adds what a store's group commit
// costs the kernel: each group of puts appended to a file and synced before
// it is answered, by that answer thread or, without one, by the gRPC thread
// that finds no group being written (it writes and answers groups while
// puts wait), so that the two shapes of a durable server can be compared. No real server can be cheaper per request with this gRPC, so a
// benchmark against it bounds what any server could reach on the same
// machine (docs/BENCHMARKS.md, "The gRPC floor"). It is a measuring tool,
// not a server: it keeps no history, and everything else answers
// UNIMPLEMENTED.
//
// It takes the flags `capstan-bench compare` passes to a server, so it runs
// as `compare --capstan-binary build/release/capstan-grpc-floor`.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include "absl/container/btree_map.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "etcdserverpb/rpc.grpc.pb.h"

namespace capstan::bench {
namespace {

constexpr uint64_t kClusterId = 0x1000;
constexpr uint64_t kMemberId = 0x2000;
// RangeResponse.kvs: field 2, length-delimited.
constexpr uint32_t kRangeResponseKvsTag = (2 << 3) | 2;

void FillHeader(int64_t revision, etcdserverpb::ResponseHeader* h) {
  h->set_cluster_id(kClusterId);
  h->set_member_id(kMemberId);
  h->set_revision(revision);
  h->set_raft_term(2);
}

// A KeyValue as it goes into a RangeResponse: the field's tag and length,
// then the message, in one refcounted slice that every response holding it
// shares.
grpc::Slice EncodeKv(const std::string& key, const std::string& value, int64_t revision) {
  mvccpb::KeyValue kv;
  kv.set_key(key);
  kv.set_value(value);
  kv.set_create_revision(revision);
  kv.set_mod_revision(revision);
  kv.set_version(1);
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream raw(&bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.WriteTag(kRangeResponseKvsTag);
    out.WriteVarint64(kv.ByteSizeLong());
    kv.SerializeWithCachedSizes(&out);
  }
  return grpc::Slice(std::move(bytes));
}

// Keys and their encoded KeyValues in order, and a counter standing in for
// the revision.
class Memory {
 public:
  int64_t Put(const std::string& key, const std::string& value) {
    absl::MutexLock l(&mu_);
    ++rev_;
    values_.insert_or_assign(key, EncodeKv(key, value, rev_));
    return rev_;
  }

  int64_t Rev() const {
    absl::MutexLock l(&mu_);
    return rev_;
  }

  // Appends the encoded KeyValues of [key, end) to out in order, at most
  // `limit` of them (0: all), with whether more follow, and returns the
  // revision when it began. An empty end is the key alone, "\0" every key
  // from `key` on. The lock is taken for a chunk of keys at a time, so that
  // puts never wait for a whole list: a list is not a snapshot (the floor
  // keeps no history).
  int64_t Scan(const std::string& key, const std::string& end, int64_t limit,
               std::vector<grpc::Slice>* out, bool* more) const {
    constexpr size_t kChunk = 1024;
    *more = false;
    if (end.empty()) {
      absl::MutexLock l(&mu_);
      if (auto it = values_.find(key); it != values_.end()) out->push_back(it->second);
      return rev_;
    }
    const bool to_last = end == std::string(1, '\0');
    int64_t rev = 0;  // rev_ is never 0
    int64_t found = 0;
    std::string from = key;
    for (;;) {
      absl::MutexLock l(&mu_);
      if (rev == 0) rev = rev_;
      auto it = values_.lower_bound(from);
      auto inside = [&] { return it != values_.end() && (to_last || it->first < end); };
      for (size_t taken = 0; inside() && taken < kChunk; ++it, ++taken) {
        if (limit > 0 && found == limit) {
          *more = true;
          return rev;
        }
        out->push_back(it->second);
        ++found;
      }
      if (!inside()) return rev;
      from = it->first;
    }
  }

 private:
  mutable absl::Mutex mu_;
  absl::btree_map<std::string, grpc::Slice> values_ ABSL_GUARDED_BY(mu_);
  int64_t rev_ ABSL_GUARDED_BY(mu_) = 1;
};

// A log that puts are made durable in (--durable): each put's key and value
// appended, then one fdatasync for all the puts waiting, as a store's group
// commit makes a group durable (RocksDB appends to its WAL and syncs it the
// same way). The file is removed when the floor stops. Not thread-safe: one
// thread writes at a time (the answer thread, or InlineGroups' writer).
class GroupLog {
 public:
  // Null, with the reason on stderr, if the file cannot be created.
  static std::unique_ptr<GroupLog> Open(const std::string& dir) {
    const std::string path = dir + "/capstan-grpc-floor.log";
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
      std::cerr << "capstan-grpc-floor: cannot create " << path << ": " << std::strerror(errno)
                << "\n";
      return nullptr;
    }
    return std::unique_ptr<GroupLog>(new GroupLog(fd, path));
  }

  ~GroupLog() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }

  // Appends the records and syncs them; a failure ends the process (a
  // measuring tool has no way to refuse a write it could not make durable).
  void Write(const std::vector<std::string>& records) {
    buffer_.clear();
    for (const std::string& r : records) buffer_ += r;
    size_t done = 0;
    while (done < buffer_.size()) {
      const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) Die("write");
      done += static_cast<size_t>(n);
    }
    if (::fdatasync(fd_) != 0) Die("fdatasync");
  }

 private:
  GroupLog(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  [[noreturn]] void Die(const char* what) {
    std::cerr << "capstan-grpc-floor: " << what << " " << path_ << ": " << std::strerror(errno)
              << "\n";
    std::abort();
  }

  const int fd_;
  const std::string path_;
  std::string buffer_;
};

// What a put's answer waits for: `finish` finishes its call, `record` is
// what --durable makes durable first. Hand may be called from any thread;
// each `finish` runs once, after its record is synced.
class Answers {
 public:
  virtual ~Answers() = default;
  virtual void Hand(std::string record, std::function<void()> finish) = 0;
  // Runs `drain` after each batch of answers (null: nothing). Returns once
  // no earlier drain is running.
  virtual void SetDrain(std::function<void()> drain) = 0;
};

// One thread that finishes the calls handed to it, all that are waiting at
// once (--answer-thread), after writing their records to `log` if it is not
// null: a committer thread, as Capstan's. With `via_alarm` it finishes none
// itself: it hands each batch to gRPC's callback threads with an alarm due
// at once, whose callback finishes them (--answer-alarm).
class Answerer final : public Answers {
 public:
  Answerer(GroupLog* log, bool via_alarm)
      : log_(log), via_alarm_(via_alarm), thread_([this] { Loop(); }) {}

  ~Answerer() override {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  void Hand(std::string record, std::function<void()> finish) override {
    absl::MutexLock l(&mu_);
    if (log_ != nullptr) records_.push_back(std::move(record));
    waiting_.push_back(std::move(finish));
  }

  // While a drain is set and the thread idle, it also runs every kDrainEvery.
  void SetDrain(std::function<void()> drain) override {
    absl::MutexLock l(&drain_mu_);
    drain_ = std::move(drain);
    draining_.store(drain_ != nullptr);
  }

 private:
  void Loop() {
    std::vector<std::function<void()>> batch;
    std::vector<std::string> records;
    for (;;) {
      {
        absl::MutexLock l(&mu_);
        mu_.AwaitWithTimeout(absl::Condition(
                                 +[](Answerer* a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(a->mu_) {
                                   return a->stop_ || !a->waiting_.empty();
                                 },
                                 this),
                             draining_.load() ? kDrainEvery : absl::InfiniteDuration());
        if (stop_ && waiting_.empty()) return;
        batch.swap(waiting_);
        records.swap(records_);
      }
      if (log_ != nullptr && !records.empty()) log_->Write(records);
      records.clear();
      if (via_alarm_ && !batch.empty()) {
        auto* alarm = new grpc::Alarm;
        alarm->Set(gpr_time_0(GPR_CLOCK_REALTIME),
                   [alarm, finishes = std::move(batch)](bool) {
                     for (auto& finish : finishes) finish();
                     delete alarm;
                   });
      } else {
        for (auto& finish : batch) finish();
      }
      batch.clear();
      absl::MutexLock l(&drain_mu_);
      if (drain_) drain_();
    }
  }

  static constexpr absl::Duration kDrainEvery = absl::Milliseconds(5);

  GroupLog* const log_;
  const bool via_alarm_;
  absl::Mutex mu_;
  std::vector<std::function<void()>> waiting_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> records_ ABSL_GUARDED_BY(mu_);
  absl::Mutex drain_mu_;
  std::function<void()> drain_ ABSL_GUARDED_BY(drain_mu_);
  std::atomic<bool> draining_{false};  // drain_ is set
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// --durable without --answer-thread: no thread of its own. A put handed
// while no group is being written makes its caller (the gRPC thread that
// read it) the writer: it writes and syncs the puts waiting and answers
// them; a put handed meanwhile only waits (the leader and followers of
// RocksDB's write groups). So every answer is finished on a gRPC thread,
// and the other gRPC threads keep reading requests while one syncs. Without
// `later` the writer goes on while puts wait; with it, it writes one group
// per turn and calls `later` to come back for the next (Resume) once it has
// served what its completion queue holds: a queue's thread that wrote group
// after group would leave its own calls unread.
class InlineGroups final : public Answers {
 public:
  InlineGroups(GroupLog* log, std::function<void()> later)
      : log_(log), later_(std::move(later)) {}

  void Hand(std::string record, std::function<void()> finish) override {
    {
      absl::MutexLock l(&mu_);
      records_.push_back(std::move(record));
      waiting_.push_back(std::move(finish));
      if (writing_) return;
      writing_ = true;
    }
    Write();
  }

  // Writes the puts waiting, if no other thread is.
  void Resume() {
    {
      absl::MutexLock l(&mu_);
      if (writing_ || waiting_.empty()) return;
      writing_ = true;
    }
    Write();
  }

  void SetDrain(std::function<void()> drain) override {
    absl::MutexLock l(&drain_mu_);
    drain_ = std::move(drain);
  }

 private:
  // REQUIRES: this thread set writing_.
  void Write() {
    std::vector<std::function<void()>> batch;
    std::vector<std::string> records;
    for (bool wrote = false;; wrote = true) {
      {
        absl::MutexLock l(&mu_);
        if (waiting_.empty() || (later_ != nullptr && wrote)) {
          writing_ = false;
          if (waiting_.empty()) return;
          break;
        }
        batch.swap(waiting_);
        records.swap(records_);
      }
      log_->Write(records);
      records.clear();
      for (auto& finish : batch) finish();
      batch.clear();
      absl::MutexLock l(&drain_mu_);
      if (drain_) drain_();
    }
    later_();
  }

  GroupLog* const log_;
  const std::function<void()> later_;
  absl::Mutex mu_;
  std::vector<std::function<void()>> waiting_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> records_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex drain_mu_;
  std::function<void()> drain_ ABSL_GUARDED_BY(drain_mu_);
};

// What --durable writes of a put.
std::string RecordOf(const etcdserverpb::PutRequest& req) {
  return absl::StrCat(req.key(), req.value());
}
std::string RecordOf(const etcdserverpb::TxnRequest& req) {
  std::string record;
  for (const auto& op : req.success()) {
    absl::StrAppend(&record, op.request_put().key(), op.request_put().value());
  }
  return record;
}
template <typename Request>
std::string RecordOf(const Request&) {
  return std::string();
}

// The answers, for both server models.
grpc::Status AnswerPut(Memory* memory, const etcdserverpb::PutRequest& req,
                       etcdserverpb::PutResponse* resp) {
  FillHeader(memory->Put(req.key(), req.value()), resp->mutable_header());
  return grpc::Status::OK;
}

grpc::Status AnswerTxn(Memory* memory, const etcdserverpb::TxnRequest& req,
                       etcdserverpb::TxnResponse* resp) {
  int64_t rev = 0;
  for (const auto& op : req.success()) {
    if (!op.has_request_put()) {
      return grpc::Status(grpc::UNIMPLEMENTED, "the floor's txns hold puts only");
    }
    rev = memory->Put(op.request_put().key(), op.request_put().value());
    resp->add_responses()->mutable_response_put();
  }
  FillHeader(rev != 0 ? rev : memory->Rev(), resp->mutable_header());
  resp->set_succeeded(true);
  return grpc::Status::OK;
}

grpc::Status AnswerRange(const Memory* memory, const grpc::ByteBuffer& request,
                         grpc::ByteBuffer* response) {
  grpc::ByteBuffer in(request);
  etcdserverpb::RangeRequest req;
  if (!grpc::SerializationTraits<etcdserverpb::RangeRequest>::Deserialize(&in, &req).ok()) {
    return grpc::Status(grpc::INTERNAL, "grpc: error unmarshalling request");
  }
  std::vector<grpc::Slice> slices(1);
  bool more = false;
  etcdserverpb::RangeResponse head;
  FillHeader(memory->Scan(req.key(), req.range_end(), req.limit(), &slices, &more),
             head.mutable_header());
  head.set_more(more);
  head.set_count(static_cast<int64_t>(slices.size() - 1) + (more ? 1 : 0));
  slices[0] = grpc::Slice(head.SerializeAsString());
  grpc::ByteBuffer out(slices.data(), slices.size());
  response->Swap(&out);
  return grpc::Status::OK;
}

// Every lease is alive and keeps a TTL of 100.
void AnswerKeepAlive(const Memory* memory, const etcdserverpb::LeaseKeepAliveRequest& req,
                     etcdserverpb::LeaseKeepAliveResponse* resp) {
  resp->Clear();
  FillHeader(memory->Rev(), resp->mutable_header());
  resp->set_id(req.id());
  resp->set_ttl(100);
}

std::atomic<int64_t> g_next_lease{0x7000};

grpc::Status AnswerLeaseGrant(const Memory* memory, const etcdserverpb::LeaseGrantRequest& req,
                              etcdserverpb::LeaseGrantResponse* resp) {
  FillHeader(memory->Rev(), resp->mutable_header());
  resp->set_id(req.id() != 0 ? req.id() : g_next_lease.fetch_add(1) + 1);
  resp->set_ttl(req.ttl());
  return grpc::Status::OK;
}

// ---- Watch (the callback model) ----------------------------------------

class WatchReactor;

// Which streams watch which keys (exact keys only: what etcd's
// `watch-latency` workload creates).
class Watchers {
 public:
  void Add(const std::string& key, WatchReactor* stream, int64_t watch_id) {
    absl::MutexLock l(&mu_);
    by_key_[key].push_back({stream, watch_id});
  }
  // After it returns no Notify reaches `stream`.
  void Remove(WatchReactor* stream) {
    absl::MutexLock l(&mu_);
    for (auto& [key, list] : by_key_) {
      list.erase(std::remove_if(list.begin(), list.end(),
                                [&](const Watcher& w) { return w.stream == stream; }),
                 list.end());
    }
  }
  // Starts the write of the event to every stream watching `key`.
  void Notify(const std::string& key, const std::string& value, int64_t revision);

 private:
  struct Watcher {
    WatchReactor* stream;
    int64_t watch_id;
  };
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::vector<Watcher>> by_key_ ABSL_GUARDED_BY(mu_);
};

// A watch stream: creates a watcher per create request and writes the
// responses posted to it one at a time, in order.
class WatchReactor final
    : public grpc::ServerBidiReactor<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse> {
 public:
  WatchReactor(Watchers* watchers, const Memory* memory) : watchers_(watchers), memory_(memory) {
    StartRead(&request_);
  }

  void Post(etcdserverpb::WatchResponse response) {
    bool start = false;
    {
      absl::MutexLock l(&mu_);
      pending_.push_back(std::move(response));
      start = !writing_ && TakeNextLocked();
    }
    if (start) StartWrite(&writing_response_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      watchers_->Remove(this);
      bool finish = false;
      {
        absl::MutexLock l(&mu_);
        done_ = true;
        finish = !writing_;
      }
      // Outside the lock: once finished, OnDone may run (and delete this)
      // on another thread.
      if (finish) Finish(grpc::Status::OK);
      return;
    }
    if (request_.has_create_request()) {
      const int64_t id = next_id_++;
      etcdserverpb::WatchResponse created;
      FillHeader(memory_->Rev(), created.mutable_header());
      created.set_watch_id(id);
      created.set_created(true);
      Post(std::move(created));
      watchers_->Add(request_.create_request().key(), this, id);
    }
    StartRead(&request_);
  }

  void OnWriteDone(bool ok) override {
    bool next = false, finish = false;
    {
      absl::MutexLock l(&mu_);
      writing_ = false;
      if (!ok) pending_.clear();
      next = TakeNextLocked();
      finish = !next && done_;
    }
    if (next) StartWrite(&writing_response_);
    if (finish) Finish(grpc::Status::OK);
  }

  void OnDone() override { delete this; }

 private:
  // Moves the next pending response into writing_response_, which only the
  // write it starts uses until OnWriteDone.
  bool TakeNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (pending_.empty()) return false;
    writing_ = true;
    writing_response_ = std::move(pending_.front());
    pending_.pop_front();
    return true;
  }

  Watchers* const watchers_;
  const Memory* const memory_;
  etcdserverpb::WatchRequest request_;  // the reads are sequential
  int64_t next_id_ = 0;                 // read side only
  absl::Mutex mu_;
  std::deque<etcdserverpb::WatchResponse> pending_ ABSL_GUARDED_BY(mu_);
  etcdserverpb::WatchResponse writing_response_;  // see TakeNextLocked
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

void Watchers::Notify(const std::string& key, const std::string& value, int64_t revision) {
  absl::MutexLock l(&mu_);
  auto it = by_key_.find(key);
  if (it == by_key_.end()) return;
  for (const Watcher& w : it->second) {
    etcdserverpb::WatchResponse r;
    FillHeader(revision, r.mutable_header());
    r.set_watch_id(w.watch_id);
    mvccpb::Event* e = r.add_events();
    e->set_type(mvccpb::Event::PUT);
    mvccpb::KeyValue* kv = e->mutable_kv();
    kv->set_key(key);
    kv->set_value(value);
    kv->set_create_revision(revision);
    kv->set_mod_revision(revision);
    kv->set_version(1);
    w.stream->Post(std::move(r));
  }
}

class FloorWatch final : public etcdserverpb::Watch::CallbackService {
 public:
  FloorWatch(Watchers* watchers, const Memory* memory) : watchers_(watchers), memory_(memory) {}

  grpc::ServerBidiReactor<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>* Watch(
      grpc::CallbackServerContext*) override {
    return new WatchReactor(watchers_, memory_);
  }

 private:
  Watchers* const watchers_;
  const Memory* const memory_;
};

using FloorKvBase = etcdserverpb::KV::WithRawCallbackMethod_Range<
    etcdserverpb::KV::WithCallbackMethod_Put<etcdserverpb::KV::WithCallbackMethod_Txn<
        etcdserverpb::KV::Service>>>;

class FloorKv final : public FloorKvBase {
 public:
  // Puts and txns are answered through `answerer` if it is not null.
  FloorKv(Memory* memory, Answers* answerer, Watchers* watchers)
      : memory_(memory), answerer_(answerer), watchers_(watchers) {}

  grpc::ServerUnaryReactor* Put(grpc::CallbackServerContext* ctx,
                                const etcdserverpb::PutRequest* req,
                                etcdserverpb::PutResponse* resp) override {
    AnswerPut(memory_, *req, resp);
    watchers_->Notify(req->key(), req->value(), resp->header().revision());
    auto* reactor = ctx->DefaultReactor();
    if (answerer_ != nullptr) {
      answerer_->Hand(RecordOf(*req), [reactor] { reactor->Finish(grpc::Status::OK); });
    } else {
      reactor->Finish(grpc::Status::OK);
    }
    return reactor;
  }

  // Txns of puts only (what `capstan-bench fill` loads with); compares are
  // not evaluated.
  grpc::ServerUnaryReactor* Txn(grpc::CallbackServerContext* ctx,
                                const etcdserverpb::TxnRequest* req,
                                etcdserverpb::TxnResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    const grpc::Status st = AnswerTxn(memory_, *req, resp);
    if (answerer_ != nullptr && st.ok()) {
      answerer_->Hand(RecordOf(*req), [reactor] { reactor->Finish(grpc::Status::OK); });
    } else {
      reactor->Finish(st);
    }
    return reactor;
  }

  // Keys, ranges and prefixes with a limit, answered with the stored
  // encodings as they are: the response's slices are the stored ones, so
  // nothing is copied or encoded per list. Revisions and every other field
  // of the request are ignored, and `count` is only what was walked (the
  // keys returned, one more if there are more).
  grpc::ServerUnaryReactor* Range(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override {
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(AnswerRange(memory_, *request, response));
    return reactor;
  }

 private:
  Memory* const memory_;
  Answers* const answerer_;
  Watchers* const watchers_;
};

class KeepAliveReactor final
    : public grpc::ServerBidiReactor<etcdserverpb::LeaseKeepAliveRequest,
                                     etcdserverpb::LeaseKeepAliveResponse> {
 public:
  explicit KeepAliveReactor(const Memory* memory) : memory_(memory) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    AnswerKeepAlive(memory_, request_, &response_);
    StartWrite(&response_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::UNAVAILABLE, "keep-alive stream broken"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  const Memory* const memory_;
  etcdserverpb::LeaseKeepAliveRequest request_;
  etcdserverpb::LeaseKeepAliveResponse response_;
};

class FloorLease final : public etcdserverpb::Lease::CallbackService {
 public:
  explicit FloorLease(const Memory* memory) : memory_(memory) {}

  grpc::ServerUnaryReactor* LeaseGrant(grpc::CallbackServerContext* ctx,
                                       const etcdserverpb::LeaseGrantRequest* req,
                                       etcdserverpb::LeaseGrantResponse* resp) override {
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(AnswerLeaseGrant(memory_, *req, resp));
    return reactor;
  }

  grpc::ServerBidiReactor<etcdserverpb::LeaseKeepAliveRequest,
                          etcdserverpb::LeaseKeepAliveResponse>*
  LeaseKeepAlive(grpc::CallbackServerContext*) override {
    return new KeepAliveReactor(memory_);
  }

 private:
  const Memory* const memory_;
};

// ---- The completion-queue model ----------------------------------------

// A call in progress; it is its own tag on its queue.
class AsyncCall {
 public:
  virtual ~AsyncCall() = default;
  // One of the call's operations completed (ok: it succeeded).
  virtual void Proceed(bool ok) = 0;
};

// Proceeds every call whose operation completed on `q`: what is there now,
// or (wait) until `q`, shut down, is empty.
void ProceedAll(grpc::CompletionQueue* q, bool wait) {
  void* tag = nullptr;
  bool ok = false;
  if (wait) {
    while (q->Next(&tag, &ok)) static_cast<AsyncCall*>(tag)->Proceed(ok);
    return;
  }
  while (q->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_REALTIME)) ==
         grpc::CompletionQueue::GOT_EVENT) {
    static_cast<AsyncCall*>(tag)->Proceed(ok);
  }
}

// Set once the server shuts down: no call is armed any more.
std::atomic<bool> g_async_stopping{false};

// The completion queue the calling thread serves (async model).
thread_local grpc::CompletionQueue* t_queue = nullptr;

// Runs `fn` on the calling queue thread once it has taken what its queue
// holds now (an alarm due at once).
class Later final : public AsyncCall {
 public:
  static void Post(std::function<void()> fn) {
    if (!g_async_stopping.load() && t_queue != nullptr) new Later(std::move(fn));
  }

  void Proceed(bool) override {
    fn_();
    delete this;
  }

 private:
  explicit Later(std::function<void()> fn) : fn_(std::move(fn)) {
    alarm_.Set(t_queue, gpr_time_0(GPR_CLOCK_REALTIME), this);
  }

  std::function<void()> fn_;
  grpc::Alarm alarm_;
};

// A unary call: armed by `arm`, answered by `handle` on the thread that
// takes the request from the queue, which arms the next call of its method
// first, and finished there too, or by `answerer` if it is not null.
template <typename Request, typename Response>
class AsyncUnary final : public AsyncCall {
 public:
  using Writer = grpc::ServerAsyncResponseWriter<Response>;
  using Arm = std::function<void(grpc::ServerContext*, Request*, Writer*, void*)>;
  using Handle = std::function<grpc::Status(const Request&, Response*)>;

  // `arm`, `handle` and `answerer` outlive every call.
  static void Start(const Arm* arm, const Handle* handle, Answers* answerer = nullptr) {
    if (!g_async_stopping.load()) new AsyncUnary(arm, handle, answerer);
  }

  void Proceed(bool ok) override {
    if (answered_ || !ok) {
      delete this;
      return;
    }
    Start(arm_, handle_, answerer_);
    const grpc::Status st = (*handle_)(request_, &response_);
    answered_ = true;
    if (answerer_ != nullptr) {
      answerer_->Hand(RecordOf(request_), [this, st] { writer_.Finish(response_, st, this); });
    } else {
      writer_.Finish(response_, st, this);
    }
  }

 private:
  AsyncUnary(const Arm* arm, const Handle* handle, Answers* answerer)
      : arm_(arm), handle_(handle), answerer_(answerer) {
    (*arm_)(&ctx_, &request_, &writer_, this);
  }

  const Arm* const arm_;
  const Handle* const handle_;
  Answers* const answerer_;
  grpc::ServerContext ctx_;
  Request request_;
  Response response_;
  Writer writer_{&ctx_};
  bool answered_ = false;
};

using AsyncKvService = etcdserverpb::KV::WithRawMethod_Range<
    etcdserverpb::KV::WithAsyncMethod_Put<etcdserverpb::KV::WithAsyncMethod_Txn<
        etcdserverpb::KV::Service>>>;
using AsyncLeaseService = etcdserverpb::Lease::WithAsyncMethod_LeaseGrant<
    etcdserverpb::Lease::WithAsyncMethod_LeaseKeepAlive<etcdserverpb::Lease::Service>>;

// A keep-alive stream: read a request, write its answer, read the next.
class AsyncKeepAlive final : public AsyncCall {
 public:
  static void Start(AsyncLeaseService* service, grpc::ServerCompletionQueue* cq,
                    const Memory* memory) {
    if (!g_async_stopping.load()) new AsyncKeepAlive(service, cq, memory);
  }

  void Proceed(bool ok) override {
    switch (state_) {
      case State::kAccept:
        if (!ok) break;
        Start(service_, cq_, memory_);
        Read();
        return;
      case State::kRead:
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        AnswerKeepAlive(memory_, request_, &response_);
        state_ = State::kWrite;
        stream_.Write(response_, this);
        return;
      case State::kWrite:
        if (!ok) {
          Finish(grpc::Status(grpc::UNAVAILABLE, "keep-alive stream broken"));
          return;
        }
        Read();
        return;
      case State::kFinish:
        break;
    }
    delete this;
  }

 private:
  enum class State { kAccept, kRead, kWrite, kFinish };

  AsyncKeepAlive(AsyncLeaseService* service, grpc::ServerCompletionQueue* cq,
                 const Memory* memory)
      : service_(service), cq_(cq), memory_(memory) {
    service_->RequestLeaseKeepAlive(&ctx_, &stream_, cq_, cq_, this);
  }
  void Read() {
    state_ = State::kRead;
    stream_.Read(&request_, this);
  }
  void Finish(const grpc::Status& st) {
    state_ = State::kFinish;
    stream_.Finish(st, this);
  }

  AsyncLeaseService* const service_;
  grpc::ServerCompletionQueue* const cq_;
  const Memory* const memory_;
  grpc::ServerContext ctx_;
  grpc::ServerAsyncReaderWriter<etcdserverpb::LeaseKeepAliveResponse,
                                etcdserverpb::LeaseKeepAliveRequest>
      stream_{&ctx_};
  etcdserverpb::LeaseKeepAliveRequest request_;
  etcdserverpb::LeaseKeepAliveResponse response_;
  State state_ = State::kAccept;
};

// The services, the queues and their threads.
class AsyncFloor {
 public:
  // Puts and txns are answered by `answerer` if it is not null; with
  // `answer_queue`, their calls' operations complete on a queue of their
  // own, which no thread waits on: the thread that answered takes what is
  // there after each batch.
  AsyncFloor(Memory* memory, Answers* answerer, bool answer_queue)
      : memory_(memory), answerer_(answerer) {
    if (answerer_ != nullptr && answer_queue) {
      answered_ = std::make_unique<grpc::CompletionQueue>();
      answerer_->SetDrain([q = answered_.get()] { ProceedAll(q, /*wait=*/false); });
    }
  }

  void Register(grpc::ServerBuilder* builder, int queues) {
    builder->RegisterService(&kv_);
    builder->RegisterService(&lease_);
    for (int i = 0; i < queues; ++i) queues_.push_back(builder->AddCompletionQueue());
  }

  // After the server started: arms `armed` calls of each method on every
  // queue and starts a thread per queue.
  void Start(int armed) {
    for (auto& q : queues_) {
      grpc::ServerCompletionQueue* cq = q.get();
      auto& h = handlers_.emplace_back(std::make_unique<Handlers>());
      grpc::CompletionQueue* put_cq = answered_ != nullptr ? answered_.get() : cq;
      h->put_arm = [this, cq, put_cq](grpc::ServerContext* c, etcdserverpb::PutRequest* r,
                                      AsyncUnary<etcdserverpb::PutRequest,
                                                 etcdserverpb::PutResponse>::Writer* w,
                                      void* tag) { kv_.RequestPut(c, r, w, put_cq, cq, tag); };
      h->put = [this](const etcdserverpb::PutRequest& r, etcdserverpb::PutResponse* out) {
        return AnswerPut(memory_, r, out);
      };
      h->txn_arm = [this, cq, put_cq](grpc::ServerContext* c, etcdserverpb::TxnRequest* r,
                                      AsyncUnary<etcdserverpb::TxnRequest,
                                                 etcdserverpb::TxnResponse>::Writer* w,
                                      void* tag) { kv_.RequestTxn(c, r, w, put_cq, cq, tag); };
      h->txn = [this](const etcdserverpb::TxnRequest& r, etcdserverpb::TxnResponse* out) {
        return AnswerTxn(memory_, r, out);
      };
      h->range_arm = [this, cq](grpc::ServerContext* c, grpc::ByteBuffer* r,
                                AsyncUnary<grpc::ByteBuffer, grpc::ByteBuffer>::Writer* w,
                                void* tag) { kv_.RequestRange(c, r, w, cq, cq, tag); };
      h->range = [this](const grpc::ByteBuffer& r, grpc::ByteBuffer* out) {
        return AnswerRange(memory_, r, out);
      };
      h->grant_arm = [this, cq](grpc::ServerContext* c, etcdserverpb::LeaseGrantRequest* r,
                                AsyncUnary<etcdserverpb::LeaseGrantRequest,
                                           etcdserverpb::LeaseGrantResponse>::Writer* w,
                                void* tag) { lease_.RequestLeaseGrant(c, r, w, cq, cq, tag); };
      h->grant = [this](const etcdserverpb::LeaseGrantRequest& r,
                        etcdserverpb::LeaseGrantResponse* out) {
        return AnswerLeaseGrant(memory_, r, out);
      };
      for (int i = 0; i < armed; ++i) {
        AsyncUnary<etcdserverpb::PutRequest, etcdserverpb::PutResponse>::Start(
            &h->put_arm, &h->put, answerer_);
        AsyncUnary<etcdserverpb::TxnRequest, etcdserverpb::TxnResponse>::Start(
            &h->txn_arm, &h->txn, answerer_);
        AsyncUnary<grpc::ByteBuffer, grpc::ByteBuffer>::Start(&h->range_arm, &h->range);
        AsyncUnary<etcdserverpb::LeaseGrantRequest, etcdserverpb::LeaseGrantResponse>::Start(
            &h->grant_arm, &h->grant);
        AsyncKeepAlive::Start(&lease_, cq, memory_);
      }
      threads_.emplace_back([cq] {
        t_queue = cq;
        ProceedAll(cq, /*wait=*/true);
      });
    }
  }

  // After the server shut down.
  void Stop() {
    g_async_stopping.store(true);
    for (auto& q : queues_) q->Shutdown();
    for (auto& t : threads_) t.join();
    if (answered_ != nullptr) {
      answerer_->SetDrain(nullptr);
      answered_->Shutdown();
      ProceedAll(answered_.get(), /*wait=*/true);
    }
  }

 private:
  struct Handlers {
    AsyncUnary<etcdserverpb::PutRequest, etcdserverpb::PutResponse>::Arm put_arm;
    AsyncUnary<etcdserverpb::PutRequest, etcdserverpb::PutResponse>::Handle put;
    AsyncUnary<etcdserverpb::TxnRequest, etcdserverpb::TxnResponse>::Arm txn_arm;
    AsyncUnary<etcdserverpb::TxnRequest, etcdserverpb::TxnResponse>::Handle txn;
    AsyncUnary<grpc::ByteBuffer, grpc::ByteBuffer>::Arm range_arm;
    AsyncUnary<grpc::ByteBuffer, grpc::ByteBuffer>::Handle range;
    AsyncUnary<etcdserverpb::LeaseGrantRequest, etcdserverpb::LeaseGrantResponse>::Arm grant_arm;
    AsyncUnary<etcdserverpb::LeaseGrantRequest, etcdserverpb::LeaseGrantResponse>::Handle grant;
  };

  Memory* const memory_;
  Answers* const answerer_;
  std::unique_ptr<grpc::CompletionQueue> answered_;  // --answer-queue
  AsyncKvService kv_;
  AsyncLeaseService lease_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  std::vector<std::unique_ptr<Handlers>> handlers_;
  std::vector<std::thread> threads_;
};

// A server interceptor that only lets every batch proceed: what gRPC's
// interception machinery costs a call (Capstan's gRPC metrics are such an
// interceptor).
class PassInterceptor final : public grpc::experimental::Interceptor {
 public:
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    methods->Proceed();
  }
};

class PassInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo*) override {
    return new PassInterceptor();
  }
};

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

// The host:port gRPC listens on, from the first http:// client URL.
std::string ListenAddress(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    if (absl::StartsWith(arg, "--listen-client-urls=")) {
      value = arg.substr(sizeof("--listen-client-urls=") - 1);
    } else if (arg == "--listen-client-urls" && i + 1 < argc) {
      value = argv[i + 1];
    } else {
      continue;
    }
    std::vector<std::string> urls = absl::StrSplit(value, ',');
    if (!urls.empty() && absl::StartsWith(urls[0], "http://")) return urls[0].substr(7);
  }
  return "127.0.0.1:2379";
}

// The value of --NAME=V or --NAME V in argv, or `fallback`.
std::string FlagValue(int argc, char** argv, const std::string& name,
                      const std::string& fallback) {
  const std::string eq = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, eq)) return arg.substr(eq.size());
    if (arg == "--" + name && i + 1 < argc) return argv[i + 1];
  }
  return fallback;
}

int Main(int argc, char** argv) {
  bool answer_thread = false;
  bool answer_queue = false;
  bool answer_alarm = false;
  bool callback_watch = false;
  bool interceptor = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--answer-thread") answer_thread = true;
    if (std::string(argv[i]) == "--answer-queue") answer_queue = true;
    if (std::string(argv[i]) == "--answer-alarm") answer_alarm = true;
    if (std::string(argv[i]) == "--callback-watch") callback_watch = true;
    if (std::string(argv[i]) == "--interceptor") interceptor = true;
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::cout << "capstan-grpc-floor [--listen-client-urls=http://HOST:PORT] [--model=M] "
                   "[--queues=N] [--answer-thread] [--durable=DIR]\n"
                   "    [--answer-queue] [--answer-alarm] [other flags, ignored]\n\n"
                   "Answers KV.Put, KV.Txn (puts), KV.Range, Lease.LeaseGrant, "
                   "Lease.LeaseKeepAlive\nand (callback model) Watch of exact keys from memory with no storage: the cost of gRPC alone, "
                   "for benchmarks.\nNot a server: nothing is versioned, and nothing durable unless --durable.\n\n"
                   "  --model=callback|async  gRPC's callback API (default, as Capstan), or the\n"
                   "                          completion-queue API with a thread per queue\n"
                   "                          (also $CAPSTAN_GRPC_FLOOR_MODEL)\n"
                   "  --queues=N              async: completion queues, one thread each\n"
                   "                          (default: the number of cores; also\n"
                   "                          $CAPSTAN_GRPC_FLOOR_QUEUES)\n"
                   "  --answer-thread         answer puts and txns from one other thread, in\n"
                   "                          batches\n"
                   "  --durable=DIR           make each group of puts and txns durable before\n"
                   "                          answering it: appended to a file in DIR and\n"
                   "                          fdatasynced, by the answer thread with\n"
                   "                          --answer-thread, else by the gRPC thread that\n"
                   "                          finds no group being written (it writes and\n"
                   "                          answers groups while writes wait; the others\n"
                   "                          only queue theirs)\n"
                   "  --answer-alarm          callback, with --answer-thread: the answer\n"
                   "                          thread finishes no call itself; it hands each\n"
                   "                          batch to gRPC's callback threads (an alarm due\n"
                   "                          at once, whose callback finishes them)\n"
                   "  --answer-queue          async, with --answer-thread or --durable: the\n"
                   "                          writes' calls complete on a queue no thread\n"
                   "                          waits on, which the thread that answered empties\n"
                   "                          after each batch\n"
                   "  --callback-watch        async: serve Watch on the callback API beside\n"
                   "                          the queues, so that gRPC's callback threads\n"
                   "                          poll too, as in a server that keeps some\n"
                   "                          services there\n"
                   "  --interceptor           run every call through a server interceptor that "
                   "does nothing\n                          (also $CAPSTAN_GRPC_FLOOR_INTERCEPTOR=1)\n"
                   "  --channel-arg=NAME=N    also set gRPC's integer channel argument NAME (e.g.\n"
                   "                          grpc.minimal_stack=1); repeatable, and\n"
                   "                          $CAPSTAN_GRPC_FLOOR_CHANNEL_ARGS, comma-separated\n";
      return 0;
    }
  }
  auto env = [](const char* name, const char* fallback) {
    const char* v = std::getenv(name);
    return std::string(v != nullptr && *v != '\0' ? v : fallback);
  };
  const std::string model =
      FlagValue(argc, argv, "model", env("CAPSTAN_GRPC_FLOOR_MODEL", "callback"));
  int queues = 0;
  if (model != "callback" && model != "async") {
    std::cerr << "capstan-grpc-floor: --model is callback or async, not " << model << "\n";
    return 2;
  }
  if (!absl::SimpleAtoi(FlagValue(argc, argv, "queues",
                                  env("CAPSTAN_GRPC_FLOOR_QUEUES",
                                      std::to_string(std::thread::hardware_concurrency()).c_str())),
                        &queues) ||
      queues < 1) {
    std::cerr << "capstan-grpc-floor: --queues is a number of queues, at least 1\n";
    return 2;
  }
  const std::string durable = FlagValue(argc, argv, "durable", "");
  if ((answer_queue && (model != "async" || (!answer_thread && durable.empty()))) ||
      (callback_watch && model != "async") ||
      (answer_alarm && (model != "callback" || !answer_thread))) {
    std::cerr << "capstan-grpc-floor: --answer-queue needs --model=async and --answer-thread "
                 "or --durable, --callback-watch --model=async, --answer-alarm --model=callback "
                 "and --answer-thread\n";
    return 2;
  }
  interceptor = interceptor || env("CAPSTAN_GRPC_FLOOR_INTERCEPTOR", "0") == "1";
  Memory memory;
  std::unique_ptr<GroupLog> log;
  if (!durable.empty()) {
    log = GroupLog::Open(durable);
    if (log == nullptr) return 1;
  }
  std::unique_ptr<Answers> answerer;
  if (answer_thread) {
    answerer = std::make_unique<Answerer>(log.get(), answer_alarm);
  } else if (log != nullptr) {
    // On the queues a writer takes a group per turn (InlineGroups).
    auto groups = std::make_shared<InlineGroups*>(nullptr);
    std::function<void()> later;
    if (model == "async") later = [groups] { Later::Post([groups] { (*groups)->Resume(); }); };
    auto owned = std::make_unique<InlineGroups>(log.get(), std::move(later));
    *groups = owned.get();
    answerer = std::move(owned);
  }
  Watchers watchers;
  FloorKv kv(&memory, answerer.get(), &watchers);
  FloorWatch watch(&watchers, &memory);
  FloorLease lease(&memory);
  AsyncFloor async(&memory, answerer.get(), answer_queue);
  grpc::ServerBuilder builder;
  const std::string address = ListenAddress(argc, argv);
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  if (model == "async") {
    async.Register(&builder, queues);
    if (callback_watch) builder.RegisterService(&watch);
  } else {
    builder.RegisterService(&kv);
    builder.RegisterService(&lease);
    builder.RegisterService(&watch);
  }
  // Capstan's settings that bear on a request's cost (server/server.cc),
  // with the default --max-request-bytes.
  builder.SetMaxReceiveMessageSize(1536 * 1024 + 512 * 1024);
  builder.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             std::numeric_limits<int>::max());
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::vector<std::string> channel_args =
      absl::StrSplit(env("CAPSTAN_GRPC_FLOOR_CHANNEL_ARGS", ""), ',', absl::SkipEmpty());
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (absl::StartsWith(arg, "--channel-arg=")) channel_args.push_back(arg.substr(14));
  }
  for (const std::string& a : channel_args) {
    std::pair<std::string, std::string> nv = absl::StrSplit(a, absl::MaxSplits('=', 1));
    int value = 0;
    if (nv.first.empty() || !absl::SimpleAtoi(nv.second, &value)) {
      std::cerr << "capstan-grpc-floor: --channel-arg is NAME=INTEGER, not " << a << "\n";
      return 2;
    }
    builder.AddChannelArgument(nv.first, value);
  }
  if (interceptor) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> factories;
    factories.push_back(std::make_unique<PassInterceptorFactory>());
    builder.experimental().SetInterceptorCreators(std::move(factories));
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::cerr << "capstan-grpc-floor: cannot listen on " << address << "\n";
    return 1;
  }
  if (model == "async") async.Start(/*armed=*/64);
  std::cerr << "capstan-grpc-floor: serving on " << address << " (" << model
            << (model == "async" ? absl::StrCat(", ", queues, " queues") : std::string()) << ")\n";
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  while (!g_stop.load()) usleep(50 * 1000);
  server->Shutdown(std::chrono::system_clock::now());
  if (model == "async") async.Stop();
  return 0;
}

}  // namespace
}  // namespace capstan::bench

int main(int argc, char** argv) { return capstan::bench::Main(argc, argv); }
