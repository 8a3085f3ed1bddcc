// capstan::Store: opening, key-value operations and leases.

#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "capstan/capstan.h"
#include "embed/convert.h"
#include "embed/store_impl.h"
#include "membership/member.h"
#include "mvcc/errors.h"
#include "mvcc/kv_store.h"
#include "server/config/config.h"
#include "server/server.h"
#include "spdlog/spdlog.h"
#include "watchcache/cache.h"

namespace capstan {
namespace {

spdlog::level::level_enum SpdlogLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarn: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kOff: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

bool HasFlag(const std::vector<std::string>& flags, std::string_view name) {
  for (const auto& f : flags) {
    std::string_view v = f;
    while (!v.empty() && v.front() == '-') v.remove_prefix(1);
    if (v.substr(0, name.size()) == name && (v.size() == name.size() || v[name.size()] == '=')) {
      return true;
    }
  }
  return false;
}

// The capstan command line that means options; parsed and validated by the
// binary's own parser, so every option has the flag's exact semantics.
std::vector<std::string> FlagsOf(const Options& o) {
  std::vector<std::string> args = {
      absl::StrCat("--data-dir=", o.data_dir),
      absl::StrCat("--name=", o.name),
      absl::StrCat("--quota-backend-bytes=", o.quota_backend_bytes),
      absl::StrCat("--max-txn-ops=", o.max_txn_ops),
      absl::StrCat("--max-request-bytes=", o.max_request_bytes),
      absl::StrCat("--backend-batch-limit=", o.backend_batch_limit),
      absl::StrCat("--backend-batch-interval=",
                   gotext::FormatGoDuration(absl::FromChrono(o.backend_batch_interval))),
      absl::StrCat("--lease-revoke-rate=", o.lease_revoke_rate),
      absl::StrCat("--backend-cache-bytes=", o.backend_cache_bytes),
      absl::StrCat("--watch-cache-prefixes=", absl::StrJoin(o.watch_cache_prefixes, ",")),
  };
  if (!o.fsync) args.push_back("--unsafe-no-fsync");
  if (o.auto_compaction_period > std::chrono::seconds(0)) {
    args.push_back("--auto-compaction-mode=periodic");
    args.push_back(absl::StrCat("--auto-compaction-retention=",
                                gotext::FormatGoDuration(absl::FromChrono(o.auto_compaction_period))));
  } else if (o.auto_compaction_revisions > 0) {
    args.push_back("--auto-compaction-mode=revision");
    args.push_back(absl::StrCat("--auto-compaction-retention=", o.auto_compaction_revisions));
  }
  if (!o.listen_client_urls.empty()) {
    const std::string urls = absl::StrJoin(o.listen_client_urls, ",");
    args.push_back(absl::StrCat("--listen-client-urls=", urls));
    if (!HasFlag(o.extra_flags, "advertise-client-urls")) {
      args.push_back(absl::StrCat("--advertise-client-urls=", urls));
    }
  }
  if (!o.listen_metrics_urls.empty()) {
    args.push_back(absl::StrCat("--listen-metrics-urls=", absl::StrJoin(o.listen_metrics_urls, ",")));
  }
  args.insert(args.end(), o.extra_flags.begin(), o.extra_flags.end());
  return args;
}

}  // namespace

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Store::~Store() {
  if (impl_ && impl_->server) impl_->server->Shutdown();
}

Result<std::unique_ptr<Store>> Store::Open(const Options& options) {
  if (options.data_dir.empty()) {
    return Status(StatusCode::kInvalidArgument, "capstan: Options.data_dir is required");
  }
  auto config = server::ParseServerConfig(FlagsOf(options), {});
  if (!config.ok()) return Status(StatusCode::kInvalidArgument, std::string(config.status().message()));
  // Without client URLs nothing listens (the flag's default would).
  if (options.listen_client_urls.empty() && !HasFlag(options.extra_flags, "listen-client-urls")) {
    config->listen_client_urls.clear();
  }
  if (config->listen_client_urls.empty() && !config->listen_metrics_urls.empty()) {
    return Status(StatusCode::kInvalidArgument,
                  "capstan: listen_metrics_urls needs listen_client_urls");
  }
  spdlog::set_level(SpdlogLevel(options.log_level));

  auto server = server::Server::Open(*config);
  if (!server.ok()) return embed::FromAbsl(server.status());
  if (!config->listen_client_urls.empty()) {
    if (auto s = (*server)->Serve(); !s.ok()) return embed::FromAbsl(s);
  }
  auto impl = std::make_unique<Impl>();
  impl->server = std::move(*server);
  return std::unique_ptr<Store>(new Store(std::move(impl)));
}

Result<RangeResult> Store::Range(std::string_view key, const RangeOptions& options) {
  mvcc::RangeResult r;
  if (auto s = impl_->server->store()->Range(embed::ToRangeRequest(key, options), &r); !s.ok()) {
    return embed::FromAbsl(s);
  }
  etcdserverpb::RangeResponse resp;
  resp.ParseFromString(r.kvs_wire);
  RangeResult out = embed::FromProto(resp);
  out.revision = r.rev;
  out.count = r.count;
  out.more = r.more;
  return out;
}

Result<PutResult> Store::Put(std::string_view key, std::string_view value,
                             const PutOptions& options) {
  auto resp = impl_->server->store()->Put(embed::ToPutRequest(key, value, options));
  if (!resp.ok()) return embed::FromAbsl(resp.status());
  return embed::FromProto(*resp);
}

Result<DeleteResult> Store::DeleteRange(std::string_view key, const DeleteOptions& options) {
  auto resp = impl_->server->store()->DeleteRange(embed::ToDeleteRequest(key, options));
  if (!resp.ok()) return embed::FromAbsl(resp.status());
  return embed::FromProto(*resp);
}

Result<TxnResult> Store::Txn(const std::vector<Compare>& compare, const std::vector<Op>& success,
                             const std::vector<Op>& failure) {
  auto resp = impl_->server->store()->Txn(embed::ToTxnRequest(compare, success, failure));
  if (!resp.ok()) return embed::FromAbsl(resp.status());
  return embed::FromProto(*resp);
}

Result<int64_t> Store::Compact(int64_t revision, bool physical) {
  etcdserverpb::CompactionRequest req;
  req.set_revision(revision);
  req.set_physical(physical);
  auto resp = impl_->server->store()->Compact(req);
  if (!resp.ok()) return embed::FromAbsl(resp.status());
  return resp->header().revision();
}

int64_t Store::Revision() const { return impl_->server->store()->Rev(); }
int64_t Store::CompactRevision() const { return impl_->server->store()->CompactRev(); }

Result<LeaseGrantResult> Store::LeaseGrant(int64_t ttl, int64_t id) {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl);
  req.set_id(id);
  auto resp = impl_->server->store()->LeaseGrant(req);
  if (!resp.ok()) return embed::FromAbsl(resp.status());
  if (!resp->error().empty()) return Status(StatusCode::kUnknown, resp->error());
  LeaseGrantResult out;
  out.revision = resp->header().revision();
  out.id = resp->id();
  out.ttl = resp->ttl();
  return out;
}

