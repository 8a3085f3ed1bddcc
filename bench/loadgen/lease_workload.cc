// lease-keepalive: etcd's benchmark command of that name. Every client grants
// a lease (TTL 100 s) and then renews it with KeepAliveOnce, which opens a
// LeaseKeepAlive stream per request, as etcd's tool does. With --stream
// (capstan-bench only) every client instead keeps one LeaseKeepAlive stream
// open and renews through it one request at a time, as clientv3's KeepAlive
// loop does: the renewal path without the cost of opening a stream.

#include <memory>
#include <mutex>

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
    f.Bool("stream", &stream_, "One long-lived keep-alive stream per client (capstan-bench only)");
  }

  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    const int clients = std::max(1, ctx.global->clients);
    absl::StatusOr<std::vector<int64_t>> granted = GrantClientLeases(ctx, clients, 100);
    if (!granted.ok()) return granted.status();
    const std::vector<int64_t>& leases = *granted;
    LoopOptions o{"lease-keepalive", static_cast<uint64_t>(total_), absl::ZeroDuration(), clients,
                  0};
    // --stream: client i's stream and the completion of its request in flight.
    struct ClientStream {
      std::unique_ptr<KeepAliveStream> stream;
      std::mutex mu;
      DoneFn done;  // guarded by mu
    };
    std::vector<std::unique_ptr<ClientStream>> streams;
    if (stream_) {
      for (int i = 0; i < clients; ++i) {
        auto cs = std::make_unique<ClientStream>();
        ClientStream* raw = cs.get();
        cs->stream = std::make_unique<KeepAliveStream>(
            ctx.pool->Lease(i), [raw](const etcdserverpb::LeaseKeepAliveResponse& resp) {
              DoneFn done;
              {
                std::lock_guard<std::mutex> l(raw->mu);
                done.swap(raw->done);
              }
              if (!done) return;
              done(resp.ttl() > 0 ? grpc::Status::OK
                                  : grpc::Status(grpc::NOT_FOUND,
                                                 "etcdserver: requested lease not found"));
            });
        streams.push_back(std::move(cs));
      }
    }
    IssueFn issue = [&](uint64_t, size_t client, DoneFn done) {
      if (stream_) {
        ClientStream& cs = *streams[client];
        {
          std::lock_guard<std::mutex> l(cs.mu);
          cs.done = std::move(done);
        }
        etcdserverpb::LeaseKeepAliveRequest req;
        req.set_id(leases[client]);
        cs.stream->Send(std::move(req));
        return;
      }
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
    for (auto& cs : streams) {
      grpc::Status broken;
      if (cs->stream->Broken(&broken)) {
        r.phases.back().error_counts[broken.error_message()]++;
        r.phases.back().errors++;
      }
      cs->stream->Finish();
    }
    RevokeClientLeases(ctx, leases);
    return r;
  }

 private:
  int64_t total_ = 10000;
  bool stream_ = false;
};

}  // namespace

std::unique_ptr<Workload> NewLeaseKeepaliveWorkload() {
  return std::make_unique<LeaseKeepaliveWorkload>();
}

}  // namespace capstan::bench
