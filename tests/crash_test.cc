// Crash safety: writers run against a capstan that is killed with SIGKILL at
// random moments and restarted on the same data dir, again and again. Then
// every acknowledged write must be there, at its revision; the history has no
// partial txn; Range (the key index) agrees with the history read from
// storage at sampled revisions; HashKV at those revisions survives another
// crash; and a watcher that resumed from its last revision after every kill
// received exactly the history, no event missing, repeated or later lost.
//
// CAPSTAN_CRASH_KILLS sets the number of kills (default 8; `make soak` runs
// more).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "process_fixture.h"

namespace capstan::testing {
namespace {

using etcdserverpb::KV;
using etcdserverpb::Lease;
using etcdserverpb::Maintenance;

// One write a client sent: its outcome is known (acked) or not.
struct Write {
  enum Kind { kPut, kDelete, kTxn, kLease, kRevoke } kind;
  std::vector<std::pair<std::string, std::string>> kvs;  // puts (txn: all of them)
  std::string key;                                       // delete
  int64_t lease = 0;  // granted, revoked, or attached to the put
  int64_t rev = 0;      // response revision, when acked
  int64_t deleted = 0;  // delete: keys deleted
  bool acked = false;
};

std::unique_ptr<grpc::ClientContext> Deadline(int ms = 3000) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
  return ctx;
}

int KillCount() {
  const char* env = std::getenv("CAPSTAN_CRASH_KILLS");
  return env ? std::max(1, std::atoi(env)) : 8;
}

class Writer {
 public:
  Writer(int id, ServerProcess* server) : id_(id), server_(server), rng_(id * 7919 + 1) {}

