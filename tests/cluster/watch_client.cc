#include "cluster/watch_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cluster/cluster_fixture.h"
#include "cluster/history.h"
#include "grpcpp/client_context.h"

namespace capstan::testing::cluster {
namespace {

using etcdserverpb::WatchRequest;
using etcdserverpb::WatchResponse;

// A stream on which nothing arrives for this long (progress requests going
// out every kProgressInterval) is given up.
constexpr int64_t kStallNs = 3'000'000'000;
constexpr absl::Duration kProgressInterval = absl::Milliseconds(200);
// The pause after a stream that received nothing.
constexpr absl::Duration kRetryPause = absl::Milliseconds(200);

}  // namespace

// One Watch stream. The reading thread creates it, reads from it and
// finishes it; the watchdog writes progress requests through `writer` while
// it is set, and may cancel `ctx` at any time.
struct WatchClient::Stream {
  explicit Stream(std::string e) : endpoint(std::move(e)) {}

  const std::string endpoint;
  grpc::ClientContext ctx;
  // Created after the stream is published, so that a stall also cancels a
  // connection attempt; used by the reading thread only.
  std::unique_ptr<grpc::ClientReaderWriter<WatchRequest, WatchResponse>> rw;
  // Serializes writes; the reading thread clears `writer` before Finish.
  util::Mutex write_mu;
  grpc::ClientReaderWriter<WatchRequest, WatchResponse>* writer ABSL_GUARDED_BY(write_mu) =
      nullptr;
};

WatchClient::WatchClient(int id, std::vector<std::string> endpoints, int first,
                         std::string prefix, int64_t start_revision)
    : id_(id),
      endpoints_(std::move(endpoints)),
      first_(endpoints_.empty() ? 0 : first % static_cast<int>(endpoints_.size())),
      prefix_(std::move(prefix)),
      start_revision_(start_revision) {
  for (const std::string& e : endpoints_) {
    stubs_.push_back(etcdserverpb::Watch::NewStub(NewMemberChannel(e)));
  }
}

WatchClient::~WatchClient() { Stop(); }

void WatchClient::Start() {
  reader_ = std::thread([this] { Run(); });
  watchdog_ = std::thread([this] { Watchdog(); });
}

void WatchClient::Stop() {
  std::shared_ptr<Stream> stream;
  {
    util::MutexLock l(&mu_);
    stop_ = true;
    stream = current_;
  }
  if (stream != nullptr) stream->ctx.TryCancel();
  if (reader_.joinable()) reader_.join();
  if (watchdog_.joinable()) watchdog_.join();
}

std::vector<WatchRecord> WatchClient::Records() const {
  util::MutexLock l(&mu_);
  return records_;
}

int64_t WatchClient::last_revision() const {
  util::MutexLock l(&mu_);
  return last_revision_;
}

int64_t WatchClient::events() const {
  util::MutexLock l(&mu_);
  return events_;
}

int64_t WatchClient::progress() const {
  util::MutexLock l(&mu_);
  return progress_;
}

int64_t WatchClient::reconnects() const {
  util::MutexLock l(&mu_);
  return reconnects_;
}

bool WatchClient::failed() const {
  util::MutexLock l(&mu_);
  return failed_;
}

bool WatchClient::WaitUntil(int64_t revision, std::chrono::milliseconds timeout) const {
  util::MutexLock l(&mu_);
  const auto done = [this, revision]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return last_revision_ >= revision || failed_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&done), absl::FromChrono(timeout));
  return last_revision_ >= revision;
}

void WatchClient::Run() {
  int index = first_;
  std::string why;  // why the previous stream ended
  bool reconnect = false;
  while (true) {
    auto stream = std::make_shared<Stream>(endpoints_[index]);
    int64_t from = 0;
    {
      util::MutexLock l(&mu_);
      if (stop_) return;
      from = std::max(start_revision_, last_revision_ + 1);
      if (reconnect) {
        WatchRecord r;
        r.kind = WatchRecord::kReconnect;
        r.revision = from;
        r.endpoint = stream->endpoint;
        r.detail = why;
        r.at_ns = NowNs();
        records_.push_back(std::move(r));
        ++reconnects_;
      }
      current_ = stream;
      last_receive_ns_ = NowNs();
      stalled_ = false;
    }
    reconnect = true;

    // etcd's WithRequireLeader: the member ends the stream when it has no leader.
    stream->ctx.AddMetadata("hasleader", "true");
    stream->rw = stubs_[index]->Watch(&stream->ctx);
    WatchRequest create;
    auto* c = create.mutable_create_request();
    c->set_key(prefix_);
    c->set_range_end(PrefixEnd(prefix_));
    c->set_start_revision(from);
    c->set_prev_kv(true);
    c->set_progress_notify(true);
    {
      util::MutexLock w(&stream->write_mu);
      if (stream->rw->Write(create)) stream->writer = stream->rw.get();
    }
    bool received = false;
    bool fatal = false;
    why = Consume(stream.get(), &received, &fatal);
    if (fatal) return;
    index = (index + 1) % static_cast<int>(endpoints_.size());
    if (!received) {
      util::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), kRetryPause);
    }
  }
}

