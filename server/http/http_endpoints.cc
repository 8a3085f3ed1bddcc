#include "server/http/http_endpoints.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "httplib.h"
#include "mvcc/errors.h"
#include "server/api/errors.h"
#include "server/observability/metrics.h"
#include "server/observability/request_metrics.h"
#include "server/security/metrics_tls.h"
#include "spdlog/spdlog.h"

namespace capstan::server {

namespace {

// The checks of /livez and /readyz, in the order they run and are listed.
// etcd keeps them in a Go map, so its order varies from one answer to the
// next; this is the order it gives most often.
const std::vector<absl::string_view>& ChecksOf(absl::string_view kind) {
  static const std::vector<absl::string_view> kLivez = {"serializable_read"};
  static const std::vector<absl::string_view> kReadyz = {"data_corruption", "serializable_read",
                                                         "linearizable_read", "non_learner"};
  return kind == "livez" ? kLivez : kReadyz;
}

}  // namespace

HttpEndpoints::HttpEndpoints(mvcc::KvStore* store, const membership::MemberInfo* member, Versions versions,
                             Metrics* metrics)
    : store_(store), member_(member), versions_(std::move(versions)), metrics_(metrics) {}

HttpEndpoints::~HttpEndpoints() { Stop(); }

std::optional<HttpResponse> HttpEndpoints::Answer(absl::string_view method, absl::string_view path,
                                                  const EndpointQuery& query) const {
  HttpResponse res;
  auto content = [&res](std::string body, std::string type) {
    res.body = std::move(body);
    res.headers.emplace_back("Content-Type", std::move(type));
    return res;
  };
  // Prometheus' handler answers any method.
  if (path == "/metrics") return content(RenderMetrics(), "text/plain; version=0.0.4; charset=utf-8");
  // /livez, /readyz and their checks' paths.
  absl::string_view kind, check;
  for (absl::string_view k : {"/livez", "/readyz"}) {
    absl::string_view rest = path;
    if (!absl::ConsumePrefix(&rest, k)) continue;
    const auto& checks = ChecksOf(k.substr(1));
    if (rest.empty() || (absl::ConsumePrefix(&rest, "/") &&
                         std::find(checks.begin(), checks.end(), rest) != checks.end())) {
      kind = k.substr(1);
      check = rest;
    }
  }
  if ((path == "/health" || path == "/version" || !kind.empty()) && method != "GET") {
    // As etcd's: 405 with Allow, as Go's http.Error writes it.
    res = PlainError(405, "Method Not Allowed");
    res.headers.emplace_back("Allow", "GET");
    if (!kind.empty()) SPDLOG_WARN("Health request error: path {}, status-code 405", std::string(path));
    return res;
  }
  if (path == "/health") return Health(query.exclude, query.serializable);
  if (!kind.empty()) {
    if (!check.empty()) return Probe(kind, {check}, query.verbose, path);
    // The kind's checks but those excluded; unknown names are ignored.
    std::vector<absl::string_view> run;
    std::vector<std::string> unknown;
    const auto& checks = ChecksOf(kind);
    for (const std::string& e : query.exclude) {
      if (!e.empty() && std::find(checks.begin(), checks.end(), e) == checks.end() &&
          std::find(unknown.begin(), unknown.end(), "\"" + e + "\"") == unknown.end()) {
        unknown.push_back("\"" + e + "\"");
      }
    }
    for (absl::string_view c : checks) {
      if (std::find(query.exclude.begin(), query.exclude.end(), c) == query.exclude.end()) {
        run.push_back(c);
      }
    }
    if (!unknown.empty()) {
      SPDLOG_WARN("some health checks cannot be excluded: missing-health-checks {}",
                  absl::StrJoin(unknown, ","));
    }
    return Probe(kind, run, query.verbose, path);
  }
  if (method != "GET") return std::nullopt;
  if (path == "/version") {
    // etcd 3.6's: "not_decided" and "unknown" until the cluster has a
    // version, and the data's schema with it.
    const std::string cluster =
        member_ != nullptr ? member_->ClusterVersion(versions_.cluster) : versions_.cluster;
    const std::string storage =
        member_ != nullptr ? membership::MemberInfo::StorageVersionWith(cluster, versions_.storage)
                           : versions_.storage;
    return content(absl::StrCat("{\"etcdserver\":\"", versions_.server, "\",\"etcdcluster\":\"",
                                cluster.empty() ? "not_decided" : cluster, "\",\"storage\":\"",
                                storage.empty() ? "unknown" : storage, "\"}"),
                   "application/json");
  }
  return std::nullopt;
}

absl::Status HttpEndpoints::ReadCheck(bool serializable) const {
  // etcd's readCheck: a Range of one key, keys only, as root (the store
  // checks no permissions). A linearizable one waits for the read index
  // as a client's does (at once on a single member); the Range itself is
  // a local read of the published view.
  etcdserverpb::RangeRequest req;
  req.set_key(std::string(1, '\0'));
  req.set_keys_only(true);
  req.set_limit(1);
  req.set_serializable(serializable);
  mvcc::RangeResult result;
  const auto start = std::chrono::steady_clock::now();
  absl::Status s;
  if (!serializable) {
    std::promise<absl::Status> barrier;
    std::future<absl::Status> passed = barrier.get_future();
    store_->ReadBarrier([&barrier](absl::Status st) { barrier.set_value(std::move(st)); });
    s = passed.get();
  }
  if (s.ok()) s = store_->Range(req, &result);
  if (metrics_ != nullptr) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    metrics_->requests()->ObserveRequest(RequestMetrics::RequestTypeOf("/etcdserverpb.KV/Range"),
                                         s.ok(), seconds);
    metrics_->requests()->ObserveRange(s.ok(), seconds);
  }
  // After a storage failure the store serves its last durable state but
  // can no longer move on: etcd's process exits when its backend fails a
  // commit, so its probes stop answering; these fail, so that a liveness
  // probe restarts the member, which is what recovers it.
  if (s.ok() && !store_->StorageFailure().ok()) s = mvcc::MakeError(mvcc::Error::kStorageFailed);
  if (s.ok()) return s;
  const grpc::Status g = ToGrpcStatus(s);
  return absl::Status(static_cast<absl::StatusCode>(g.error_code()), g.error_message());
}

