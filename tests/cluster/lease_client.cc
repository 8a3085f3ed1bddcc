#include "cluster/lease_client.h"

#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cluster/cluster_fixture.h"
#include "cluster/history.h"
#include "grpcpp/client_context.h"

namespace capstan::testing::cluster {
namespace {

using std::chrono::milliseconds;

constexpr int64_t kNsPerMs = 1000000;

void Deadline(grpc::ClientContext* ctx, milliseconds timeout = milliseconds(2000)) {
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
}

// Sleeps until `ns` on NowNs()'s clock (the client's pacing, not a wait for
// another thread).
void SleepUntilNs(int64_t ns) {
  const int64_t now = NowNs();
  if (ns > now) std::this_thread::sleep_for(std::chrono::nanoseconds(ns - now));
}

}  // namespace

LeaseClient::LeaseClient(int id, std::vector<std::string> endpoints, int first,
                         std::string prefix, uint32_t seed)
    : id_(id), prefix_(std::move(prefix)), endpoints_(endpoints), rng_(seed) {
  for (const std::string& e : endpoints) {
    auto channel = NewMemberChannel(e);
    stubs_.push_back({etcdserverpb::Lease::NewStub(channel), etcdserverpb::KV::NewStub(channel)});
  }
  current_ = first % static_cast<int>(stubs_.size());
}

std::vector<LeaseRecord> LeaseClient::Records() const {
  util::MutexLock l(&mu_);
  return records_;
}

void LeaseClient::Save(const LeaseRecord& r) {
  util::MutexLock l(&mu_);
  records_.push_back(r);
}

bool LeaseClient::Grant(int64_t ttl, LeaseRecord* r) {
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(ttl);
  etcdserverpb::LeaseGrantResponse resp;
  grpc::ClientContext ctx;
  Deadline(&ctx);
  r->grant.invoke_ns = NowNs();
  r->grant.endpoint = endpoints_[current_];
  const grpc::Status st = stubs_[current_].lease->LeaseGrant(&ctx, req, &resp);
  r->grant.complete_ns = NowNs();
  if (!st.ok() || !resp.error().empty()) {
    Next();
    return false;
  }
  r->lease = resp.id();
  r->grant.ttl = resp.ttl();
  return true;
}

bool LeaseClient::KeepAlive(int64_t lease, LeaseRecord::Call* call) {
  grpc::ClientContext ctx;
  Deadline(&ctx);
  call->invoke_ns = NowNs();
  call->endpoint = endpoints_[current_];
  auto stream = stubs_[current_].lease->LeaseKeepAlive(&ctx);
  etcdserverpb::LeaseKeepAliveRequest req;
  req.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse resp;
  const bool answered = stream->Write(req) && stream->Read(&resp);
  call->complete_ns = NowNs();
  stream->WritesDone();
  ctx.TryCancel();
  stream->Finish();
  if (!answered) {
    Next();
    return false;
  }
  call->ttl = resp.ttl();
  return true;
}

bool LeaseClient::Read(const std::string& key, LeaseRecord::Read* read) {
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  etcdserverpb::RangeResponse resp;
  grpc::ClientContext ctx;
  Deadline(&ctx);
  read->invoke_ns = NowNs();
  read->endpoint = endpoints_[current_];
  const grpc::Status st = stubs_[current_].kv->Range(&ctx, req, &resp);
  read->complete_ns = NowNs();
  if (!st.ok()) {
    Next();
    return false;
  }
  read->found = resp.kvs_size() > 0;
  return true;
}

bool LeaseClient::OneLease(const std::atomic<bool>* stop) {
  LeaseRecord r;
  const int64_t ttl = 2 + static_cast<int64_t>(rng_() % 2);
  if (!Grant(ttl, &r)) return false;
  r.key = absl::StrCat(prefix_, "c", id_, "-", ++seq_);
  {
    etcdserverpb::PutRequest req;
    req.set_key(r.key);
    req.set_value("held");
    req.set_lease(r.lease);
    etcdserverpb::PutResponse resp;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    if (stubs_[current_].kv->Put(&ctx, req, &resp).ok()) {
      r.put_complete_ns = NowNs();
    } else {
      Next();
    }
  }
  const int64_t keep_until = NowNs() + static_cast<int64_t>(rng_() % 4000) * kNsPerMs;
  const bool revoke = rng_() % 5 == 0;
  int64_t next_keepalive = NowNs() + 500 * kNsPerMs;
  while (NowNs() < keep_until && !stop->load(std::memory_order_relaxed)) {
    LeaseRecord::Read read;
    if (Read(r.key, &read)) r.reads.push_back(read);
    if (NowNs() >= next_keepalive) {
      LeaseRecord::Call call;
      if (KeepAlive(r.lease, &call)) r.keepalives.push_back(call);
      next_keepalive = NowNs() + 500 * kNsPerMs;
    }
    SleepUntilNs(read.invoke_ns + 250 * kNsPerMs);
  }
  if (revoke) {
    etcdserverpb::LeaseRevokeRequest req;
    req.set_id(r.lease);
    etcdserverpb::LeaseRevokeResponse resp;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    r.revoke_invoke_ns = NowNs();
    if (stubs_[current_].lease->LeaseRevoke(&ctx, req, &resp).ok()) {
      r.revoke_complete_ns = NowNs();
    } else {
      Next();
    }
  }
  // Until the key is gone, or long past when it should be.
  int64_t last = r.grant.complete_ns;
  for (const auto& k : r.keepalives) last = std::max(last, k.complete_ns);
  const int64_t give_up = last + (ttl * 1000 + 20000) * kNsPerMs;
  while (NowNs() < give_up) {
    LeaseRecord::Read read;
    const bool answered = Read(r.key, &read);
    if (answered) r.reads.push_back(read);
    if (answered && !read.found) break;
    SleepUntilNs(read.invoke_ns + 100 * kNsPerMs);
  }
  Save(r);
  return true;
}

void LeaseClient::Run(const std::atomic<bool>* stop) {
  while (!stop->load(std::memory_order_relaxed)) {
    if (!OneLease(stop)) std::this_thread::sleep_for(milliseconds(100));
  }
}

}  // namespace capstan::testing::cluster
