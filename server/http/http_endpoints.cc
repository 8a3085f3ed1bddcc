#include "server/http/http_endpoints.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "server/observability/metrics.h"
#include "server/security/metrics_tls.h"
#include "spdlog/spdlog.h"

namespace capstan::server {

HttpEndpoints::HttpEndpoints(mvcc::KvStore* store, const membership::MemberInfo* member, Versions versions,
                             const Metrics* metrics)
    : store_(store), member_(member), versions_(std::move(versions)), metrics_(metrics) {}

HttpEndpoints::~HttpEndpoints() { Stop(); }

std::optional<HttpResponse> HttpEndpoints::Answer(absl::string_view method, absl::string_view path,
                                                  const std::vector<std::string>& exclude) const {
  HttpResponse res;
  auto content = [&res](std::string body, std::string type) {
    res.body = std::move(body);
    res.headers.emplace_back("Content-Type", std::move(type));
    return res;
  };
  // Prometheus' handler answers any method.
  if (path == "/metrics") return content(RenderMetrics(), "text/plain; version=0.0.4; charset=utf-8");
  if ((path == "/health" || path == "/version") && method != "GET") {
    // As etcd's: 405 with Allow, as Go's http.Error writes it.
    res = PlainError(405, "Method Not Allowed");
    res.headers.emplace_back("Allow", "GET");
    return res;
  }
  if (path == "/health") return Health(exclude);
  if (method != "GET") return std::nullopt;
  if (path == "/livez" || path == "/readyz") return content("ok", "text/plain; charset=utf-8");
  if (path == "/version") {
    return content(absl::StrCat("{\"etcdserver\":\"", versions_.server, "\",\"etcdcluster\":\"",
                                versions_.cluster, "\"}"),
                   "application/json");
  }
  return std::nullopt;
}

// etcd 3.5's /health (etcdhttp/metrics.go): an active alarm makes the member
// unhealthy unless its type is excluded (`?exclude=NOSPACE`, as kubeadm's
// liveness probe asks; every alarm of that type is excluded, as from
// 3.5.2). `serializable=true` asks etcd for a local rather than a quorum
// read; a single member answers both alike, so it is accepted and changes
// nothing here.
HttpResponse HttpEndpoints::Health(const std::vector<std::string>& exclude) const {
  std::string reason;
  for (const auto& a : store_->Alarms()) {
    const std::string name = etcdserverpb::AlarmType_Name(a.alarm());
    const std::string text = absl::StrCat("memberID:", a.memberid(), " alarm:", name, " ");
    if (std::find(exclude.begin(), exclude.end(), name) != exclude.end()) {
      SPDLOG_DEBUG("/health excluded alarm: {}", text);
      continue;
    }
    SPDLOG_WARN("serving /health false due to an alarm: {}", text);
    reason = a.alarm() == etcdserverpb::NOSPACE || a.alarm() == etcdserverpb::CORRUPT
                 ? "ALARM " + name
                 : "ALARM UNKNOWN";
    break;
  }
  // A store that stopped accepting writes after a storage failure is
  // unhealthy whatever is excluded.
  if (reason.empty() && !store_->StorageFailure().ok()) reason = "STORAGE FAILED";
  if (!reason.empty()) {
    const std::string body = "{\"health\":\"false\",\"reason\":\"" + reason + "\"}";
    SPDLOG_WARN("/health error: output {}, status-code 503", body);
    return PlainError(503, body);
  }
  SPDLOG_DEBUG("/health OK: status-code 200");
  HttpResponse res;
  res.headers.emplace_back("Content-Type", "text/plain; charset=utf-8");
  res.body = "{\"health\":\"true\",\"reason\":\"\"}";
  return res;
}

void HttpEndpoints::Install(httplib::Server* server) {
  auto handler = [this](const httplib::Request& req, httplib::Response& res) {
    std::vector<std::string> exclude;
    for (size_t i = 0; i < req.get_param_value_count("exclude"); ++i) {
      exclude.push_back(req.get_param_value("exclude", i));
    }
    std::optional<HttpResponse> answer = Answer(req.method, req.path, exclude);
    if (!answer) {
      res.status = 404;
      return;
    }
    res.status = answer->status;
    std::string type;
    for (const auto& [name, value] : answer->headers) {
      if (name == "Content-Type") {
        type = value;
      } else {
        res.set_header(name, value);
      }
    }
    res.set_content(std::move(answer->body), type);
  };
  for (const char* path : {"/health", "/livez", "/readyz", "/version", "/metrics"}) {
    server->Get(path, handler);
    server->Post(path, handler);
    server->Put(path, handler);
    server->Delete(path, handler);
    server->Patch(path, handler);
  }
}

absl::Status HttpEndpoints::Listen(const std::string& host, int port, const ClientTls* tls) {
  std::unique_ptr<httplib::Server> server;
  if (tls) {
    absl::Status set_up;
    server = std::make_unique<httplib::SSLServer>([&](SSL_CTX& ctx) {
      set_up = SetUpHttpsTls(*tls, /*check_client_address=*/true, &ctx);
      return set_up.ok();
    });
    if (!set_up.ok()) return set_up;
  } else {
    server = std::make_unique<httplib::Server>();
  }
  Install(server.get());
  if (!server->bind_to_port(host, port)) {
    const int err = errno;
    // Worded like Go's net.Listen error that etcd prints.
    return absl::UnavailableError(absl::StrCat("listen tcp ", host, ":", port, ": bind: ",
                                               err == EADDRINUSE ? "address already in use"
                                                                 : std::strerror(err)));
  }
  httplib::Server* raw = server.get();
  servers_.push_back(std::move(server));
  threads_.emplace_back([raw] { raw->listen_after_bind(); });
  return absl::OkStatus();
}

void HttpEndpoints::Stop() {
  for (auto& s : servers_) s->stop();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
  servers_.clear();
}

std::string HttpEndpoints::RenderMetrics() const {
  return metrics_ ? metrics_->Render() : std::string();
}

}  // namespace capstan::server