absl::Status HttpEndpoints::RunCheck(absl::string_view name) const {
  if (name == "serializable_read") return ReadCheck(/*serializable=*/true);
  if (name == "linearizable_read") return ReadCheck(/*serializable=*/false);
  if (name == "data_corruption") {
    // etcd's activeAlarmCheck(CORRUPT): any member's.
    for (const auto& a : store_->Alarms()) {
      if (a.alarm() == etcdserverpb::CORRUPT) {
        return absl::UnavailableError("alarm activated: CORRUPT");
      }
    }
    return absl::OkStatus();
  }
  // non_learner (etcd 3.5.19+): a learner is not ready to serve clients.
  if (member_ != nullptr && member_->raft != nullptr && member_->raft->IsLearner()) {
    return absl::UnavailableError("not supported for learner");
  }
  return absl::OkStatus();
}

// etcd's newHealthHandler over runHealthChecks.
HttpResponse HttpEndpoints::Probe(absl::string_view kind, const std::vector<absl::string_view>& checks,
                                  bool verbose, absl::string_view path) const {
  std::string lines;
  bool failed = false;
  for (absl::string_view name : checks) {
    const absl::Status s = RunCheck(name);
    if (s.ok()) {
      absl::StrAppend(&lines, "[+]", name, " ok\n");
    } else {
      absl::StrAppend(&lines, "[-]", name, " failed: ", s.message(), "\n");
      failed = true;
    }
    if (metrics_ != nullptr) metrics_->requests()->RecordHealthCheck(kind, name, s.ok());
  }
  if (failed) {
    // Always with every check's line.
    SPDLOG_ERROR("Health check error: path {}, reason {}, status-code 503", std::string(path), lines);
    return PlainError(503, lines);
  }
  SPDLOG_DEBUG("Health check OK: path {}, reason {}, status-code 200", std::string(path), lines);
  HttpResponse res;
  res.headers.emplace_back("Content-Type", "text/plain; charset=utf-8");
  res.headers.emplace_back("X-Content-Type-Options", "nosniff");
  res.body = verbose ? lines + "ok\n" : "ok\n";
  return res;
}

// etcd 3.5's /health (etcdhttp/metrics.go): an active alarm makes the member
// unhealthy unless its type is excluded (`?exclude=NOSPACE`, as kubeadm's
// liveness probe asks; every alarm of that type is excluded, as from
// 3.5.2). Then, unless `serializable=true`, a member that knows no leader
// is unhealthy (checkLeader). Then a Range of one key, as etcd's checkAPI:
// linearizable, or local with `serializable=true`.
HttpResponse HttpEndpoints::Health(const std::vector<std::string>& exclude,
                                   bool serializable) const {
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
  if (reason.empty() && !serializable && member_ != nullptr && member_->raft != nullptr &&
      member_->raft->Leader() == 0) {
    SPDLOG_WARN("serving /health false; no leader");
    reason = "RAFT NO LEADER";
  }
  if (reason.empty()) {
    if (absl::Status s = ReadCheck(serializable); !s.ok()) {
      SPDLOG_WARN("serving /health false; Range fails: {}", std::string(s.message()));
      reason = absl::StrCat("RANGE ERROR:", s.message());
    }
  }
  if (metrics_ != nullptr) metrics_->requests()->CountHealth(reason.empty());
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
    EndpointQuery query;
    for (size_t i = 0; i < req.get_param_value_count("exclude"); ++i) {
      query.exclude.push_back(req.get_param_value("exclude", i));
    }
    query.verbose = req.has_param("verbose");
    query.serializable = req.get_param_value("serializable") == "true";
    std::optional<HttpResponse> answer = Answer(req.method, req.path, query);
    // Go's http.NotFound for any other path or method.
    if (!answer) answer = PlainError(404, "404 page not found");
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
  // Every path: Answer tells the endpoints from the rest.
  server->Get(".*", handler);
  server->Post(".*", handler);
  server->Put(".*", handler);
  server->Delete(".*", handler);
  server->Patch(".*", handler);
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
  // httplib sets SO_REUSEPORT, which would let a second server bind this
  // port and take half of its connections; a taken port fails here instead,
  // as etcd's metrics listener does.
  server->set_socket_options([](int sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
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
