#include "server/snapshot.h"

#include <atomic>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "openssl/evp.h"
#include "mvcc/revision_key.h"
#include "server/data_dir.h"
#include "storage/backend.h"

namespace capstan::server {
namespace fs = std::filesystem;

namespace {

constexpr char kMagic[] = "capstan-snapshot 1\n";
constexpr size_t kChunk = 32 << 10;
// etcd clients expect a snapshot to end with the SHA-256 of what precedes it.
constexpr size_t kChecksumSize = 32;

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

// Produces the snapshot byte stream of a checkpoint directory, piece by
// piece, hashing it on the way.
class SnapshotWriter {
 public:
  static absl::StatusOr<std::unique_ptr<SnapshotWriter>> Create(mvcc::KvStore* store) {
    static std::atomic<int> counter{0};
    std::string dir = absl::StrCat(store->backend()->options().dir, ".snapshot-", getpid(), "-",
                                   counter.fetch_add(1));
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (auto s = store->backend()->Checkpoint(dir); !s.ok()) return s;
    auto w = std::unique_ptr<SnapshotWriter>(new SnapshotWriter(dir));
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_regular_file()) w->files_.push_back(entry.path());
    }
    std::sort(w->files_.begin(), w->files_.end());
    uint64_t content = sizeof(kMagic) - 1 + 1;
    for (const auto& f : w->files_) content += f.filename().string().size() + 1 + 8 + fs::file_size(f);
    // etcdctl takes a snapshot whose size is 32 past a multiple of 512 (a
    // bbolt file plus its checksum) as carrying a checksum: pad to that.
    w->padding_ = (512 - content % 512) % 512;
    w->total_ = content + w->padding_;
    w->pending_ = kMagic;
    return w;
  }

  ~SnapshotWriter() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Bytes of data (without the trailing checksum).
  uint64_t total() const { return total_; }
  uint64_t sent() const { return sent_; }

  // The next chunk (at most kChunk bytes); empty when done.
  absl::StatusOr<std::string> Next() {
    std::string out;
    while (out.size() < kChunk && !done_) {
      if (!pending_.empty()) {
        size_t n = std::min(pending_.size(), kChunk - out.size());
        out.append(pending_, 0, n);
        pending_.erase(0, n);
        continue;
      }
      if (in_.is_open()) {
        std::string buf(kChunk - out.size(), '\0');
        in_.read(buf.data(), static_cast<std::streamsize>(buf.size()));
        buf.resize(static_cast<size_t>(in_.gcount()));
        if (buf.empty()) {
          in_.close();
        } else {
          sha_.Update(buf);
          out += buf;
        }
        continue;
      }
      if (next_file_ < files_.size()) {
        const fs::path& f = files_[next_file_++];
        std::string header = f.filename().string();
        header.push_back('\0');
        mvcc::AppendBigEndian64(fs::file_size(f), &header);
        sha_.Update(header);
        pending_ = header;
        in_.open(f, std::ios::binary);
        if (!in_) return absl::InternalError(absl::StrCat("cannot read ", f.string()));
        continue;
      }
      if (!trailer_) {
        trailer_ = true;
        const std::string tail(1 + padding_, '\0');
        sha_.Update(tail);
        pending_ = tail;
        continue;
      }
      done_ = true;
      checksum_ = sha_.Final();
    }
    sent_ += out.size();
    return out;
  }

  // The SHA-256 of all data, once Next() has returned an empty chunk.
  const std::string& checksum() const { return checksum_; }

 private:
  explicit SnapshotWriter(std::string dir) : dir_(std::move(dir)) { sha_.Update(kMagic); }

  const std::string dir_;
  std::vector<fs::path> files_;
  size_t next_file_ = 0;
  std::ifstream in_;
  std::string pending_;
  Sha256 sha_;
  std::string checksum_;
  bool trailer_ = false;
  bool done_ = false;
  uint64_t padding_ = 0;
  uint64_t total_ = 0;
  uint64_t sent_ = 0;
};

