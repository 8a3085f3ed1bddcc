#include "server/snapshot.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mvcc/crc32c.h"
#include "mvcc/meta_keys.h"
#include "mvcc/revision_key.h"
#include "openssl/evp.h"
#include "server/data_dir.h"
#include "server/logging.h"
#include "server/migrate.h"
#include "server/server.h"
#include "storage/backend.h"
#include "storage/bbolt_reader.h"
#include "storage/bbolt_writer.h"

namespace capstan::server {
namespace fs = std::filesystem;

namespace {

constexpr size_t kChunk = 32 << 10;
// etcd clients expect a snapshot to end with the SHA-256 of what precedes it.
constexpr size_t kChecksumSize = 32;
// Beside the backend directory: <backend>.snapshot-<pid>-<n> (a checkpoint)
// and <backend>.snapshot-<pid>-<n>.db (the bbolt file being streamed).
constexpr char kTempInfix[] = ".snapshot-";
// The meta pages' transaction ids (any will do: a snapshot has no history).
constexpr uint64_t kSnapshotTxid = 2;

// The member as etcd keeps it in its "members" bucket: Go's JSON of
// membership.Member (id, peerURLs, then name and clientURLs unless empty).
std::string MemberJson(const MemberInfo& member) {
  auto list = [](const std::vector<std::string>& urls) {
    std::vector<std::string> quoted;
    for (const auto& u : urls) quoted.push_back(absl::StrCat("\"", JsonEscape(u), "\""));
    return absl::StrCat("[", absl::StrJoin(quoted, ","), "]");
  };
  std::string json = absl::StrCat("{\"id\":", member.member_id, ",\"peerURLs\":", list(member.peer_urls));
  if (!member.name.empty()) absl::StrAppend(&json, ",\"name\":\"", JsonEscape(member.name), "\"");
  if (!member.client_urls.empty()) absl::StrAppend(&json, ",\"clientURLs\":", list(member.client_urls));
  return json + "}";
}

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
absl::Status WriteEtcdBbolt(storage::Backend* backend, const MemberInfo& member,
                            const std::string& path) {
  auto out = storage::BboltWriter::Create(path);
  if (!out.ok()) return out.status();
  storage::BboltWriter& w = **out;
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
  if (auto s = w.BeginBucket("members"); !s.ok()) return s;
  if (auto s = w.Put(absl::StrCat(absl::Hex(member.member_id)), MemberJson(member)); !s.ok()) {
    return s;
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
  // Streamed, then deleted: a sync would only compete with the commits'.
  return w.Finish(kSnapshotTxid, /*sync=*/false);
}

// Produces the snapshot byte stream: a bbolt file written from a checkpoint
// of the store, then read back chunk by chunk, hashed on the way.
class SnapshotWriter {
 public:
  // A consistent copy of store's backend: a RocksDB checkpoint (hard links),
  // quick whatever the store's size. The caller passes it to Create.
  static absl::StatusOr<std::string> Checkpoint(mvcc::KvStore* store) {
    static std::atomic<int> counter{0};
    std::string dir = absl::StrCat(store->backend()->options().dir, kTempInfix, getpid(), "-",
                                   counter.fetch_add(1));
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (auto s = store->backend()->Checkpoint(dir); !s.ok()) return s;
    return dir;
  }

  // Writes the bbolt file of a checkpoint, which it then removes, and opens
  // it for streaming. Touches neither the store nor the server.
  static absl::StatusOr<std::unique_ptr<SnapshotWriter>> Create(const std::string& checkpoint,
                                                                const MemberInfo& member) {
    auto w = std::unique_ptr<SnapshotWriter>(new SnapshotWriter(checkpoint + ".db"));
    absl::Status written;
    {
      storage::BackendOptions options;
      options.dir = checkpoint;
      options.read_only = true;
      auto backend = storage::Backend::Open(options);
      written = backend.ok() ? WriteEtcdBbolt(backend->get(), member, w->file_) : backend.status();
    }
    std::error_code ec;
    fs::remove_all(checkpoint, ec);
    if (!written.ok()) return written;
    w->in_.open(w->file_, std::ios::binary);
    if (!w->in_) return absl::InternalError(absl::StrCat("cannot read ", w->file_));
    w->total_ = fs::file_size(w->file_, ec);
    return w;
  }

  ~SnapshotWriter() {
    std::error_code ec;
    fs::remove(file_, ec);
  }

  // Bytes of data (without the trailing checksum).
  uint64_t total() const { return total_; }
  uint64_t sent() const { return sent_; }

  // The next chunk (at most kChunk bytes); empty when done.
  absl::StatusOr<std::string> Next() {
    std::string out(kChunk, '\0');
    in_.read(out.data(), static_cast<std::streamsize>(out.size()));
    out.resize(static_cast<size_t>(in_.gcount()));
    if (out.empty()) {
      if (sent_ != total_) return absl::DataLossError(absl::StrCat(file_, " ended early"));
      if (checksum_.empty()) checksum_ = sha_.Final();
      return out;
    }
    sha_.Update(out);
    sent_ += out.size();
    return out;
  }

  // The SHA-256 of all data, once Next() has returned an empty chunk.
  const std::string& checksum() const { return checksum_; }

 private:
  explicit SnapshotWriter(std::string file) : file_(std::move(file)) {}

  const std::string file_;
  std::ifstream in_;
  Sha256 sha_;
  std::string checksum_;
  uint64_t total_ = 0;
  uint64_t sent_ = 0;
};

class SnapshotReactor final : public grpc::ServerWriteReactor<etcdserverpb::SnapshotResponse> {
 public:
  // The checkpoint is taken here, while the server surely lives. Writing the
  // bbolt file from it takes as long as reading the whole store: that runs
  // on a thread of its own, not on the gRPC thread that started the call,
  // and uses only the checkpoint. The reactor outlives that thread's last
  // use of it, since only Finish (called on it or after it) leads to OnDone.
  SnapshotReactor(mvcc::KvStore* store, const MemberInfo& member) {
    auto checkpoint = SnapshotWriter::Checkpoint(store);
    if (!checkpoint.ok()) {
      Finish(grpc::Status(grpc::INTERNAL, std::string(checkpoint.status().message())));
      return;
    }
    std::thread([this, dir = *std::move(checkpoint), member] {
      auto w = SnapshotWriter::Create(dir, member);
      if (!w.ok()) {
        Finish(grpc::Status(grpc::INTERNAL, std::string(w.status().message())));
        return;
      }
      source_ = std::move(*w);
      WriteNext();
    }).detach();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::UNAVAILABLE, "snapshot stream broken"));
      return;
    }
    WriteNext();
  }

  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    auto chunk = source_->Next();
    if (!chunk.ok()) {
      Finish(grpc::Status(grpc::INTERNAL, std::string(chunk.status().message())));
      return;
    }
    if (chunk->empty()) {
      if (!checksum_sent_) {
        checksum_sent_ = true;
        response_.Clear();
        response_.set_blob(source_->checksum());
        StartWrite(&response_);
        return;
      }
      Finish(grpc::Status::OK);
      return;
    }
    // As etcd: data chunks carrying the bytes still to come, then the
    // SHA-256 alone in the last message; no header.
    response_.Clear();
    response_.set_blob(std::move(*chunk));
    response_.set_remaining_bytes(source_->total() - source_->sent());
    StartWrite(&response_);
  }

  std::unique_ptr<SnapshotWriter> source_;
  bool checksum_sent_ = false;
  etcdserverpb::SnapshotResponse response_;
};

}  // namespace

