#include "server/api/snapshot_stream.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "membership/member_table.h"
#include "mvcc/meta_keys.h"
#include "mvcc/revision_key.h"
#include "openssl/evp.h"
#include "server/api/client_traffic.h"
#include "server/config/version.h"
#include "storage/backend.h"
#include "storage/data_dir.h"
#include "storage/etcdfmt/bbolt_writer.h"
#include "util/crc32c.h"
#include "util/go_text.h"
#include "util/mutex.h"

namespace capstan::server {
namespace fs = std::filesystem;

namespace {

constexpr size_t kChunk = 32 << 10;
// Beside the backend directory: <backend>.snapshot-<pid>-<n>, a checkpoint
// being streamed.
constexpr char kTempInfix[] = ".snapshot-";
// The meta pages' transaction ids (any will do: a snapshot has no history).
constexpr uint64_t kSnapshotTxid = 2;

// SHA-256 computed as bytes stream by.
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  void Update(std::string_view data) { EVP_DigestUpdate(ctx_, data.data(), data.size()); }
  std::string Final() {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_, out, &n);
    return std::string(reinterpret_cast<char*>(out), n);
  }

 private:
  EVP_MD_CTX* ctx_;
};

// etcd's buckets in name order, filled from a checkpoint of the backend:
// the column families are etcd's buckets already (docs/MIGRATION.md), auth
// split back into its three buckets. The membership buckets hold this
// member, as etcd's own snapshot holds its cluster's.
absl::Status WriteEtcdBuckets(storage::Backend* backend, const membership::MemberInfo& member,
                              etcdfmt::BboltWriter* out) {
  etcdfmt::BboltWriter& w = *out;
  // Copies the records of cf under prefix, without the prefix.
  auto copy = [&](storage::Cf cf, std::string_view prefix) -> absl::Status {
    auto it = backend->NewIterator(cf);
    for (it->Seek(prefix); it->Valid() && it->key().substr(0, prefix.size()) == prefix; it->Next()) {
      if (auto s = w.Put(it->key().substr(prefix.size()), it->value()); !s.ok()) return s;
    }
    return it->status();
  };
  auto bucket = [&](std::string_view name, storage::Cf cf, std::string_view prefix) {
    if (auto s = w.BeginBucket(name); !s.ok()) return s;
    return copy(cf, prefix);
  };
  if (auto s = bucket("alarm", storage::Cf::kAlarm, ""); !s.ok()) return s;
  for (std::string_view name : {"auth", "authRoles", "authUsers"}) {
    if (auto s = bucket(name, storage::Cf::kAuth, std::string(name) + "/"); !s.ok()) return s;
  }
  if (auto s = w.BeginBucket("cluster"); !s.ok()) return s;
  if (auto s = w.Put("clusterVersion", kEtcdClusterVersion); !s.ok()) return s;
  if (auto s = bucket("key", storage::Cf::kKey, ""); !s.ok()) return s;
  if (auto s = bucket("lease", storage::Cf::kLease, ""); !s.ok()) return s;
  // The members as etcd keeps them: Go's JSON of each, by ID in hex (key
  // order).
  if (auto s = w.BeginBucket("members"); !s.ok()) return s;
  std::map<std::string, std::string> records;
  for (const auto& m : membership::MembersOf(member)) records[absl::StrCat(absl::Hex(m.id))] = membership::MemberJson(m);
  for (const auto& [key, json] : records) {
    if (auto s = w.Put(key, json); !s.ok()) return s;
  }
  if (auto s = w.BeginBucket("members_removed"); !s.ok()) return s;
  if (auto s = w.BeginBucket("meta"); !s.ok()) return s;
  // etcd's meta records, in key order; Capstan's own stay behind.
  for (std::string_view key :
       {mvcc::kConsistentIndexKey, mvcc::kFinishedCompactKey, mvcc::kScheduledCompactKey}) {
    std::string value;
    absl::Status read = backend->Get(storage::Cf::kMeta, key, &value);
    if (absl::IsNotFound(read)) continue;
    if (!read.ok()) return read;
    if (auto s = w.Put(key, value); !s.ok()) return s;
  }
  return w.Finish(kSnapshotTxid);
}

// A consistent copy of store's backend: a RocksDB checkpoint (hard links),
// quick whatever the store's size. Its name is returned.
absl::StatusOr<std::string> Checkpoint(mvcc::KvStore* store) {
  static std::atomic<int> counter{0};
  std::string dir = absl::StrCat(store->backend()->options().dir, kTempInfix, getpid(), "-",
                                 counter.fetch_add(1));
  std::error_code ec;
  fs::remove_all(dir, ec);
  if (auto s = store->backend()->Checkpoint(dir); !s.ok()) return s;
  return dir;
}

