#include "cluster/kv_client.h"

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/client_context.h"

namespace capstan::testing::cluster {
namespace {

void SetDeadline(grpc::ClientContext* ctx, std::chrono::milliseconds timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
}

}  // namespace

KvClient::KvClient(int id, std::vector<std::string> endpoints, int first, History* history,
                   std::chrono::milliseconds timeout)
    : id_(id), endpoints_(std::move(endpoints)), history_(history), timeout_(timeout) {
  for (const std::string& e : endpoints_) {
    stubs_.push_back(etcdserverpb::KV::NewStub(NewMemberChannel(e)));
  }
  current_ = endpoints_.empty() ? 0 : first % static_cast<int>(endpoints_.size());
}

std::string KvClient::NextValue() { return absl::StrCat("c", id_, "-", ++seq_); }

etcdserverpb::KV::Stub* KvClient::Stub() { return stubs_[current_].get(); }

void KvClient::Failed(const grpc::Status&) {
  if (pinned_ < 0) current_ = (current_ + 1) % static_cast<int>(stubs_.size());
}

void KvClient::Finish(int64_t id, const grpc::Status& st, const Response& r, bool write) {
  if (st.ok()) {
    history_->CompleteOk(id, r);
  } else {
    std::string error = absl::StrCat("code ", st.error_code(), ": ", st.error_message());
    if (write) {
      history_->CompleteUnknown(id, std::move(error));
    } else {
      history_->CompleteFailed(id, std::move(error));
    }
    Failed(st);
  }
}

template <typename Call>
Operation KvClient::Record(Operation op, bool write, Call call) {
  op.endpoint = endpoints_[current_];
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout_);
  auto* stub = Stub();
  const int64_t id = history_->Invoke(std::move(op));
  Response r;
  const grpc::Status st = call(stub, &ctx, &r);
  Finish(id, st, r, write);
  return history_->At(id);
}

Operation KvClient::Put(const std::string& key, const std::string& value, bool prev_kv) {
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_prev_kv(prev_kv);
  return Record(Operation::Put(id_, key, value, prev_kv), true,
                [&req](etcdserverpb::KV::Stub* stub, grpc::ClientContext* ctx, Response* r) {
                  etcdserverpb::PutResponse resp;
                  grpc::Status st = stub->Put(ctx, req, &resp);
                  r->revision = resp.header().revision();
                  r->has_prev = resp.has_prev_kv();
                  if (r->has_prev) r->prev_value = resp.prev_kv().value();
                  return st;
                });
}

Operation KvClient::Get(const std::string& key, bool serializable) {
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  req.set_serializable(serializable);
  return Record(Operation::Get(id_, key, serializable), false,
                [&req](etcdserverpb::KV::Stub* stub, grpc::ClientContext* ctx, Response* r) {
                  etcdserverpb::RangeResponse resp;
                  grpc::Status st = stub->Range(ctx, req, &resp);
                  r->revision = resp.header().revision();
                  if (resp.kvs_size() > 0) {
                    r->found = true;
                    r->value = resp.kvs(0).value();
                    r->mod_revision = resp.kvs(0).mod_revision();
                  }
                  return st;
                });
}

Operation KvClient::Delete(const std::string& key, bool prev_kv) {
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(key);
  req.set_prev_kv(prev_kv);
  return Record(Operation::Delete(id_, key, prev_kv), true,
                [&req](etcdserverpb::KV::Stub* stub, grpc::ClientContext* ctx, Response* r) {
                  etcdserverpb::DeleteRangeResponse resp;
                  grpc::Status st = stub->DeleteRange(ctx, req, &resp);
                  r->revision = resp.header().revision();
                  r->deleted = resp.deleted();
                  if (resp.prev_kvs_size() > 0) {
                    r->has_prev = true;
                    r->prev_value = resp.prev_kvs(0).value();
                  }
                  return st;
                });
}

Operation KvClient::Cas(const std::string& key, const std::string& expected, bool expect_absent,
                        const std::string& value) {
  etcdserverpb::TxnRequest req;
  auto* cmp = req.add_compare();
  cmp->set_key(key);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  if (expect_absent) {
    cmp->set_target(etcdserverpb::Compare::CREATE);
    cmp->set_create_revision(0);
  } else {
    cmp->set_target(etcdserverpb::Compare::VALUE);
    cmp->set_value(expected);
  }
  return Txn(Operation::Cas(id_, key, expected, expect_absent, value), req);
}

Operation KvClient::CasModRevision(const std::string& key, int64_t mod_revision,
                                   const std::string& value) {
  etcdserverpb::TxnRequest req;
  auto* cmp = req.add_compare();
  cmp->set_key(key);
  cmp->set_result(etcdserverpb::Compare::EQUAL);
  cmp->set_target(etcdserverpb::Compare::MOD);
  cmp->set_mod_revision(mod_revision);
  return Txn(Operation::CasModRevision(id_, key, mod_revision, value), req);
}

