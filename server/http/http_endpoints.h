// HTTP endpoints on the metrics URLs (--listen-metrics-urls): /health,
// /livez, /readyz (and one path per check below them), /version and
// /metrics (Prometheus text format), over http or, for https URLs, TLS with
// the client TLS settings. The http client URLs answer them too (see
// client_http.h).
//
// /livez and /readyz are etcd's (etcdhttp/health.go, 3.5.16 and 3.6):
//   /livez   serializable_read
//   /readyz  data_corruption, serializable_read, linearizable_read,
//            non_learner (3.6's; 3.5.16 lacks it)
// Each answers 200 "ok\n" when every check it runs passes (with ?verbose
// first a "[+]<check> ok" line per check), else 503 with a line per check,
// "[-]<check> failed: <why>" for those that failed. ?exclude=<check> (any
// number of times) leaves checks out; an unknown name is logged and
// ignored. /livez/<check> and /readyz/<check> run that check alone.

#ifndef CAPSTAN_SERVER_HTTP_HTTP_ENDPOINTS_H_
#define CAPSTAN_SERVER_HTTP_HTTP_ENDPOINTS_H_

#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "membership/member.h"
#include "mvcc/kv_store.h"
#include "server/config/version.h"
#include "server/http/http1.h"

namespace httplib {
class Server;
}

namespace capstan::server {

class Metrics;
struct ClientTls;

struct Versions {
  std::string server;   // etcd server version whose API Capstan implements
  // The cluster version of a member without Raft (in a Raft group, its
  // log's: membership::MemberInfo::ClusterVersion).
  std::string cluster;
  std::string capstan;  // Capstan's own version
  // The data's schema version (etcd 3.6's) once the cluster has a version.
  std::string storage = kEtcdStorageVersion;
};

// The query parameters the endpoints read.
struct EndpointQuery {
  std::vector<std::string> exclude;  // every `exclude` value, in order
  bool verbose = false;              // `verbose` is present, whatever its value
  bool serializable = false;         // `serializable=true` (/health)
};

// Serves the endpoints on one thread per listener. Thread-safe; Stop() is
// idempotent and called by the destructor. store and member must outlive it.
class HttpEndpoints {
 public:
  // metrics may be null (/metrics is then empty and the health checks are
  // not counted); else it must outlive the endpoints.
  HttpEndpoints(mvcc::KvStore* store, const membership::MemberInfo* member, Versions versions,
                Metrics* metrics = nullptr);
  ~HttpEndpoints();

  // Starts listening on host:port; with tls, serves https with those
  // settings (see metrics_tls.h; tls need not outlive the call). Fails if
  // the TLS files cannot be loaded or the address cannot be bound.
  absl::Status Listen(const std::string& host, int port, const ClientTls* tls = nullptr);
  void Stop();

  // The Prometheus exposition served at /metrics.
  std::string RenderMetrics() const;

  // The answer to method on path if path is one of the endpoints (the
  // client URLs serve them too); nullopt if it is not, or not for that
  // method.
  std::optional<HttpResponse> Answer(absl::string_view method, absl::string_view path,
                                     const EndpointQuery& query) const;

  // The check of /livez or /readyz named name: OK, or why it failed (the
  // text after "failed: "). REQUIRES: name is one of the checks above.
  absl::Status RunCheck(absl::string_view name) const;

 private:
  HttpResponse Health(const std::vector<std::string>& exclude, bool serializable) const;
  // /livez or /readyz (kind), running checks (all of kind's, or one).
  HttpResponse Probe(absl::string_view kind, const std::vector<absl::string_view>& checks,
                     bool verbose, absl::string_view path) const;
  // A Range as client reads make it, keys only and at most one key; a
  // linearizable one first waits for the member's read index (in a
  // cluster: a ReadIndex round, failing after the request timeout as
  // etcd's do), blocking the calling thread.
  absl::Status ReadCheck(bool serializable) const;
  void Install(httplib::Server* server);

  mvcc::KvStore* const store_;
  const membership::MemberInfo* const member_;
  const Versions versions_;
  Metrics* const metrics_;
  std::vector<std::unique_ptr<httplib::Server>> servers_;
  std::vector<std::thread> threads_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_HTTP_HTTP_ENDPOINTS_H_
