#include "server/peer/peer_sender.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "capstan/v1/peer.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "server/peer/peer_protocol.h"
#include "server/peer/peer_tls_handshake.h"
#include "server/peer/raft_stream.h"
#include "spdlog/spdlog.h"
#include "util/thread_name.h"

namespace capstan::server::peer {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

std::pair<std::string, bool> Target(const std::string& url) {
  if (absl::StartsWith(url, "https://")) return {url.substr(8), true};
  if (absl::StartsWith(url, "http://")) return {url.substr(7), false};
  // etcd's unix peer URLs: a socket named by the URL's host, relative to the
  // working directory.
  if (absl::StartsWith(url, "unix://")) return {"unix:" + url.substr(7), false};
  return {url, false};
}

std::string SplitHostPort(const std::string& target, int* port) {
  std::string host = target;
  const size_t colon = target.rfind(':');
  if (colon != std::string::npos && target.find(']', colon) == std::string::npos) {
    host = target.substr(0, colon);
    int p = 0;
    if (absl::SimpleAtoi(target.substr(colon + 1), &p)) *port = p;
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

grpc::ChannelArguments PeerChannelArguments() {
  grpc::ChannelArguments args;
  // Reconnect soon after a peer comes back (gRPC's default starts at 1s and
  // grows to 120s; etcd's stream readers retry every 100ms).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Despite its name, the least time one connection attempt gets to connect,
  // make its TLS handshake and receive the peer's HTTP/2 settings (gRPC's
  // "min connect timeout"; its deadline is the larger of this and the
  // current backoff). At 100 ms an https attempt on a busy machine timed out
  // ("Handshake timed out", "connection attempt timed out before receiving
  // SETTINGS frame") and the messages queued for it were dropped. etcd's
  // peer dialer allows 1 s plus the election timeout to connect and 10 s
  // more for the TLS handshake; 5 s lies between.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  // Notice a peer that vanished without closing the connection (etcd's
  // ConnReadTimeout is 5s).
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetInt(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, -1);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, -1);
  // One connection per peer and per URL: a member's channels never share
  // a subchannel, so one peer's stream cannot slow another's.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return args;
}

PeerSender::PeerSender(PeerSenderOptions options)
    : options_(std::move(options)), stop_fd_(eventfd(0, EFD_CLOEXEC)) {}

PeerSender::~PeerSender() {
  Stop();
  if (stop_fd_ >= 0) close(stop_fd_);
}

void PeerSender::Start() {
  {
    util::MutexLock l(&mu_);
    if (started_ || stopping_) return;
    started_ = true;
  }
  thread_ = NamedThread(absl::StrCat("peer-", IdText(options_.peer_id)), [this] { Run(); });
}

size_t PeerSender::EnqueueAll(std::vector<std::string>* messages) {
  if (messages->empty()) return 0;
  size_t bytes = 0;
  for (const std::string& m : *messages) bytes += m.size();
  RaftStreamSender* direct = nullptr;
  {
    util::MutexLock l(&mu_);
    if (stopping_) return 0;
    // A batch the sender's thread would split goes through its queue.
    if (stream_ != nullptr && !writing_ && queue_.empty() && left_.rest.empty() &&
        left_.failure.ok() && bytes <= options_.max_batch_bytes) {
      writing_ = true;
      direct = stream_;
    }
    if (direct == nullptr) return QueueLocked(messages);
  }
  WriteDirectly(direct, messages, bytes);
  return messages->size();
}

void PeerSender::WriteDirectly(RaftStreamSender* stream, std::vector<std::string>* messages,
                               size_t bytes) {
  // stream_ stays valid while this holds the writer token: the sender's
  // thread waits for the token before it ends the stream.
  std::string rest;
  const absl::Status s = stream->TryWrite(*messages, &rest);
  util::MutexLock l(&mu_);
  writing_ = false;
  if (!s.ok()) {
    // Nothing more is written into the broken stream; the thread ends it.
    stream_ = nullptr;
    left_.failure = s;
    sent_failures_.fetch_add(messages->size(), std::memory_order_relaxed);
  } else if (rest.empty()) {
    sent_bytes_.fetch_add(bytes, std::memory_order_relaxed);
  } else {
    left_.rest = std::move(rest);
    left_.rest_bytes = bytes;
    left_.rest_count = messages->size();
  }
}

size_t PeerSender::QueueLocked(std::vector<std::string>* messages) {
  size_t n = 0;
  if (active_since_ == absl::InfiniteFuture()) {
    // No stream: the newest messages replace the oldest.
    const size_t cap = std::max<size_t>(options_.disconnected_queue_capacity, 1);
    for (std::string& m : *messages) {
      if (queue_.size() >= cap) {
        queue_.pop_front();
        sent_failures_.fetch_add(1, std::memory_order_relaxed);
      }
      queue_.push_back(std::move(m));
      ++n;
    }
    return n;
  }
  for (std::string& m : *messages) {
    if (queue_.size() >= options_.queue_capacity) break;
    queue_.push_back(std::move(m));
    ++n;
  }
  sent_failures_.fetch_add(messages->size() - n, std::memory_order_relaxed);
  return n;
}

void PeerSender::Stop() {
  std::shared_ptr<grpc::ClientContext> context;
  bool join = false;
  {
    util::MutexLock l(&mu_);
    stopping_ = true;
    context = context_;
    join = started_ && !joined_;
    joined_ = true;
  }
  if (context) context->TryCancel();
  if (stop_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof one);  // ends a Raft stream's waits
  }
  if (join && thread_.joinable()) thread_.join();
}

std::shared_ptr<grpc::Channel> PeerSender::ChannelFor(size_t url_index) {
  {
    util::MutexLock l(&mu_);
    if (channels_.empty()) channels_.resize(options_.urls.size());
    if (channels_[url_index]) return channels_[url_index];
  }
  auto [target, tls] = Target(options_.urls[url_index]);
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  if (!tls) {
    credentials = grpc::InsecureChannelCredentials();
  } else if (options_.tls) {
    credentials = options_.tls;
  } else {
    credentials = grpc::SslCredentials(grpc::SslCredentialsOptions());
  }
  auto channel = grpc::CreateCustomChannel(target, credentials, PeerChannelArguments());
  util::MutexLock l(&mu_);
  if (!channels_[url_index]) channels_[url_index] = channel;
  return channels_[url_index];
}

std::shared_ptr<grpc::Channel> PeerSender::Channel() {
  size_t index;
  {
    util::MutexLock l(&mu_);
    index = url_index_;
  }
  return ChannelFor(index);
}

void PeerSender::Run() {
  absl::Duration backoff = options_.initial_backoff;
  bool was_active = false;
  while (true) {
    size_t index;
    {
      util::MutexLock l(&mu_);
      if (stopping_) return;
      index = url_index_;
    }
    bool accepted = false;
    absl::Status status;
    if (std::string refused = Probe(options_.urls[index]); !refused.empty()) {
      status = absl::UnavailableError(refused);
    } else {
      status = UsesRaftStream(options_.urls[index])
                   ? RunRaftStream(options_.urls[index], &accepted)
                   : RunStream(ChannelFor(index), &accepted);
    }
    size_t dropped;
    {
      util::MutexLock l(&mu_);
      if (stopping_) return;
      // What was queued for the failed stream is stale by the next attempt.
      dropped = queue_.size();
      queue_.clear();
      sent_failures_.fetch_add(dropped, std::memory_order_relaxed);
      url_index_ = (url_index_ + 1) % options_.urls.size();
    }
    if (accepted) {
      backoff = options_.initial_backoff;
      was_active = true;
    }
    if (was_active || !accepted) {
      // Log the change from working to failed once, as etcd logs "lost
      // TCP streaming connection"; refusals always.
      const bool refused = status.code() == absl::StatusCode::kFailedPrecondition ||
                           status.code() == absl::StatusCode::kPermissionDenied ||
                           status.code() == absl::StatusCode::kInvalidArgument;
      if (refused) {
        SPDLOG_ERROR("request sent was ignored by peer {} (local member {}): {}",
                     IdText(options_.peer_id), IdText(options_.local_id), std::string(status.message()));
      } else if (was_active) {
        SPDLOG_WARN("lost streaming connection with remote peer {} (local member {}): {}",
                    IdText(options_.peer_id), IdText(options_.local_id), std::string(status.message()));
      }
      was_active = false;
    }
    if (dropped > 0) {
      SPDLOG_DEBUG("dropped {} message(s) to unreachable peer {}", dropped, IdText(options_.peer_id));
    }
    if (options_.on_error) options_.on_error(options_.peer_id, status);
    if (options_.on_unreachable) options_.on_unreachable(options_.peer_id);
    {
      util::MutexLock l(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), backoff)) return;
    }
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::Time PeerSender::ActiveSince() const {
  util::MutexLock l(&mu_);
  return active_since_;
}

std::string PeerSender::Probe(const std::string& url) {
  auto [target, tls] = Target(url);
  if (!tls || !options_.probe_tls) return "";
  int port = 443;
  const std::string host = SplitHostPort(target, &port);
  const std::string error = ProbePeer(options_.probe_tls.get(), host, port, absl::Seconds(1));
  const absl::Time now = absl::Now();
  if (error.empty()) {
    unhealthy_since_ = absl::InfiniteFuture();
    return "";
  }
  // etcd's prober reports a peer unhealthy every 5 s, starting 5 s after
  // its probes began to fail.
  if (unhealthy_since_ == absl::InfiniteFuture()) unhealthy_since_ = now;
  if (now - unhealthy_since_ >= absl::Seconds(5) && now - unhealthy_logged_ >= absl::Seconds(5)) {
    unhealthy_logged_ = now;
    SPDLOG_WARN(
        "prober detected unhealthy status (round-tripper-name ROUND_TRIPPER_RAFT_MESSAGE, "
        "remote-peer-id {}, rtt 0s): {}",
        IdText(options_.peer_id), error);
  }
  return error;
}

absl::Status PeerSender::RunStream(const std::shared_ptr<grpc::Channel>& channel, bool* accepted) {
  auto context = std::make_shared<grpc::ClientContext>();
  context->AddMetadata(kClusterIdKey, IdText(options_.cluster_id));
  context->AddMetadata(kFromKey, IdText(options_.local_id));
  context->AddMetadata(kToKey, IdText(options_.peer_id));
  {
    util::MutexLock l(&mu_);
    if (stopping_) return absl::OkStatus();
    context_ = context;
  }
  auto stub = capstan::v1::Peer::NewStub(channel);
  capstan::v1::RaftStreamEnd end;
  auto writer = stub->Raft(context.get(), &end);
  // The peer sends its initial metadata, with its cluster ID, only when it
  // accepts the stream; a refusal ends the call without it.
  writer->WaitForInitialMetadata();
  const auto& initial = context->GetServerInitialMetadata();
  *accepted = initial.find(kClusterIdKey) != initial.end();
  if (*accepted) {
    util::MutexLock l(&mu_);
    active_since_ = absl::Now();
  }
  absl::Status failure;
  if (*accepted) {
    capstan::v1::RaftBatch batch;
    std::vector<std::string> messages;
    size_t bytes = 0;
    while (TakeBatch(absl::InfiniteDuration(), &messages, &bytes)) {
      batch.Clear();
      for (std::string& m : messages) batch.add_messages(std::move(m));
      // MsgSnap (type 7) goes in the batch like any message for now; the
      // streamed snapshot will have an RPC of its own (peer.proto).
      if (!writer->Write(batch)) {
        sent_failures_.fetch_add(static_cast<uint64_t>(batch.messages_size()),
                                 std::memory_order_relaxed);
        break;
      }
      sent_bytes_.fetch_add(bytes, std::memory_order_relaxed);
    }
  }
  const grpc::Status finish = writer->Finish();
  {
    util::MutexLock l(&mu_);
    context_.reset();
    active_since_ = absl::InfiniteFuture();
    if (stopping_) return absl::OkStatus();
  }
  if (finish.ok()) return absl::UnavailableError("the peer ended the stream");
  return FromGrpc(finish);
}

}  // namespace capstan::server::peer