class SnapshotReactor final : public grpc::ServerWriteReactor<etcdserverpb::SnapshotResponse> {
 public:
  explicit SnapshotReactor(mvcc::KvStore* store) {
    auto w = SnapshotWriter::Create(store);
    if (!w.ok()) {
      Finish(grpc::Status(grpc::INTERNAL, std::string(w.status().message())));
      return;
    }
    source_ = std::move(*w);
    WriteNext();
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

absl::Status Corrupt(const std::string& file, const std::string& what) {
  return absl::DataLossError(absl::StrCat("snapshot ", file, " is not a Capstan snapshot: ", what));
}

// Unpacks a snapshot into dir (a backend directory).
absl::Status Unpack(const std::string& file, const std::string& dir) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", file));
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string magic = kMagic;
  if (data.size() < magic.size() + 1 + kChecksumSize || data.compare(0, magic.size(), magic) != 0) {
    return Corrupt(file, "bad header");
  }
  const size_t end = data.size() - kChecksumSize;
  Sha256 sha;
  sha.Update(std::string_view(data.data(), end));
  if (sha.Final() != data.substr(end)) return Corrupt(file, "sha256 checksum mismatch");
  fs::create_directories(dir);
  size_t pos = magic.size();
  while (pos < end) {
    size_t nul = data.find('\0', pos);
    if (nul == std::string::npos || nul >= end) return Corrupt(file, "truncated");
    std::string name = data.substr(pos, nul - pos);
    pos = nul + 1;
    if (name.empty()) break;
    if (name.find('/') != std::string::npos || name == "." || name == "..") {
      return Corrupt(file, "bad file name");
    }
    if (pos + 8 > end) return Corrupt(file, "truncated");
    const uint64_t size = mvcc::ReadBigEndian64(data.data() + pos);
    pos += 8;
    if (size > end - pos) return Corrupt(file, "truncated");
    std::ofstream out(fs::path(dir) / name, std::ios::binary);
    out.write(data.data() + pos, static_cast<std::streamsize>(size));
    if (!out) return absl::InternalError(absl::StrCat("cannot write into ", dir));
    pos += size;
  }
  return absl::OkStatus();
}

}  // namespace

grpc::ServerWriteReactor<etcdserverpb::SnapshotResponse>* NewSnapshotReactor(
    mvcc::KvStore* store) {
  return new SnapshotReactor(store);
}

absl::Status SaveSnapshot(mvcc::KvStore* store, const std::string& path) {
  auto w = SnapshotWriter::Create(store);
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

absl::Status RestoreSnapshot(const std::string& file, const std::string& data_dir) {
  std::error_code ec;
  if (fs::exists(data_dir, ec)) {
    return absl::AlreadyExistsError(absl::StrCat("data-dir \"", data_dir, "\" exists"));
  }
  if (auto s = PrepareDataDir(data_dir); !s.ok()) return s;
  if (auto s = Unpack(file, BackendDir(data_dir)); !s.ok()) {
    fs::remove_all(data_dir, ec);
    return s;
  }
  // A restored member starts a new cluster: forget the old identity.
  storage::BackendOptions options;
  options.dir = BackendDir(data_dir);
  auto backend = storage::Backend::Open(options);
  if (!backend.ok()) return backend.status();
  storage::WriteBatch batch;
  for (const char* key : {"capstan/clusterID", "capstan/memberID", "capstan/raftTerm"}) {
    batch.Delete(storage::Cf::kMeta, key);
  }
  return (*backend)->Write(&batch);
}

absl::StatusOr<SnapshotStatus> ReadSnapshotStatus(const std::string& file) {
  std::error_code ec;
  const std::string tmp = absl::StrCat(fs::temp_directory_path().string(), "/capstan-snapstatus-",
                                       getpid());
  fs::remove_all(tmp, ec);
  if (auto s = Unpack(file, tmp); !s.ok()) return s;
  SnapshotStatus st;
  st.total_size = static_cast<int64_t>(fs::file_size(file, ec));
  {
    storage::BackendOptions options;
    options.dir = tmp;
    auto backend = storage::Backend::Open(options);
    if (!backend.ok()) return backend.status();
    auto store = mvcc::KvStore::Open(mvcc::KvStoreOptions(), std::move(*backend));
    if (!store.ok()) return store.status();
    auto hash = (*store)->Hash();
    if (!hash.ok()) return hash.status();
    st.hash = *hash;
    st.revision = (*store)->Rev();
    st.total_keys = static_cast<int64_t>((*store)->GetStats().index_keys);
  }
  fs::remove_all(tmp, ec);
  return st;
}

}  // namespace capstan::server