  void Run(const std::atomic<bool>& stop) {
    auto channel = server_->NewChannel();
    auto kv = KV::NewStub(channel);
    auto lease = Lease::NewStub(channel);
    int seq = 0;
    while (!stop.load()) {
      Write w;
      const int dice = static_cast<int>(rng_() % 100);
      const std::string key = "/crash/w" + std::to_string(id_) + "/k" + std::to_string(rng_() % 50);
      const std::string value = "w" + std::to_string(id_) + "-" + std::to_string(seq++);
      grpc::Status st;
      if (dice < 55) {
        w.kind = Write::kPut;
        w.kvs = {{key, value}};
        etcdserverpb::PutRequest req;
        req.set_key(key);
        req.set_value(value);
        // A quarter of the puts attach their key to a live lease, so that
        // revocations delete keys.
        if (!live_leases_.empty() && rng_() % 4 == 0) {
          w.lease = live_leases_[rng_() % live_leases_.size()];
          req.set_lease(w.lease);
        }
        etcdserverpb::PutResponse resp;
        st = kv->Put(Deadline().get(), req, &resp);
        w.rev = resp.header().revision();
        // A revoke whose answer was lost may have happened.
        if (IsLeaseNotFound(st)) Forget(w.lease);
      } else if (dice < 68) {
        w.kind = Write::kDelete;
        w.key = key;
        etcdserverpb::DeleteRangeRequest req;
        req.set_key(key);
        etcdserverpb::DeleteRangeResponse resp;
        st = kv->DeleteRange(Deadline().get(), req, &resp);
        w.rev = resp.header().revision();
        w.deleted = resp.deleted();
      } else if (dice < 85) {
        // Two puts in one txn: all or nothing.
        w.kind = Write::kTxn;
        const std::string key2 = "/crash/w" + std::to_string(id_) + "/pair" + std::to_string(rng_() % 20);
        w.kvs = {{key, value}, {key2, value + "b"}};
        etcdserverpb::TxnRequest req;
        for (const auto& [k, v] : w.kvs) {
          auto* p = req.add_success()->mutable_request_put();
          p->set_key(k);
          p->set_value(v);
        }
        etcdserverpb::TxnResponse resp;
        st = kv->Txn(Deadline().get(), req, &resp);
        w.rev = resp.header().revision();
      } else if (dice < 93 || live_leases_.empty()) {
        w.kind = Write::kLease;
        etcdserverpb::LeaseGrantRequest req;
        req.set_ttl(3600);
        etcdserverpb::LeaseGrantResponse resp;
        st = lease->LeaseGrant(Deadline().get(), req, &resp);
        w.lease = resp.id();
        w.rev = resp.header().revision();
        if (st.ok()) live_leases_.push_back(w.lease);
      } else {
        w.kind = Write::kRevoke;
        w.lease = live_leases_[rng_() % live_leases_.size()];
        etcdserverpb::LeaseRevokeRequest req;
        req.set_id(w.lease);
        etcdserverpb::LeaseRevokeResponse resp;
        st = lease->LeaseRevoke(Deadline().get(), req, &resp);
        w.rev = resp.header().revision();
        // Revoked now, or by an earlier attempt whose answer was lost; an
        // attempt that failed otherwise may still have happened, so the
        // lease is not used again either way.
        Forget(w.lease);
      }
      w.acked = st.ok();
      writes_.push_back(std::move(w));
      if (!st.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  const std::vector<Write>& writes() const { return writes_; }

 private:
  static bool IsLeaseNotFound(const grpc::Status& st) {
    return st.error_code() == grpc::StatusCode::NOT_FOUND &&
           st.error_message() == "etcdserver: requested lease not found";
  }

  void Forget(int64_t lease) {
    live_leases_.erase(std::remove(live_leases_.begin(), live_leases_.end(), lease),
                       live_leases_.end());
  }

  const int id_;
  ServerProcess* const server_;
  std::mt19937_64 rng_;
  std::vector<Write> writes_;
  std::vector<int64_t> live_leases_;  // granted (acknowledged) and never revoked
};

// A watcher of /crash/ that lives through the kills: whenever its stream
// breaks it opens a new one from the revision after the last event it
// received, as a client resumes a watch after a server restart.
class ResumingWatcher {
 public:
  explicit ResumingWatcher(ServerProcess* server) : server_(server) {}

  void Run() {
    while (true) {
      auto stub = etcdserverpb::Watch::NewStub(server_->NewChannel());
      grpc::ClientContext ctx;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (done_) return;
        ctx_ = &ctx;
      }
      auto stream = stub->Watch(&ctx);
      etcdserverpb::WatchRequest req;
      auto* create = req.mutable_create_request();
      create->set_key("/crash/");
      create->set_range_end("/crash0");
      create->set_start_revision(next_rev_.load());
      if (stream->Write(req)) {
        etcdserverpb::WatchResponse resp;
        while (stream->Read(&resp)) {
          if (resp.canceled()) {
            std::lock_guard<std::mutex> lock(mu_);
            cancel_reason_ = resp.cancel_reason() + " compact_revision " +
                             std::to_string(resp.compact_revision());
            break;
          }
          if (resp.events().empty()) continue;
          std::lock_guard<std::mutex> lock(mu_);
          for (const auto& ev : resp.events()) events_.push_back(ev);
          next_rev_ = resp.events(resp.events_size() - 1).kv().mod_revision() + 1;
        }
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ctx_ = nullptr;
        ++streams_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // Waits until an event at rev or later arrived, up to timeout.
  bool WaitFor(int64_t rev, std::chrono::seconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (next_rev_.load() <= rev) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    if (ctx_ != nullptr) ctx_->TryCancel();
  }

  // REQUIRES: Run has returned.
  const std::vector<mvccpb::Event>& events() const { return events_; }
  int streams() const { return streams_; }
  const std::string& cancel_reason() const { return cancel_reason_; }

 private:
  ServerProcess* const server_;
  std::atomic<int64_t> next_rev_{1};
  mutable std::mutex mu_;
  bool done_ = false;                      // guarded by mu_
  grpc::ClientContext* ctx_ = nullptr;     // guarded by mu_: the open stream's
  std::vector<mvccpb::Event> events_;      // guarded by mu_
  int streams_ = 0;                        // guarded by mu_
  std::string cancel_reason_;              // guarded by mu_
};

// The keys under /crash/ at rev, from replaying the history up to rev.
std::map<std::string, std::string> StateAt(const std::vector<mvccpb::Event>& events, int64_t rev) {
  std::map<std::string, std::string> state;  // key -> serialized KeyValue
  for (const auto& ev : events) {
    if (ev.kv().mod_revision() > rev) break;
    if (ev.type() == mvccpb::Event::PUT) {
      state[ev.kv().key()] = ev.kv().SerializeAsString();
    } else {
      state.erase(ev.kv().key());
    }
  }
  return state;
}

// Every event since revision 1, from a watch.
std::vector<mvccpb::Event> History(ServerProcess* server, int64_t up_to) {
  auto stub = etcdserverpb::Watch::NewStub(server->NewChannel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto stream = stub->Watch(&ctx);
  etcdserverpb::WatchRequest req;
  auto* create = req.mutable_create_request();
  create->set_key("/crash/");
  create->set_range_end("/crash0");
  create->set_start_revision(1);
  EXPECT_TRUE(stream->Write(req));
  std::vector<mvccpb::Event> events;
  etcdserverpb::WatchResponse resp;
  while ((events.empty() || events.back().kv().mod_revision() < up_to) && stream->Read(&resp)) {
    for (const auto& ev : resp.events()) events.push_back(ev);
  }
  ctx.TryCancel();
  return events;
}

int64_t CurrentRevision(ServerProcess* server) {
  auto stub = Maintenance::NewStub(server->NewChannel());
  etcdserverpb::StatusResponse resp;
  EXPECT_TRUE(stub->Status(Deadline().get(), etcdserverpb::StatusRequest(), &resp).ok());
  return resp.header().revision();
}

uint32_t HashKvAt(ServerProcess* server, int64_t rev) {
  auto stub = Maintenance::NewStub(server->NewChannel());
  etcdserverpb::HashKVRequest req;
  req.set_revision(rev);
  etcdserverpb::HashKVResponse resp;
  EXPECT_TRUE(stub->HashKV(Deadline().get(), req, &resp).ok());
  return resp.hash();
}

TEST(CrashTest, AcknowledgedWritesSurviveSigkill) {
  auto started = ServerProcess::Start(ServerOptions::Capstan());
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<ServerProcess> server = std::move(*started);

  constexpr int kWriters = 4;
  std::vector<std::unique_ptr<Writer>> writers;
  for (int i = 0; i < kWriters; ++i) writers.push_back(std::make_unique<Writer>(i, server.get()));
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (auto& w : writers) threads.emplace_back([&w, &stop] { w->Run(stop); });
  ResumingWatcher watcher(server.get());
  std::thread watcher_thread([&watcher] { watcher.Run(); });
  // A failed assertion returns early: stop and join the threads first.
  auto join_all = absl::MakeCleanup([&] {
    stop = true;
    for (auto& t : threads) {
      if (t.joinable()) t.join();
    }
    watcher.Stop();
    if (watcher_thread.joinable()) watcher_thread.join();
  });

  std::mt19937 rng(42);
  const int kills = KillCount();
  for (int i = 0; i < kills; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200 + rng() % 800));
    server->Kill();
    auto s = server->Restart();
    ASSERT_TRUE(s.ok()) << "restart " << i << ": " << s << "\n" << server->ReadLog(4000);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  stop = true;
  for (auto& t : threads) t.join();

  // One more crash with nothing in flight, so recovery runs on the final state.
  server->Kill();
  ASSERT_TRUE(server->Restart().ok());
  {
    // A single member is a one-voter Raft group: every start is an election
    // (term 2 at the first, one more at each restart), and it leads.
    // The entry the new term starts with commits before it is applied, and
    // Status reports both indexes as they are: a linearizable read first
    // waits until everything committed before it is applied. The member
    // publishes its attributes through the log after it starts, so an entry
    // may commit between the read and the Status that follows it; what was
    // committed before the read is applied once it answers.
    auto maintenance = Maintenance::NewStub(server->NewChannel());
    etcdserverpb::StatusResponse before;
    ASSERT_TRUE(maintenance->Status(Deadline().get(), etcdserverpb::StatusRequest(), &before).ok());
    auto kv = KV::NewStub(server->NewChannel());
    etcdserverpb::RangeRequest read;
    read.set_key("a");
    etcdserverpb::RangeResponse read_resp;
    ASSERT_TRUE(kv->Range(Deadline().get(), read, &read_resp).ok());
    etcdserverpb::StatusResponse status;
    ASSERT_TRUE(maintenance->Status(Deadline().get(), etcdserverpb::StatusRequest(), &status).ok());
    EXPECT_EQ(status.raftterm(), static_cast<uint64_t>(kills) + 3);
    EXPECT_EQ(status.leader(), status.header().member_id());
    EXPECT_GE(status.raftappliedindex(), before.raftindex());
    EXPECT_LE(status.raftappliedindex(), status.raftindex());
  }

  std::vector<const Write*> all;
  int acked = 0;
  for (auto& w : writers) {
    for (const auto& write : w->writes()) {
      all.push_back(&write);
      acked += write.acked;
    }
  }
  ASSERT_GT(acked, 100) << "too few acknowledged writes to mean anything";

  const int64_t current = CurrentRevision(server.get());
  auto kv = KV::NewStub(server->NewChannel());
  auto lease = Lease::NewStub(server->NewChannel());

  // Revisions of acknowledged changes are unique and never beyond the store.
  std::set<int64_t> revisions;
  for (const Write* w : all) {
    if (!w->acked || w->kind == Write::kLease || w->kind == Write::kRevoke ||
        (w->kind == Write::kDelete && w->deleted == 0)) {
      continue;
    }
    EXPECT_TRUE(revisions.insert(w->rev).second) << "revision " << w->rev << " acknowledged twice";
    EXPECT_LE(w->rev, current);
  }

  // Leases with a revoke sent: whether it was acknowledged or not, the
  // grant is no longer expected to be alive.
  std::set<int64_t> revoke_sent;
  for (const Write* w : all) {
    if (w->kind == Write::kRevoke) revoke_sent.insert(w->lease);
  }

  // Every acknowledged write is there, at its revision.
  int checked = 0;
  for (const Write* w : all) {
    if (!w->acked) continue;
    if (w->kind == Write::kPut || w->kind == Write::kTxn) {
      for (const auto& [k, v] : w->kvs) {
        etcdserverpb::RangeRequest req;
        req.set_key(k);
        req.set_revision(w->rev);
        etcdserverpb::RangeResponse resp;
        ASSERT_TRUE(kv->Range(Deadline().get(), req, &resp).ok());
        ASSERT_EQ(resp.kvs_size(), 1) << "acknowledged put of " << k << " at " << w->rev << " lost";
        EXPECT_EQ(resp.kvs(0).value(), v);
        EXPECT_EQ(resp.kvs(0).mod_revision(), w->rev);
        ++checked;
      }
    } else if (w->kind == Write::kDelete && w->deleted > 0) {
      etcdserverpb::RangeRequest req;
      req.set_key(w->key);
      req.set_revision(w->rev);
      etcdserverpb::RangeResponse resp;
      ASSERT_TRUE(kv->Range(Deadline().get(), req, &resp).ok());
      EXPECT_EQ(resp.kvs_size(), 0) << "acknowledged delete of " << w->key << " at " << w->rev << " lost";
      ++checked;
    } else if (w->kind == Write::kLease && revoke_sent.count(w->lease) == 0) {
      etcdserverpb::LeaseTimeToLiveRequest req;
      req.set_id(w->lease);
      etcdserverpb::LeaseTimeToLiveResponse resp;
      ASSERT_TRUE(lease->LeaseTimeToLive(Deadline().get(), req, &resp).ok());
      EXPECT_GT(resp.ttl(), 0) << "acknowledged lease " << w->lease << " lost";
      ++checked;
    } else if (w->kind == Write::kRevoke) {
      etcdserverpb::LeaseTimeToLiveRequest req;
      req.set_id(w->lease);
      etcdserverpb::LeaseTimeToLiveResponse resp;
      ASSERT_TRUE(lease->LeaseTimeToLive(Deadline().get(), req, &resp).ok());
      if (w->acked) {
        EXPECT_EQ(resp.ttl(), -1) << "acknowledged revoke of " << w->lease << " undone";
        ++checked;
      }
    }
  }

  // History: events in strictly increasing revisions; a txn whose answer
  // never came is all there (at one revision) or not at all.
  const auto events = History(server.get(), current);
  std::map<std::string, int64_t> value_rev;
  int64_t last = 0;
  for (const auto& ev : events) {
    EXPECT_GE(ev.kv().mod_revision(), last);
    last = ev.kv().mod_revision();
    if (ev.type() == mvccpb::Event::PUT) value_rev[ev.kv().value()] = ev.kv().mod_revision();
  }
  for (const Write* w : all) {
    if (w->kind != Write::kTxn) continue;
    auto a = value_rev.find(w->kvs[0].second);
    auto b = value_rev.find(w->kvs[1].second);
    const bool has_a = a != value_rev.end(), has_b = b != value_rev.end();
    EXPECT_EQ(has_a, has_b) << "txn " << w->kvs[0].second << " partly applied";
    if (has_a && has_b) {
      EXPECT_EQ(a->second, b->second);
    }
    if (w->acked) {
      EXPECT_TRUE(has_a) << "acknowledged txn missing from history";
    }
  }

  // The watcher that resumed after every kill saw exactly this history: no
  // event missed or repeated, and none that a crash took back.
  ASSERT_TRUE(watcher.WaitFor(current, std::chrono::seconds(60)))
      << "the resumed watch never reached revision " << current;
  watcher.Stop();
  watcher_thread.join();
  EXPECT_EQ(watcher.cancel_reason(), "");
  ASSERT_EQ(watcher.events().size(), events.size()) << "resumed watch and history differ";
  for (size_t i = 0; i < events.size(); ++i) {
    ASSERT_EQ(watcher.events()[i].SerializeAsString(), events[i].SerializeAsString())
        << "event " << i << " at revision " << events[i].kv().mod_revision()
        << " differs between the resumed watch and the history";
  }

  // The key index agrees with storage: a Range at sampled revisions (the
  // index finds the revisions, storage the values) equals the state replayed
  // from the history (read from storage, revision by revision).
  std::vector<int64_t> sampled;
  for (int i = 1; i <= 10; ++i) sampled.push_back(std::max<int64_t>(1, current * i / 10));
  std::map<int64_t, uint32_t> hashes;
  for (int64_t rev : sampled) {
    etcdserverpb::RangeRequest req;
    req.set_key("/crash/");
    req.set_range_end("/crash0");
    req.set_revision(rev);
    etcdserverpb::RangeResponse resp;
    ASSERT_TRUE(kv->Range(Deadline(10000).get(), req, &resp).ok());
    std::map<std::string, std::string> got;
    for (const auto& kv_record : resp.kvs()) got[kv_record.key()] = kv_record.SerializeAsString();
    EXPECT_TRUE(got == StateAt(events, rev)) << "Range at " << rev << " differs from the history";
    hashes[rev] = HashKvAt(server.get(), rev);
  }

  // HashKV at each sampled revision is stable across another crash and restart.
  server->Kill();
  ASSERT_TRUE(server->Restart().ok());
  for (const auto& [rev, hash] : hashes) {
    EXPECT_EQ(HashKvAt(server.get(), rev), hash) << "HashKV at " << rev << " changed";
  }
  EXPECT_EQ(CurrentRevision(server.get()), current);

  std::printf(
      "crash test: %d kills, %zu writes sent, %d acknowledged, %d checked, revision %lld, "
      "%zu events through %d resumed watch streams\n",
      kills + 2, all.size(), acked, checked, static_cast<long long>(current), events.size(),
      watcher.streams());
}

}  // namespace
}  // namespace capstan::testing