namespace capstan::server::peer {

bool PeerSender::TakeBatch(absl::Duration wait, std::vector<std::string>* batch, size_t* bytes) {
  batch->clear();
  *bytes = 0;
  util::MutexLock l(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
  mu_.AwaitWithTimeout(absl::Condition(&ready), wait);
  if (stopping_) return false;
  MoveBatchLocked(batch, bytes);
  return true;
}

void PeerSender::MoveBatchLocked(std::vector<std::string>* batch, size_t* bytes) {
  while (!queue_.empty() &&
         (batch->empty() || *bytes + queue_.front().size() <= options_.max_batch_bytes)) {
    *bytes += queue_.front().size();
    batch->push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
}

bool PeerSender::TakeRaftBatch(std::vector<std::string>* batch, size_t* bytes, Leftover* left) {
  batch->clear();
  *bytes = 0;
  util::MutexLock l(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return stopping_ ||
           (!writing_ && (!queue_.empty() || !left_.rest.empty() || !left_.failure.ok()));
  };
  // Nothing to send for a while: an empty batch, a link heartbeat, keeps
  // the stream (and has Write look at what the peer sent), direct writes or
  // not.
  mu_.AwaitWithTimeout(absl::Condition(&ready), kRaftStreamHeartbeat);
  // A direct write under way never waits on the network.
  auto writable = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !writing_; };
  mu_.Await(absl::Condition(&writable));
  if (stopping_) return false;
  writing_ = true;
  *left = std::move(left_);
  left_ = Leftover();
  MoveBatchLocked(batch, bytes);
  return true;
}

void PeerSender::ReleaseWriter(bool end_stream) {
  util::MutexLock l(&mu_);
  writing_ = false;
  if (end_stream) stream_ = nullptr;
}

bool PeerSender::UsesRaftStream(const std::string& url) const {
  return absl::StartsWith(url, "http://") ||
         (absl::StartsWith(url, "https://") && options_.probe_tls != nullptr);
}

absl::Status PeerSender::RunRaftStream(const std::string& url, bool* accepted) {
  auto [target, tls] = Target(url);
  RaftStreamSender::Target to;
  to.port = tls ? 443 : 80;
  to.host = SplitHostPort(target, &to.port);
  to.tls = tls ? options_.probe_tls.get() : nullptr;
  auto dialed = RaftStreamSender::Dial(to, kStreamOpenTimeout, stop_fd_);
  if (!dialed.ok()) return dialed.status();
  // Stop's eventfd ends every wait of the stream from here on.
  std::unique_ptr<RaftStreamSender> stream = *std::move(dialed);
  absl::Status failure =
      stream->Start(to, options_.cluster_id, options_.local_id, options_.peer_id, kStreamOpenTimeout);
  if (failure.ok()) {
    *accepted = true;
    {
      util::MutexLock l(&mu_);
      active_since_ = absl::Now();
      stream_ = stream.get();  // open to direct writes
    }
    std::vector<std::string> batch;
    size_t bytes = 0;
    Leftover left;
    while (TakeRaftBatch(&batch, &bytes, &left)) {
      failure = left.failure;
      if (failure.ok() && !left.rest.empty()) {
        failure = stream->WriteRest(left.rest);
        if (failure.ok()) {
          sent_bytes_.fetch_add(left.rest_bytes, std::memory_order_relaxed);
        } else {
          sent_failures_.fetch_add(left.rest_count, std::memory_order_relaxed);
        }
      }
      // An empty batch is a link heartbeat, unless the rest of a direct
      // write just went.
      if (failure.ok() && (!batch.empty() || left.rest.empty())) {
        failure = stream->Write(batch);
        if (failure.ok()) sent_bytes_.fetch_add(bytes, std::memory_order_relaxed);
      }
      if (!failure.ok()) {
        // The batch did not go (or went in part): nothing more may be
        // written after it, so the stream is withdrawn from direct writes
        // as the token is given back.
        sent_failures_.fetch_add(batch.size(), std::memory_order_relaxed);
        ReleaseWriter(/*end_stream=*/true);
        break;
      }
      ReleaseWriter(/*end_stream=*/false);
    }
  }
  util::MutexLock l(&mu_);
  // No direct write may start on the stream, nor be under way, when it ends.
  stream_ = nullptr;
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !writing_; };
  mu_.Await(absl::Condition(&idle));
  sent_failures_.fetch_add(left_.rest_count, std::memory_order_relaxed);
  left_ = Leftover();
  active_since_ = absl::InfiniteFuture();
  if (stopping_) return absl::OkStatus();
  return failure;
}

}  // namespace capstan::server::peer