Operation KvClient::Txn(Operation op, const etcdserverpb::TxnRequest& compare) {
  etcdserverpb::TxnRequest req = compare;
  auto* put = req.add_success()->mutable_request_put();
  put->set_key(op.key);
  put->set_value(op.value);
  req.add_failure()->mutable_request_range()->set_key(op.key);
  return Record(std::move(op), true,
                [&req](etcdserverpb::KV::Stub* stub, grpc::ClientContext* ctx, Response* r) {
                  etcdserverpb::TxnResponse resp;
                  grpc::Status st = stub->Txn(ctx, req, &resp);
                  r->revision = resp.header().revision();
                  r->succeeded = resp.succeeded();
                  if (!resp.succeeded() && resp.responses_size() > 0 &&
                      resp.responses(0).response_range().kvs_size() > 0) {
                    const auto& kv = resp.responses(0).response_range().kvs(0);
                    r->found = true;
                    r->value = kv.value();
                    r->mod_revision = kv.mod_revision();
                  }
                  return st;
                });
}

Operation KvClient::List(const std::string& key, const std::string& range_end, int64_t limit,
                         int64_t revision) {
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  req.set_range_end(range_end);
  req.set_limit(limit);
  req.set_revision(revision);
  return Record(Operation::List(id_, key, range_end, limit, revision), false,
                [&req](etcdserverpb::KV::Stub* stub, grpc::ClientContext* ctx, Response* r) {
                  etcdserverpb::RangeResponse resp;
                  grpc::Status st = stub->Range(ctx, req, &resp);
                  r->revision = resp.header().revision();
                  r->more = resp.more();
                  for (const auto& kv : resp.kvs()) {
                    r->kvs.push_back(Response::Kv{kv.key(), kv.value(), kv.mod_revision()});
                  }
                  return st;
                });
}

absl::StatusOr<std::vector<Event>> ReadEventLog(const std::string& endpoint,
                                                const std::string& prefix,
                                                int64_t last_revision,
                                                std::chrono::milliseconds timeout) {
  auto stub = etcdserverpb::Watch::NewStub(NewMemberChannel(endpoint));
  grpc::ClientContext ctx;
  SetDeadline(&ctx, timeout);
  auto stream = stub->Watch(&ctx);
  etcdserverpb::WatchRequest req;
  auto* create = req.mutable_create_request();
  create->set_key(prefix);
  create->set_range_end(PrefixEnd(prefix));
  create->set_start_revision(1);
  if (!stream->Write(req)) {
    return absl::UnavailableError(absl::StrCat("watch at ", endpoint, ": cannot send create"));
  }
  // Revisions made outside the prefix (a lease's key expiring) bring no
  // event: a progress notification, asked for every 100 ms, tells that
  // every event up to its revision has been sent.
  std::atomic<bool> done{false};
  std::thread progress([&] {
    etcdserverpb::WatchRequest ask;
    ask.mutable_progress_request();
    while (!done.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      if (!done.load() && !stream->Write(ask)) return;
    }
  });
  std::vector<Event> events;
  int64_t seen = 0;
  etcdserverpb::WatchResponse resp;
  while (seen < last_revision && stream->Read(&resp)) {
    if (resp.events_size() == 0 && !resp.created() && !resp.canceled() &&
        resp.compact_revision() == 0) {
      seen = std::max(seen, resp.header().revision());
      continue;
    }
    if (resp.compact_revision() != 0) {
      done = true;
      ctx.TryCancel();
      progress.join();
      return absl::OutOfRangeError(absl::StrCat("watch compacted at ", resp.compact_revision()));
    }
    if (resp.canceled()) {
      done = true;
      ctx.TryCancel();
      progress.join();
      return absl::AbortedError(absl::StrCat("watch canceled: ", resp.cancel_reason()));
    }
    for (const auto& e : resp.events()) {
      Event ev;
      ev.revision = e.kv().mod_revision();
      ev.key = e.kv().key();
      ev.is_delete = e.type() == mvccpb::Event::DELETE;
      if (!ev.is_delete) ev.value = e.kv().value();
      seen = std::max(seen, ev.revision);
      events.push_back(std::move(ev));
    }
  }
  done = true;
  ctx.TryCancel();
  progress.join();
  grpc::Status st = stream->Finish();
  if (seen < last_revision) {
    return absl::DeadlineExceededError(absl::StrCat(
        "watch at ", endpoint, " reached revision ", seen, " of ", last_revision, " (",
        st.error_message(), ")"));
  }
  return events;
}