// Writes the snapshot of a checkpoint to emit in chunks of about kChunk
// bytes, then removes the checkpoint. Nothing is written to disk: the
// bbolt file is laid out by a first pass over the data that keeps only its
// meta pages, which lead the file; a second pass emits the pages after
// them as they are made. total is called once, before the first chunk,
// with the bytes to come. A non-OK status from emit stops the writing, as
// stopped() returning true does during the first pass.
absl::Status StreamSnapshot(const std::string& checkpoint, const membership::MemberInfo& member,
                            const std::function<bool()>& stopped,
                            const std::function<void(uint64_t total)>& total,
                            const std::function<absl::Status(std::string chunk)>& emit) {
  absl::Status status;
  {
    storage::BackendOptions options;
    options.dir = checkpoint;
    options.read_only = true;
    auto backend = storage::Backend::Open(options);
    status = backend.status();
    if (status.ok()) {
      std::string meta;  // pages 0 and 1, from the first pass
      uint64_t size = 0;
      etcdfmt::BboltWriter layout([&](uint64_t id, std::string_view pages) {
        if (id < 2) meta.append(pages);
        return stopped() ? absl::CancelledError("snapshot stream ended") : absl::OkStatus();
      });
      status = WriteEtcdBuckets(backend->get(), member, &layout);
      size = layout.size();
      std::string chunk;
      if (status.ok()) {
        total(size);
        chunk = meta;
        etcdfmt::BboltWriter pages([&](uint64_t id, std::string_view bytes) {
          if (id < 2) {
            // The meta pages again, last: the same as the first pass's.
            return bytes == std::string_view(meta).substr(id * bytes.size(), bytes.size())
                       ? absl::OkStatus()
                       : absl::InternalError("the snapshot's layout changed between passes");
          }
          chunk.append(bytes);
          if (chunk.size() < kChunk) return absl::OkStatus();
          return emit(std::exchange(chunk, std::string()));
        });
        status = WriteEtcdBuckets(backend->get(), member, &pages);
      }
      if (status.ok() && !chunk.empty()) status = emit(std::move(chunk));
    }
  }
  std::error_code ec;
  fs::remove_all(checkpoint, ec);
  return status;
}

// Streams a snapshot, one write in flight. A producer thread makes the
// chunks (StreamSnapshot) into a bounded queue; writes take them from it.
// The checkpoint is taken in the constructor, while the server surely
// lives; the producer uses only the checkpoint, and OnDone waits for it.
class SnapshotReactor final : public grpc::ServerWriteReactor<etcdserverpb::SnapshotResponse> {
 public:
  SnapshotReactor(mvcc::KvStore* store, const membership::MemberInfo& member)
      : store_(store),
        // etcd 3.6's: the data's storage version, once the cluster has a
        // version (each message carries it).
        storage_version_(member.StorageVersion(kEtcdClusterVersion, kEtcdStorageVersion)),
        start_(std::chrono::steady_clock::now()) {
    auto checkpoint = Checkpoint(store);
    if (!checkpoint.ok()) {
      // Through FinishOnce: a cancel may already be on its way to OnCancel.
      mu_.Lock();
      FinishOnceAndUnlock(grpc::Status(grpc::INTERNAL, std::string(checkpoint.status().message())));
      return;
    }
    producer_ = std::thread([this, dir = *std::move(checkpoint), member] {
      Sha256 sha;
      absl::Status s = StreamSnapshot(
          dir, member,
          [this] {
            util::MutexLock lock(&mu_);
            return stop_;
          },
          [this](uint64_t total) {
            util::MutexLock lock(&mu_);
            remaining_ = total;
          },
          [this, &sha](std::string chunk) {
            sha.Update(chunk);
            return Push(std::move(chunk));
          });
      mu_.Lock();
      produced_ = true;
      status_ = s;
      if (s.ok()) checksum_ = sha.Final();
      SendNextAndUnlock();
    });
  }

  void OnWriteDone(bool ok) override {
    mu_.Lock();
    in_flight_ = false;
    if (!ok) {
      stop_ = true;
      FinishOnceAndUnlock(grpc::Status(grpc::UNAVAILABLE, "snapshot stream broken"));
      return;
    }
    SendNextAndUnlock();
  }

