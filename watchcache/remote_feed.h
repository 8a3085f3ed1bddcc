// RemoteFeed: feeds one ResourceCache from a remote etcd-compatible endpoint
// over its KV and Watch APIs (proxy mode, `capstan cache-proxy`).
//
// As kube-apiserver's reflector does, the feed lists the resource prefix in
// pages at one revision R (the first page's header revision; later pages
// ask for R), Resets the cache to it, then watches the prefix from R+1 with
// prev_kv and progress_notify and applies each response:
//  - events: applied up to their own revision (a catch-up response's header
//    revision may run ahead of the events it carries, so it is not used);
//  - an empty response (a progress notification, sent only to a watcher
//    that has every event up to it): the cache advances to its revision,
//    except while a new watch may still be catching up (below);
//  - canceled with a compact_revision ("required revision has been
//    compacted"): the feed lists again, and the cache's watchers are cut
//    off with CacheReinitialized as after any re-list.
// When the stream breaks (upstream restarted, network), the feed watches
// again from the cache's revision + 1 after a backoff (100 ms doubling to
// 5 s, with jitter), without listing again unless that revision has been
// compacted meanwhile. A List page that fails with "required revision has
// been compacted" restarts the list.
//
// Consistent reads (resourceVersion "") ask the upstream for its current
// revision with a linearizable single-key Range and then request a
// progress notification on the watch stream until the cache has reached it.
// etcd before 3.4.31 and 3.5.13 (Debian 12 ships 3.4.23) answers a progress
// request at once with its current revision, even to a watcher that has not
// yet been sent the events below it (etcd#15220): a watch created from a
// revision below the upstream's current one catches up in the background.
// So for catch_up_grace after such a watch is created, unless an event at or
// above the revision it was created at arrives first, empty responses are
// not taken as progress (consistent reads keep asking meanwhile).
//
// Thread safety: Start and Stop from one thread; the feed runs on its own
// thread. RequestProgress and CurrentRevision may be called from any thread.

#ifndef CAPSTAN_WATCHCACHE_REMOTE_FEED_H_
#define CAPSTAN_WATCHCACHE_REMOTE_FEED_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "util/mutex.h"
#include "watchcache/resource_cache.h"

namespace capstan::watchcache {

struct RemoteFeedOptions {
  // Keys per List page. Each page makes etcd count the whole range, so
  // small pages make a large list quadratic (150k pods in pages of 500: 180 s).
  int64_t list_page = 5000;
  absl::Duration min_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // Deadline of each List page and of each current-revision read.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // How long after creating a watch that must catch up an empty response is
  // not taken as progress (see above). etcd moves an unsynced watcher's
  // events every 100 ms, up to 512 revisions' worth at a time.
  absl::Duration catch_up_grace = absl::Seconds(1);
};

// True for the etcd versions that answer a watch progress request at once,
// ahead of events still on their way (etcd#15220): before 3.4.31, and 3.5.0
// to 3.5.12. `version` is Maintenance.Status's, e.g. "3.4.23"; false for
// anything it cannot read.
bool AnswersProgressEarly(std::string_view version);

class RemoteFeed {
 public:
  // cache must outlive the feed.
  RemoteFeed(ResourceCache* cache, std::shared_ptr<grpc::Channel> channel,
             RemoteFeedOptions options = {});
  ~RemoteFeed();
  RemoteFeed(const RemoteFeed&) = delete;
  RemoteFeed& operator=(const RemoteFeed&) = delete;

  void Start();
  // Cancels the calls in flight and joins the feed thread. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Lists done (the first and every re-list), and watches started again
  // after a broken stream.
  uint64_t lists() const { return lists_.load(); }
  uint64_t reconnects() const { return reconnects_.load(); }
  // The header of the latest upstream response (its cluster and member ids).
  etcdserverpb::ResponseHeader upstream_header() const ABSL_LOCKS_EXCLUDED(mu_);

  // The upstream's current revision (a linearizable Range of one key).
  absl::StatusOr<int64_t> CurrentRevision();
  // Asks the upstream for a progress notification on the feed's watch
  // (at most one per 20 ms; none while no watch is open).
  void RequestProgress() ABSL_LOCKS_EXCLUDED(stream_mu_);

  // While paused the feed holds no watch and opens none (the cache keeps its
  // state and revision); on resume it watches again from the cache's
  // revision + 1. For tests that make the upstream compact past the feed.
  void TEST_Pause(bool paused) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class WatchEnd { kStopped, kCompacted, kBroken };
  using WatchStream = grpc::ClientReaderWriter<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>;

  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Lists the prefix at one revision into the cache.
  absl::Status Load();
  // Watches from rev+1 until the watch ends.
  WatchEnd Follow(int64_t rev) ABSL_LOCKS_EXCLUDED(mu_, stream_mu_);
  void Apply(const etcdserverpb::WatchResponse& resp);
  // Sleeps for the current backoff (cut short by Stop) and doubles it.
  void Backoff() ABSL_LOCKS_EXCLUDED(mu_);
  // A ClientContext for one call, registered so that Stop can cancel it.
  std::shared_ptr<grpc::ClientContext> NewContext(bool deadline) ABSL_LOCKS_EXCLUDED(mu_);
  void NoteHeader(const etcdserverpb::ResponseHeader& h) ABSL_LOCKS_EXCLUDED(mu_);
  // Reads the upstream's version once and warns if it answers progress
  // requests early (see the header comment).
  void CheckUpstreamVersion();

  ResourceCache* const cache_;
  const RemoteFeedOptions options_;
  const std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  const std::unique_ptr<etcdserverpb::Watch::Stub> watch_;
  const std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance_;
  bool version_checked_ = false;  // feed thread only

  // The feed's state shared with Stop, TEST_Pause and readers of the
  // header. A leaf: never held with stream_mu_; nothing blocks under it
  // (TryCancel on the call in flight returns at once).
  mutable util::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  // The feed thread's call in flight.
  std::shared_ptr<grpc::ClientContext> call_ ABSL_GUARDED_BY(mu_);
  etcdserverpb::ResponseHeader header_ ABSL_GUARDED_BY(mu_);
  absl::Duration backoff_;  // feed thread only

  // The open watch stream, for progress requests from other threads. A
  // leaf, never held with mu_. It is held across the stream's (blocking)
  // Write on purpose: a gRPC stream takes one write at a time, and this
  // lock is what makes them one at a time; nothing else waits on it.
  util::Mutex stream_mu_;
  WatchStream* stream_ ABSL_GUARDED_BY(stream_mu_) = nullptr;

  std::atomic<int64_t> last_progress_request_ns_{0};
  std::atomic<uint64_t> lists_{0};
  std::atomic<uint64_t> reconnects_{0};
  std::thread thread_;
};

}  // namespace capstan::watchcache

#endif  // CAPSTAN_WATCHCACHE_REMOTE_FEED_H_
