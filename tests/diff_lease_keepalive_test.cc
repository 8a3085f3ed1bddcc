// Differential tests of Lease.LeaseKeepAlive, which Capstan serves on gRPC's
// completion queues (server/api/completion_queues.h): renewals on one
// stream and on many at once, a lease that does not exist, and streams
// still open when the server stops.

#include <memory>
#include <string>
#include <vector>

#include "diff_fixture.h"
#include "gtest/gtest.h"

namespace capstan::testing {
namespace {

using etcdserverpb::LeaseKeepAliveRequest;
using etcdserverpb::LeaseKeepAliveResponse;

class DiffLeaseKeepAliveTest : public DiffTest {};

// One open keep-alive stream.
struct KeepAliveStream {
  explicit KeepAliveStream(ServerStubs& stubs) {
    ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
    stream = stubs.lease->LeaseKeepAlive(&ctx);
  }
  // Sends a renewal of `id` and reads its answer.
  bool Renew(int64_t id, LeaseKeepAliveResponse* resp) {
    LeaseKeepAliveRequest req;
    req.set_id(id);
    return stream->Write(req) && stream->Read(resp);
  }
  grpc::Status Close() {
    stream->WritesDone();
    LeaseKeepAliveResponse extra;
    while (stream->Read(&extra)) {
    }
    return stream->Finish();
  }

  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<LeaseKeepAliveRequest, LeaseKeepAliveResponse>> stream;
};

TEST_F(DiffLeaseKeepAliveTest, RenewalsOnOneStreamAndAMissingLease) {
  const int64_t id = GrantBoth(60);
  KeepAliveStream e(etcd_stubs()), c(capstan_stubs());
  for (int i = 0; i < 3; ++i) {
    LeaseKeepAliveResponse er, cr;
    ASSERT_TRUE(e.Renew(id, &er));
    ASSERT_TRUE(c.Renew(id, &cr));
    EXPECT_EQ(er.id(), id);
    EXPECT_EQ(cr.id(), id);
    EXPECT_EQ(er.ttl(), 60);
    EXPECT_EQ(cr.ttl(), 60);
    EXPECT_EQ(cr.header().revision(), er.header().revision());
  }
  // A lease that does not exist is answered with TTL 0, and the stream goes on.
  LeaseKeepAliveResponse er, cr;
  ASSERT_TRUE(e.Renew(id + 1000003, &er));
  ASSERT_TRUE(c.Renew(id + 1000003, &cr));
  EXPECT_EQ(er.ttl(), 0);
  EXPECT_EQ(cr.ttl(), 0);
  EXPECT_EQ(cr.id(), er.id());
  ASSERT_TRUE(e.Renew(id, &er));
  ASSERT_TRUE(c.Renew(id, &cr));
  EXPECT_EQ(cr.ttl(), er.ttl());
  grpc::Status es = e.Close(), cs = c.Close();
  EXPECT_TRUE(es.ok()) << es.error_message();
  EXPECT_TRUE(cs.ok()) << cs.error_message();
}

// More streams open at once than the server accepts ahead on its queues,
// each renewed in turn, and a stream per renewal as etcd's clients open.
TEST_F(DiffLeaseKeepAliveTest, ManyStreamsAtOnce) {
  const int64_t id = GrantBoth(30);
  constexpr int kStreams = 150;
  for (ServerStubs* stubs : {&etcd_stubs(), &capstan_stubs()}) {
    SCOPED_TRACE(stubs == &etcd_stubs() ? "etcd" : "capstan");
    std::vector<std::unique_ptr<KeepAliveStream>> open;
    for (int i = 0; i < kStreams; ++i) open.push_back(std::make_unique<KeepAliveStream>(*stubs));
    for (int round = 0; round < 2; ++round) {
      for (auto& s : open) {
        LeaseKeepAliveResponse r;
        ASSERT_TRUE(s->Renew(id, &r));
        ASSERT_EQ(r.ttl(), 30);
      }
    }
    for (auto& s : open) {
      grpc::Status st = s->Close();
      EXPECT_TRUE(st.ok()) << st.error_message();
    }
    for (int i = 0; i < kStreams; ++i) {
      KeepAliveStream once(*stubs);
      LeaseKeepAliveResponse r;
      ASSERT_TRUE(once.Renew(id, &r));
      EXPECT_EQ(r.ttl(), 30);
      EXPECT_TRUE(once.Close().ok());
    }
  }
}

// Streams still open when the servers stop: both stop cleanly (the fixture
// checks each exit), and the streams end with an error, not a hang.
TEST_F(DiffLeaseKeepAliveTest, OpenStreamsWhenTheServerStops) {
  const int64_t id = GrantBoth(60);
  std::vector<std::unique_ptr<KeepAliveStream>> etcd_streams, capstan_streams;
  for (int i = 0; i < 20; ++i) {
    etcd_streams.push_back(std::make_unique<KeepAliveStream>(etcd_stubs()));
    capstan_streams.push_back(std::make_unique<KeepAliveStream>(capstan_stubs()));
    LeaseKeepAliveResponse r;
    ASSERT_TRUE(etcd_streams.back()->Renew(id, &r));
    ASSERT_TRUE(capstan_streams.back()->Renew(id, &r));
  }
  ASSERT_TRUE(RestartBoth(/*crash=*/false).ok());
  for (auto* streams : {&etcd_streams, &capstan_streams}) {
    for (auto& s : *streams) {
      LeaseKeepAliveResponse r;
      EXPECT_FALSE(s->stream->Read(&r));
      EXPECT_FALSE(s->stream->Finish().ok());
    }
  }
  // The lease survived the restart on both, and new streams renew it.
  KeepAliveStream e(etcd_stubs()), c(capstan_stubs());
  LeaseKeepAliveResponse er, cr;
  ASSERT_TRUE(e.Renew(id, &er));
  ASSERT_TRUE(c.Renew(id, &cr));
  EXPECT_GT(er.ttl(), 0);
  EXPECT_GT(cr.ttl(), 0);
}

}  // namespace
}  // namespace capstan::testing
