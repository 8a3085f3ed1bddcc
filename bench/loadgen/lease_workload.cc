// lease-keepalive: etcd's benchmark command of that name. Every client grants
// a lease (TTL 100 s) and then renews it with KeepAliveOnce, which opens a
// LeaseKeepAlive stream per request, as etcd's tool does.

#include "absl/strings/str_cat.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/load_driver.h"
#include "bench/loadgen/streams.h"
#include "bench/loadgen/workload.h"

namespace capstan::bench {

namespace {

class LeaseKeepaliveWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.Int64("total", &total_, "Total number of lease keepalive requests");
  }

  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    const int clients = std::max(1, ctx.global->clients);
    std::vector<int64_t> leases(clients);
    for (int i = 0; i < clients; ++i) {
      grpc::ClientContext c;
      SetDeadline(&c);
      etcdserverpb::LeaseGrantRequest req;
      req.set_ttl(100);
      etcdserverpb::LeaseGrantResponse resp;
      grpc::Status s = ctx.pool->Lease(i).LeaseGrant(&c, req, &resp);
      if (!s.ok()) {
        return absl::UnavailableError(absl::StrCat("LeaseGrant: ", s.error_message()));
      }
      leases[i] = resp.id();
    }
    LoopOptions o{"lease-keepalive", static_cast<uint64_t>(total_), absl::ZeroDuration(), clients,
                  0};
    IssueFn issue = [&](uint64_t, size_t client, DoneFn done) {
      KeepAliveOnce(ctx.pool->Lease(client), leases[client],
                    [done = std::move(done)](const grpc::Status& s, int64_t ttl) {
                      if (s.ok() && ttl <= 0) {
                        done(grpc::Status(grpc::NOT_FOUND, "etcdserver: requested lease not found"));
                      } else {
                        done(s);
                      }
                    });
    };
    RunReport r;
    r.workload = "lease-keepalive";
    r.target = ctx.target;
    r.phases.push_back(RunClosedLoop(o, issue));
    for (int i = 0; i < clients; ++i) {
      grpc::ClientContext c;
      SetDeadline(&c);
      etcdserverpb::LeaseRevokeRequest req;
      req.set_id(leases[i]);
      etcdserverpb::LeaseRevokeResponse resp;
      ctx.pool->Lease(i).LeaseRevoke(&c, req, &resp);  // best effort clean-up
    }
    return r;
  }

 private:
  int64_t total_ = 10000;
};

}  // namespace

std::unique_ptr<Workload> NewLeaseKeepaliveWorkload() {
  return std::make_unique<LeaseKeepaliveWorkload>();
}

}  // namespace capstan::bench