void RunEtcdTraffic(KvClient* c, const std::string& prefix, int keys, uint32_t seed,
                    const std::atomic<bool>* stop) {
  std::mt19937 rng(seed);
  std::vector<std::string> last(keys);  // the last value this client saw per key
  while (!stop->load(std::memory_order_relaxed)) {
    const int k = static_cast<int>(rng() % keys);
    const std::string key = absl::StrCat(prefix, "k", k);
    const unsigned dice = rng() % 100;
    if (dice < 35) {
      Operation op = c->Get(key);
      if (op.outcome == Outcome::kOk) last[k] = op.response.found ? op.response.value : "";
    } else if (dice < 70) {
      std::string v = c->NextValue();
      Operation op = c->Put(key, v, rng() % 2 == 0);
      if (op.outcome == Outcome::kOk) last[k] = v;
    } else if (dice < 90) {
      std::string v = c->NextValue();
      Operation op = c->Cas(key, last[k], last[k].empty(), v);
      if (op.outcome == Outcome::kOk) {
        last[k] = op.response.succeeded ? v : (op.response.found ? op.response.value : "");
      }
    } else {
      Operation op = c->Delete(key, rng() % 2 == 0);
      if (op.outcome == Outcome::kOk) last[k] = "";
    }
  }
}

void RunKubernetesTraffic(KvClient* c, const std::string& prefix, int keys, uint32_t seed,
                          const std::atomic<bool>* stop, int page) {
  std::mt19937 rng(seed);
  while (!stop->load(std::memory_order_relaxed)) {
    const unsigned dice = rng() % 100;
    if (dice < 5) {
      // A LIST: the first page at the current revision, the others at its
      // revision, each starting just above the last key of the previous.
      Operation first = c->List(prefix, PrefixEnd(prefix), page, 0);
      if (first.outcome != Outcome::kOk) continue;
      const int64_t at = first.response.revision;
      Response last = first.response;
      while (last.more && !last.kvs.empty() && !stop->load(std::memory_order_relaxed)) {
        Operation next = c->List(last.kvs.back().key + '\0', PrefixEnd(prefix), page, at);
        if (next.outcome != Outcome::kOk) break;
        last = next.response;
      }
      continue;
    }
    const std::string key = absl::StrCat(prefix, "k", rng() % keys);
    // Every other path starts as the apiserver's does: from the current state.
    Operation read = c->Get(key);
    if (read.outcome != Outcome::kOk || dice < 30) continue;  // a GET
    if (!read.response.found) {
      c->CasModRevision(key, 0, c->NextValue());  // a create
    } else if (dice < 90) {
      // An update: compare-and-swap on the mod_revision read; on a conflict
      // the failed compare's range is the new state, retried up to 3 times.
      int64_t current = read.response.mod_revision;
      for (int attempt = 0; attempt < 3; ++attempt) {
        Operation cas = c->CasModRevision(key, current, c->NextValue());
        if (cas.outcome != Outcome::kOk || cas.response.succeeded || !cas.response.found) break;
        current = cas.response.mod_revision;
      }
    } else {
      c->Delete(key, /*prev_kv=*/true);
    }
  }
}

void RunCompactor(const std::vector<std::string>& endpoints, std::chrono::milliseconds interval,
                  const std::function<int64_t()>& safe, const std::atomic<bool>* stop,
                  std::atomic<int64_t>* compactions) {
  constexpr char kCompactRevKey[] = "compact_rev_key";
  std::vector<std::unique_ptr<etcdserverpb::KV::Stub>> stubs;
  for (const std::string& e : endpoints) {
    stubs.push_back(etcdserverpb::KV::NewStub(NewMemberChannel(e)));
  }
  size_t current = 0;
  int64_t version = 0;  // compact_rev_key's version this compactor last saw
  int64_t rev = 0;      // the revision the previous round read
  auto next_round = std::chrono::steady_clock::now() + interval;
  while (!stop->load(std::memory_order_relaxed)) {
    if (std::chrono::steady_clock::now() < next_round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    next_round += interval;
    etcdserverpb::TxnRequest req;
    auto* cmp = req.add_compare();
    cmp->set_key(kCompactRevKey);
    cmp->set_result(etcdserverpb::Compare::EQUAL);
    cmp->set_target(etcdserverpb::Compare::VERSION);
    cmp->set_version(version);
    auto* put = req.add_success()->mutable_request_put();
    put->set_key(kCompactRevKey);
    put->set_value(absl::StrCat(rev));
    req.add_failure()->mutable_request_range()->set_key(kCompactRevKey);
    etcdserverpb::TxnResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, std::chrono::milliseconds(2000));
    if (!stubs[current]->Txn(&ctx, req, &resp).ok()) {
      current = (current + 1) % stubs.size();
      continue;
    }
    const int64_t previous = rev;
    rev = resp.header().revision();
    if (!resp.succeeded()) {
      // Another compactor won this round: take its version.
      const auto& range = resp.responses(0).response_range();
      version = range.kvs_size() > 0 ? range.kvs(0).version() : 0;
      continue;
    }
    ++version;
    const int64_t target = std::min(previous, safe());
    if (target <= 0) continue;
    etcdserverpb::CompactionRequest compact;
    compact.set_revision(target);
    etcdserverpb::CompactionResponse compacted;
    grpc::ClientContext compact_ctx;
    SetDeadline(&compact_ctx, std::chrono::milliseconds(5000));
    if (stubs[current]->Compact(&compact_ctx, compact, &compacted).ok()) {
      compactions->fetch_add(1);
    } else {
      current = (current + 1) % stubs.size();
    }
  }
}

}  // namespace capstan::testing::cluster