grpc::ServerWriteReactor<etcdserverpb::SnapshotResponse>* NewSnapshotReactor(
    mvcc::KvStore* store, const MemberInfo& member) {
  return new SnapshotReactor(store, member);
}

absl::Status SaveSnapshot(mvcc::KvStore* store, const MemberInfo& member, const std::string& path) {
  auto checkpoint = SnapshotWriter::Checkpoint(store);
  if (!checkpoint.ok()) return checkpoint.status();
  auto w = SnapshotWriter::Create(*checkpoint, member);
  if (!w.ok()) return w.status();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (;;) {
    auto chunk = (*w)->Next();
    if (!chunk.ok()) return chunk.status();
    if (chunk->empty()) break;
    out.write(chunk->data(), static_cast<std::streamsize>(chunk->size()));
  }
  out.write((*w)->checksum().data(), static_cast<std::streamsize>(kChecksumSize));
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

void RemoveSnapshotLeftovers(const std::string& backend_dir) {
  const fs::path dir = fs::path(backend_dir).parent_path();
  const std::string prefix = fs::path(backend_dir).filename().string() + kTempInfix;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (absl::StartsWith(entry.path().filename().string(), prefix)) fs::remove_all(entry.path(), ec);
  }
}

absl::Status RestoreSnapshot(const std::string& file, const std::string& data_dir) {
  std::error_code ec;
  if (fs::exists(data_dir, ec)) {
    return absl::AlreadyExistsError(absl::StrCat("data-dir \"", data_dir, "\" exists"));
  }
  // etcd's format, whoever wrote it: what `capstan migrate` reads. The
  // member's ids are not carried: the restored member derives its own.
  MigrateOptions options;
  options.from = file;
  options.data_dir = data_dir;
  auto report = MigrateFromEtcd(options);
  if (!report.ok()) return report.status();
  if (!report->snapshot) {
    fs::remove_all(data_dir, ec);
    return absl::InvalidArgumentError(
        absl::StrCat(file, " has no SHA-256 trailer, so it is not a snapshot (a db file is "
                           "migrated with `capstan migrate --from-etcd`)"));
  }
  return absl::OkStatus();
}

// As `etcdctl snapshot status`: bbolt's check, then over every bucket in name
// order the CRC-32C of its name and of each key and value, the number of
// records, and the main revision of the last key of "key"; the size is the
// bbolt file's pages, without the checksum.
absl::StatusOr<SnapshotStatus> ReadSnapshotStatus(const std::string& file) {
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot open ", file, ": ", ec.message()));
  std::optional<uint64_t> length;
  if (size % 512 == kChecksumSize) length = size - kChecksumSize;  // etcdctl's rule
  auto reader = storage::BboltReader::Open(file, length);
  if (!reader.ok()) return reader.status();
  if (auto s = (*reader)->Check(); !s.ok()) return s;
  auto buckets = (*reader)->Buckets();
  if (!buckets.ok()) return buckets.status();
  SnapshotStatus st;
  st.total_size = static_cast<int64_t>((*reader)->meta().high_water * (*reader)->meta().page_size);
  uint32_t crc = 0;
  for (const std::string& name : *buckets) {
    crc = mvcc::Crc32cExtend(crc, name);
    const bool key_bucket = name == "key";
    auto s = (*reader)->ForEach({name}, [&](std::string_view k, std::string_view v, bool) {
      crc = mvcc::Crc32cExtend(mvcc::Crc32cExtend(crc, k), v);
      if (key_bucket && k.size() >= 8) st.revision = static_cast<int64_t>(mvcc::ReadBigEndian64(k.data()));
      ++st.total_keys;
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
  }
  st.hash = crc;
  return st;
}

}  // namespace capstan::server
