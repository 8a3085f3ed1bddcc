// etcd requests decoded from fuzzed bytes and handled by a real store, as
// the gRPC services hand them over (server/api/kv_service.cc,
// server/api/watch_service.cc): the first byte picks Range, Put, DeleteRange,
// Txn, Compaction or Watch; the rest is parsed as that protobuf message
// (bytes that do not parse are refused, as the services refuse them).
// Every request must be answered (an error is fine) without crashing, and
// the store must keep working.

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "etcdserverpb/rpc.pb.h"
#include "mvcc/kv_store.h"
#include "mvcc/watch_hub.h"
#include "storage/backend.h"

namespace {

using capstan::mvcc::KvStore;
using capstan::mvcc::WatchHub;

struct Fixture {
  std::string dir;
  std::unique_ptr<KvStore> store;
  std::unique_ptr<WatchHub> hub;

  Fixture() {
    dir = absl::StrCat(std::filesystem::temp_directory_path().string(), "/capstan-request-fuzz-",
                       getpid());
    std::filesystem::remove_all(dir);
    capstan::storage::BackendOptions bo;
    bo.dir = dir;
    bo.sync = false;
    bo.block_cache_bytes = 4 << 20;
    bo.write_buffer_bytes = 4 << 20;
    auto backend = capstan::storage::Backend::Open(bo);
    if (!backend.ok()) std::abort();
    capstan::mvcc::KvStoreOptions ko;
    ko.compaction_sleep_interval = absl::ZeroDuration();
    auto s = KvStore::Open(ko, std::move(*backend));
    if (!s.ok()) std::abort();
    store = std::move(*s);
    hub = std::make_unique<WatchHub>(store.get(), capstan::mvcc::WatchHubOptions());
    store->SetWatchHub(hub.get());
    // Some history to read, watch and compact.
    for (int i = 0; i < 20; ++i) {
      etcdserverpb::PutRequest put;
      put.set_key(absl::StrCat("k", i % 7));
      put.set_value(absl::StrCat("v", i));
      if (!store->Put(put).ok()) std::abort();
    }
  }
  ~Fixture() {
    store->SetWatchHub(nullptr);
    hub->Stop();
    hub.reset();
    store.reset();
    std::filesystem::remove_all(dir);
  }
};

Fixture* fixture = nullptr;

template <typename Message>
bool Parse(const uint8_t* data, size_t size, Message* m) {
  return m->ParseFromArray(data, static_cast<int>(size));
}

// Decodes a write request and hands it to the store; any answer will do.
template <typename Request, typename Response>
void Write(const uint8_t* data, size_t size,
           absl::StatusOr<Response> (KvStore::*method)(const Request&)) {
  Request req;
  if (Parse(data, size, &req)) (fixture->store.get()->*method)(req).status().IgnoreError();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (fixture == nullptr) {
    fixture = new Fixture();
    std::atexit([] { delete fixture; });
  }
  if (size < 1) return 0;
  KvStore* store = fixture->store.get();
  const uint8_t op = data[0] % 6;
  ++data;
  --size;
  switch (op) {
    case 0: {
      etcdserverpb::RangeRequest req;
      if (!Parse(data, size, &req)) return 0;
      capstan::mvcc::RangeResult result;
      if (store->Range(req, &result).ok()) {
        etcdserverpb::RangeResponse resp;
        if (!resp.ParseFromString(result.kvs_wire)) std::abort();
        if (resp.kvs_size() != result.num_kvs) std::abort();
      }
      break;
    }
    case 1:
      Write(data, size, &KvStore::Put);
      break;
    case 2:
      Write(data, size, &KvStore::DeleteRange);
      break;
    case 3:
      Write(data, size, &KvStore::Txn);
      break;
    case 4:
      Write(data, size, &KvStore::Compact);
      break;
    case 5: {
      etcdserverpb::WatchRequest req;
      if (!Parse(data, size, &req)) return 0;
      auto stream = fixture->hub->OpenStream(etcdserverpb::ResponseHeader());
      switch (req.request_union_case()) {
        case etcdserverpb::WatchRequest::kCreateRequest:
          stream->Create(req.create_request());
          break;
        case etcdserverpb::WatchRequest::kCancelRequest:
          stream->Cancel(req.cancel_request().watch_id());
          break;
        case etcdserverpb::WatchRequest::kProgressRequest:
          stream->RequestProgress();
          break;
        default:
          break;
      }
      std::string message;
      for (int i = 0; i < 8 && stream->Pop(&message); ++i) {
        etcdserverpb::WatchResponse resp;
        if (!resp.ParseFromString(message)) std::abort();
      }
      stream->Close();
      break;
    }
  }
  // The store still answers.
  etcdserverpb::RangeRequest probe;
  probe.set_key("k0");
  capstan::mvcc::RangeResult result;
  if (!store->Range(probe, &result).ok()) std::abort();
  return 0;
}