std::string WatchClient::Consume(Stream* stream, bool* received, bool* fatal) {
  std::string why;
  WatchResponse resp;
  while (stream->rw->Read(&resp)) {
    *received = true;
    why = Record(resp, stream->endpoint, fatal);
    if (!why.empty()) break;
  }
  bool stalled = false;
  {
    util::MutexLock l(&mu_);
    if (current_.get() == stream) current_.reset();
    stalled = stalled_;
  }
  if (!why.empty()) {
    // The stream is still open: end it, and read to its end as Finish requires.
    stream->ctx.TryCancel();
    while (stream->rw->Read(&resp)) {
    }
  }
  {
    util::MutexLock w(&stream->write_mu);
    stream->writer = nullptr;
  }
  const grpc::Status st = stream->rw->Finish();
  if (!why.empty()) return why;
  if (stalled) return absl::StrCat("stalled: nothing received for ", kStallNs / 1'000'000'000, " s");
  return absl::StrCat("stream ended: code ", st.error_code(), ": ", st.error_message());
}

std::string WatchClient::Record(const WatchResponse& resp, const std::string& endpoint,
                                bool* fatal) {
  const int64_t now = NowNs();
  std::vector<WatchRecord> got;
  std::string why;
  if (resp.compact_revision() != 0) {
    WatchRecord r;
    r.kind = WatchRecord::kError;
    r.revision = resp.compact_revision();
    r.endpoint = endpoint;
    r.detail = absl::StrCat("watch compacted at revision ", resp.compact_revision(), ": ",
                            resp.cancel_reason());
    r.at_ns = now;
    got.push_back(std::move(r));
    why = got.back().detail;
    *fatal = true;
  } else if (resp.canceled()) {
    why = absl::StrCat("canceled by the server: ", resp.cancel_reason());
  } else if (resp.created()) {
    // The watch exists; what it delivers follows.
  } else if (resp.events_size() == 0) {
    WatchRecord r;
    r.kind = WatchRecord::kProgress;
    r.revision = resp.header().revision();
    r.endpoint = endpoint;
    r.at_ns = now;
    got.push_back(std::move(r));
  } else {
    for (const mvccpb::Event& e : resp.events()) {
      WatchRecord r;
      r.kind = WatchRecord::kEvent;
      r.revision = e.kv().mod_revision();
      r.key = e.kv().key();
      r.is_delete = e.type() == mvccpb::Event::DELETE;
      if (!r.is_delete) r.value = e.kv().value();
      r.has_prev = e.has_prev_kv();
      if (r.has_prev) r.prev_value = e.prev_kv().value();
      r.endpoint = endpoint;
      r.at_ns = now;
      got.push_back(std::move(r));
    }
  }
  util::MutexLock l(&mu_);
  last_receive_ns_ = now;
  if (*fatal) failed_ = true;
  for (WatchRecord& r : got) {
    if (r.kind == WatchRecord::kEvent) {
      ++events_;
      last_revision_ = std::max(last_revision_, r.revision);
    } else if (r.kind == WatchRecord::kProgress) {
      ++progress_;
      last_revision_ = std::max(last_revision_, r.revision);
    }
    records_.push_back(std::move(r));
  }
  return why;
}

void WatchClient::Watchdog() {
  WatchRequest progress;
  progress.mutable_progress_request();
  while (true) {
    std::shared_ptr<Stream> stream;
    bool stall = false;
    {
      util::MutexLock l(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), kProgressInterval)) return;
      stream = current_;
      if (stream != nullptr && !stalled_ && NowNs() - last_receive_ns_ >= kStallNs) {
        stalled_ = true;
        stall = true;
      }
    }
    if (stream == nullptr) continue;
    if (stall) {
      stream->ctx.TryCancel();
      continue;
    }
    util::MutexLock w(&stream->write_mu);
    if (stream->writer != nullptr && !stream->writer->Write(progress)) stream->writer = nullptr;
  }
}

}  // namespace capstan::testing::cluster