Result<int64_t> Store::LeaseRevoke(int64_t id) {
  etcdserverpb::LeaseRevokeRequest req;
  req.set_id(id);
  auto resp = impl_->server->store()->LeaseRevoke(req);
  if (!resp.ok()) return embed::FromAbsl(resp.status());
  return resp->header().revision();
}

Result<int64_t> Store::LeaseKeepAlive(int64_t id) {
  // etcd answers a keep-alive of a missing lease with TTL 0, which clients
  // turn into ErrLeaseNotFound.
  std::optional<int64_t> ttl = impl_->server->store()->lessor()->Renew(id);
  if (!ttl) return embed::FromAbsl(mvcc::MakeError(mvcc::Error::kLeaseNotFound));
  return *ttl;
}

LeaseInfo Store::LeaseTimeToLive(int64_t id, bool keys) {
  LeaseInfo out;
  out.id = id;
  if (auto info = impl_->server->store()->lessor()->Get(id, keys)) {
    out.ttl = info->remaining_ttl;
    out.granted_ttl = info->granted_ttl;
    out.keys = std::move(info->keys);
  }
  return out;
}

std::vector<int64_t> Store::Leases() { return impl_->server->store()->lessor()->List(); }

bool Store::WaitCacheReady(std::chrono::milliseconds timeout) {
  watchcache::Cache* cache = impl_->server->cache();
  return cache == nullptr || cache->WaitReady(absl::FromChrono(timeout));
}

std::vector<int> Store::ClientPorts() const { return impl_->server->client_ports(); }
uint64_t Store::ClusterId() const { return impl_->server->member().cluster_id; }
uint64_t Store::MemberId() const { return impl_->server->member().member_id; }

}  // namespace capstan
