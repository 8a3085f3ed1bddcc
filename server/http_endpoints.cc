#include "server/http_endpoints.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "server/metrics.h"
#include "server/metrics_tls.h"
#include "spdlog/spdlog.h"

namespace capstan::server {

HttpEndpoints::HttpEndpoints(mvcc::KvStore* store, const MemberInfo* member, Versions versions,
                             const Metrics* metrics)
    : store_(store), member_(member), versions_(std::move(versions)), metrics_(metrics) {}

HttpEndpoints::~HttpEndpoints() { Stop(); }

void HttpEndpoints::Install(httplib::Server* server) {
  // etcd 3.5's /health (etcdhttp/metrics.go): an active alarm makes the
  // member unhealthy unless its type is excluded (`?exclude=NOSPACE`, as
  // kubeadm's liveness probe asks; every alarm of that type is excluded, as
  // from 3.5.2). `serializable=true` asks etcd for a local rather than a
  // quorum read; a single member answers both alike, so it is accepted and
  // changes nothing here.
  auto health = [this](const httplib::Request& req, httplib::Response& res) {
    std::string reason;
    for (const auto& a : store_->Alarms()) {
      const std::string name = etcdserverpb::AlarmType_Name(a.alarm());
      const std::string text = absl::StrCat("memberID:", a.memberid(), " alarm:", name, " ");
      bool excluded = false;
      for (size_t i = 0; i < req.get_param_value_count("exclude"); ++i) {
        excluded |= req.get_param_value("exclude", i) == name;
      }
      if (excluded) {
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
      // Go's http.Error: the body plus a newline, and nosniff.
      const std::string body = "{\"health\":\"false\",\"reason\":\"" + reason + "\"}";
      SPDLOG_WARN("/health error: output {}, status-code 503", body);
      res.status = 503;
      res.set_header("X-Content-Type-Options", "nosniff");
      res.set_content(body + "\n", "text/plain; charset=utf-8");
      return;
    }
    SPDLOG_DEBUG("/health OK: status-code 200");
    res.set_content("{\"health\":\"true\",\"reason\":\"\"}", "text/plain; charset=utf-8");
  };
  server->Get("/health", health);
  // Other methods: 405 with Allow, as Go's http.Error writes it.
  auto only_get = [](const httplib::Request&, httplib::Response& res) {
    res.status = 405;
    res.set_header("Allow", "GET");
    res.set_header("X-Content-Type-Options", "nosniff");
    res.set_content("Method Not Allowed\n", "text/plain; charset=utf-8");
  };
  server->Post("/health", only_get);
  server->Put("/health", only_get);
  server->Delete("/health", only_get);
  server->Patch("/health", only_get);
  server->Get("/livez", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok", "text/plain; charset=utf-8");
  });
  server->Get("/readyz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok", "text/plain; charset=utf-8");
  });
  server->Get("/version", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(absl::StrCat("{\"etcdserver\":\"", versions_.server, "\",\"etcdcluster\":\"",
                                 versions_.cluster, "\"}"),
                    "application/json");
  });
  server->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(RenderMetrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
}

absl::Status HttpEndpoints::Listen(const std::string& host, int port, const ClientTls* tls) {
  std::unique_ptr<httplib::Server> server;
  if (tls) {
    absl::Status set_up;
    server = std::make_unique<httplib::SSLServer>([&](SSL_CTX& ctx) {
      set_up = SetUpMetricsTls(*tls, &ctx);
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
