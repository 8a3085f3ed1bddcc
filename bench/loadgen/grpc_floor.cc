// capstan-grpc-floor: the least an etcd v3 server built on gRPC C++ can do
// per request, to tell how much of a benchmark's time is gRPC's and the
// kernel's rather than the server's own.
//
// It serves KV.Put, KV.Txn (of puts), KV.Range, Lease.LeaseGrant and
// Lease.LeaseKeepAlive on gRPC's callback API with Capstan's channel
// settings, and does nothing else: a put encodes its KeyValue once into an
// ordered map in memory (nothing is written to disk, nothing is versioned),
// a range answers with those encodings as they are, sharing their bytes
// (no copy, no encoding per response), a lease is a number, and every
// answer is written from the thread that received the
// request (unless --answer-thread: then puts are answered by one other
// thread, in batches, as Capstan's committer hands its groups to be
// answered). No real server can be cheaper per request with this gRPC, so a
// benchmark against it bounds what any server could reach on the same
// machine (docs/BENCHMARKS.md, "The gRPC floor"). It is a measuring tool,
// not a server: it keeps no history, and everything else answers
// UNIMPLEMENTED.
//
// It takes the flags `capstan-bench compare` passes to a server, so it runs
// as `compare --capstan-binary build/release/capstan-grpc-floor`.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <grpcpp/grpcpp.h>

#include "absl/container/btree_map.h"
#include "absl/strings/match.h"
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

// One thread that finishes the calls handed to it, all that are waiting at
// once.
class Answerer {
 public:
  Answerer() : thread_([this] { Loop(); }) {}

  ~Answerer() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

  void Hand(grpc::ServerUnaryReactor* reactor) {
    absl::MutexLock l(&mu_);
    waiting_.push_back(reactor);
  }

 private:
  void Loop() {
    std::vector<grpc::ServerUnaryReactor*> batch;
    for (;;) {
      {
        absl::MutexLock l(&mu_);
        mu_.Await(absl::Condition(
            +[](Answerer* a) ABSL_EXCLUSIVE_LOCKS_REQUIRED(a->mu_) {
              return a->stop_ || !a->waiting_.empty();
            },
            this));
        if (waiting_.empty()) return;
        batch.swap(waiting_);
      }
      for (auto* reactor : batch) reactor->Finish(grpc::Status::OK);
      batch.clear();
    }
  }

  absl::Mutex mu_;
  std::vector<grpc::ServerUnaryReactor*> waiting_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

using FloorKvBase = etcdserverpb::KV::WithRawCallbackMethod_Range<
    etcdserverpb::KV::WithCallbackMethod_Put<etcdserverpb::KV::WithCallbackMethod_Txn<
        etcdserverpb::KV::Service>>>;

class FloorKv final : public FloorKvBase {
 public:
  // Puts are answered by `answerer` if it is not null.
  FloorKv(Memory* memory, Answerer* answerer) : memory_(memory), answerer_(answerer) {}

