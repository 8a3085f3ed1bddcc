// lock: takes and releases locks through etcd's Lock service
// (v3lockpb.Lock), as clients of jetcd or the Rust etcd-client do. Every
// client grants itself a lease, then loops: Lock(name, lease), then Unlock
// of the key it got; one request is that pair, timed from the Lock to the
// Unlock's answer. With --names 0 (the default) each client has a lock of
// its own, so nobody waits; with --names N the clients share N locks, and
// a Lock waits while another client holds it (each release hands the lock
// to the next waiter through a watch, in the server).

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/load_driver.h"
#include "bench/loadgen/workload.h"

namespace capstan::bench {

namespace {

class LockWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.Int64("total", &total_, "Total number of lock and unlock pairs");
    f.Int("names", &names_, "Locks the clients share (0: one per client, uncontended)");
  }

  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    const int clients = std::max(1, ctx.global->clients);
    absl::StatusOr<std::vector<int64_t>> granted = GrantClientLeases(ctx, clients, 100);
    if (!granted.ok()) return granted.status();
    const std::vector<int64_t>& leases = *granted;
    LoopOptions o{"lock", static_cast<uint64_t>(total_), absl::ZeroDuration(), clients, 0};
    IssueFn issue = [&](uint64_t, size_t client, DoneFn done) {
      v3lockpb::Lock::Stub& stub = ctx.pool->Lock(client);
      v3lockpb::LockRequest lock;
      const size_t name = names_ > 0 ? client % static_cast<size_t>(names_) : client;
      lock.set_name(absl::StrCat("/bench/lock/", name));
      lock.set_lease(leases[client]);
      CallAsync<v3lockpb::LockResponse>(
          [&stub](auto* c, auto* q, auto* r, auto cb) { stub.async()->Lock(c, q, r, std::move(cb)); },
          std::move(lock),
          [&stub, done = std::move(done)](const grpc::Status& s,
                                          const v3lockpb::LockResponse& locked) mutable {
            if (!s.ok()) return done(s);
            v3lockpb::UnlockRequest unlock;
            unlock.set_key(locked.key());
            CallAsync<v3lockpb::UnlockResponse>(
                [&stub](auto* c, auto* q, auto* r, auto cb) {
                  stub.async()->Unlock(c, q, r, std::move(cb));
                },
                std::move(unlock),
                [done = std::move(done)](const grpc::Status& s, const v3lockpb::UnlockResponse&) {
                  done(s);
                });
          });
    };
    RunReport r;
    r.workload = "lock";
    r.target = ctx.target;
    r.phases.push_back(RunClosedLoop(o, issue));
    RevokeClientLeases(ctx, leases);
    return r;
  }

 private:
  int64_t total_ = 10000;
  int names_ = 0;
};

}  // namespace

std::unique_ptr<Workload> NewLockWorkload() { return std::make_unique<LockWorkload>(); }

}  // namespace capstan::bench