  void OnCancel() override {
    mu_.Lock();
    stop_ = true;
    // With a write in flight, its OnWriteDone(false) finishes.
    if (in_flight_) {
      mu_.Unlock();
      return;
    }
    FinishOnceAndUnlock(grpc::Status(grpc::CANCELLED, "snapshot cancelled"));
  }

  void OnDone() override {
    {
      util::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (producer_.joinable()) producer_.join();
    store_->RecordSnapshot(absl::FromChrono(std::chrono::steady_clock::now() - start_));
    delete this;
  }

 private:
  static constexpr size_t kQueuedChunks = 64;  // 2 MiB ahead of the client

  // Queues a chunk, waiting for room; Cancelled once the call has ended.
  absl::Status Push(std::string chunk) ABSL_LOCKS_EXCLUDED(mu_) {
    mu_.Lock();
    auto room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stop_ || queue_.size() < kQueuedChunks;
    };
    mu_.Await(absl::Condition(&room));
    if (stop_) {
      mu_.Unlock();
      return absl::CancelledError("snapshot stream ended");
    }
    queue_.push_back(std::move(chunk));
    SendNextAndUnlock();
    return absl::OkStatus();
  }

  // Starts the next write or finishes the call, if nothing is in flight:
  // data chunks carrying the bytes still to come, then, as etcd, the
  // SHA-256 alone in the last message. Releases mu_ (before calling into
  // gRPC). REQUIRES: mu_ held.
  void SendNextAndUnlock() ABSL_UNLOCK_FUNCTION(mu_) {
    if (in_flight_ || finished_) {
      mu_.Unlock();
      return;
    }
    if (!queue_.empty()) {
      response_.Clear();
      remaining_ -= queue_.front().size();
      response_.set_blob(std::move(queue_.front()));
      response_.set_remaining_bytes(remaining_);
      response_.set_version(storage_version_);
      queue_.pop_front();  // room for Push
    } else if (!produced_) {
      mu_.Unlock();
      return;
    } else if (!status_.ok()) {
      FinishOnceAndUnlock(grpc::Status(grpc::INTERNAL, std::string(status_.message())));
      return;
    } else if (!checksum_sent_) {
      checksum_sent_ = true;
      response_.Clear();
      response_.set_blob(checksum_);
      response_.set_version(storage_version_);
    } else {
      FinishOnceAndUnlock(grpc::Status::OK);
      return;
    }
    in_flight_ = true;
    mu_.Unlock();
    // response_ is not touched again until OnWriteDone clears in_flight_.
    ClientTraffic::Sent(response_.ByteSizeLong());
    StartWrite(&response_);
  }

  // Finishes the call once. Releases mu_ (before calling into gRPC).
  // REQUIRES: mu_ held.
  void FinishOnceAndUnlock(const grpc::Status& status) ABSL_UNLOCK_FUNCTION(mu_) {
    if (finished_) {
      mu_.Unlock();
      return;
    }
    finished_ = true;
    mu_.Unlock();
    Finish(status);
  }

  // etcd_disk_backend_snapshot_duration_seconds: from the checkpoint to
  // the stream's end. The store outlives the call.
  mvcc::KvStore* const store_;
  const std::string storage_version_;
  const std::chrono::steady_clock::time_point start_;
  std::thread producer_;
  // A leaf; released before every call into gRPC. Push waits on a
  // condition over it for room in queue_ (or stop_).
  util::Mutex mu_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t remaining_ ABSL_GUARDED_BY(mu_) = 0;  // bytes not yet handed to a write
  // The producer is done: status_, checksum_ set.
  bool produced_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::string checksum_ ABSL_GUARDED_BY(mu_);
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool checksum_sent_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // The call ended or failed: the producer stops.
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The message of the write in flight: written under mu_, read by gRPC
  // while in_flight_.
  etcdserverpb::SnapshotResponse response_;
};

}  // namespace

grpc::ServerWriteReactor<etcdserverpb::SnapshotResponse>* NewSnapshotReactor(
    mvcc::KvStore* store, const membership::MemberInfo& member) {
  return new SnapshotReactor(store, member);
}

void RemoveSnapshotLeftovers(const std::string& backend_dir) {
  const fs::path dir = fs::path(backend_dir).parent_path();
  const std::string prefix = fs::path(backend_dir).filename().string() + kTempInfix;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (absl::StartsWith(entry.path().filename().string(), prefix)) fs::remove_all(entry.path(), ec);
  }
}

}  // namespace capstan::server