  grpc::ServerUnaryReactor* Put(grpc::CallbackServerContext* ctx,
                                const etcdserverpb::PutRequest* req,
                                etcdserverpb::PutResponse* resp) override {
    FillHeader(memory_->Put(req->key(), req->value()), resp->mutable_header());
    auto* reactor = ctx->DefaultReactor();
    if (answerer_ != nullptr) {
      answerer_->Hand(reactor);
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
    int64_t rev = 0;
    for (const auto& op : req->success()) {
      if (!op.has_request_put()) {
        reactor->Finish(grpc::Status(grpc::UNIMPLEMENTED, "the floor's txns hold puts only"));
        return reactor;
      }
      rev = memory_->Put(op.request_put().key(), op.request_put().value());
      resp->add_responses()->mutable_response_put();
    }
    FillHeader(rev != 0 ? rev : memory_->Rev(), resp->mutable_header());
    resp->set_succeeded(true);
    reactor->Finish(grpc::Status::OK);
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
    grpc::ByteBuffer in(*request);
    etcdserverpb::RangeRequest req;
    if (!grpc::SerializationTraits<etcdserverpb::RangeRequest>::Deserialize(&in, &req).ok()) {
      reactor->Finish(grpc::Status(grpc::INTERNAL, "grpc: error unmarshalling request"));
      return reactor;
    }
    std::vector<grpc::Slice> slices(1);
    bool more = false;
    etcdserverpb::RangeResponse head;
    FillHeader(memory_->Scan(req.key(), req.range_end(), req.limit(), &slices, &more),
               head.mutable_header());
    head.set_more(more);
    head.set_count(static_cast<int64_t>(slices.size() - 1) + (more ? 1 : 0));
    slices[0] = grpc::Slice(head.SerializeAsString());
    grpc::ByteBuffer out(slices.data(), slices.size());
    response->Swap(&out);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  Memory* const memory_;
  Answerer* const answerer_;
};

class KeepAliveReactor final
    : public grpc::ServerBidiReactor<etcdserverpb::LeaseKeepAliveRequest,
                                     etcdserverpb::LeaseKeepAliveResponse> {
 public:
  KeepAliveReactor(const Memory* memory, int64_t ttl) : memory_(memory), ttl_(ttl) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    response_.Clear();
    FillHeader(memory_->Rev(), response_.mutable_header());
    response_.set_id(request_.id());
    response_.set_ttl(ttl_);
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
  const int64_t ttl_;
  etcdserverpb::LeaseKeepAliveRequest request_;
  etcdserverpb::LeaseKeepAliveResponse response_;
};

class FloorLease final : public etcdserverpb::Lease::CallbackService {
 public:
  explicit FloorLease(const Memory* memory) : memory_(memory) {}

  grpc::ServerUnaryReactor* LeaseGrant(grpc::CallbackServerContext* ctx,
                                       const etcdserverpb::LeaseGrantRequest* req,
                                       etcdserverpb::LeaseGrantResponse* resp) override {
    FillHeader(memory_->Rev(), resp->mutable_header());
    resp->set_id(req->id() != 0 ? req->id() : next_id_.fetch_add(1) + 1);
    resp->set_ttl(req->ttl());
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // Every lease is alive and keeps this TTL.
  grpc::ServerBidiReactor<etcdserverpb::LeaseKeepAliveRequest,
                          etcdserverpb::LeaseKeepAliveResponse>*
  LeaseKeepAlive(grpc::CallbackServerContext*) override {
    return new KeepAliveReactor(memory_, 100);
  }

 private:
  const Memory* const memory_;
  std::atomic<int64_t> next_id_{0x7000};
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

int Main(int argc, char** argv) {
  bool answer_thread = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--answer-thread") answer_thread = true;
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::cout << "capstan-grpc-floor [--listen-client-urls=http://HOST:PORT] [--answer-thread] "
                   "[other flags, ignored]\n\n"
                   "Answers KV.Put, KV.Txn (puts), KV.Range, Lease.LeaseGrant and "
                   "Lease.LeaseKeepAlive\nfrom memory with no storage: the cost of gRPC alone, "
                   "for benchmarks.\nNot a server: nothing is durable or versioned.\n\n"
                   "  --answer-thread  answer puts from one other thread, in batches\n";
      return 0;
    }
  }
  Memory memory;
  std::unique_ptr<Answerer> answerer;
  if (answer_thread) answerer = std::make_unique<Answerer>();
  FloorKv kv(&memory, answerer.get());
  FloorLease lease(&memory);
  grpc::ServerBuilder builder;
  const std::string address = ListenAddress(argc, argv);
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&kv);
  builder.RegisterService(&lease);
  // Capstan's settings that bear on a request's cost (server/server.cc),
  // with the default --max-request-bytes.
  builder.SetMaxReceiveMessageSize(1536 * 1024 + 512 * 1024);
  builder.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             std::numeric_limits<int>::max());
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::cerr << "capstan-grpc-floor: cannot listen on " << address << "\n";
    return 1;
  }
  std::cerr << "capstan-grpc-floor: serving on " << address << "\n";
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  while (!g_stop.load()) usleep(50 * 1000);
  server->Shutdown(std::chrono::system_clock::now());
  return 0;
}

}  // namespace
}  // namespace capstan::bench

int main(int argc, char** argv) { return capstan::bench::Main(argc, argv); }
