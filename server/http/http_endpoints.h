// HTTP endpoints on the metrics URLs (--listen-metrics-urls): /health,
// /livez, /readyz, /version and /metrics (Prometheus text format), over
// http or, for https URLs, TLS with the client TLS settings. The http
// client URLs answer them too (see client_http.h).

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
#include "server/http/http1.h"

namespace httplib {
class Server;
}

namespace capstan::server {

class Metrics;
struct ClientTls;

struct Versions {
  std::string server;   // etcd server version whose API Capstan implements
  std::string cluster;  // cluster version
  std::string capstan;  // Capstan's own version
};

// Serves the endpoints on one thread per listener. Thread-safe; Stop() is
// idempotent and called by the destructor. store and member must outlive it.
class HttpEndpoints {
 public:
  // metrics may be null (/metrics is then empty); else it must outlive the
  // endpoints.
  HttpEndpoints(mvcc::KvStore* store, const membership::MemberInfo* member, Versions versions,
                const Metrics* metrics = nullptr);
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
  // method. exclude: the values of /health's `exclude` parameter.
  std::optional<HttpResponse> Answer(absl::string_view method, absl::string_view path,
                                     const std::vector<std::string>& exclude) const;

 private:
  HttpResponse Health(const std::vector<std::string>& exclude) const;
  void Install(httplib::Server* server);

  mvcc::KvStore* const store_;
  const membership::MemberInfo* const member_;
  const Versions versions_;
  const Metrics* const metrics_;
  std::vector<std::unique_ptr<httplib::Server>> servers_;
  std::vector<std::thread> threads_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_HTTP_HTTP_ENDPOINTS_H_
