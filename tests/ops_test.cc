// Operations end to end, against real etcd where the behaviour is observable
// the same way: the space quota and the NOSPACE alarm (raised, refused
// writes, what still works, persistence across restart, `etcdctl alarm
// disarm`), snapshot save/restore compared revision by revision, and the
// Prometheus metrics served at /metrics (names and types as etcd's, values
// that move with the requests).

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <ostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "diff_fixture.h"
#include "etcdctl_command.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "process_fixture.h"

namespace capstan::testing {

// gtest prints the parameter of QuotaTest with this (found by ADL).
void PrintTo(ServerFlavor flavor, std::ostream* os) { *os << FlavorName(flavor); }

namespace {

using etcdserverpb::AlarmRequest;
using etcdserverpb::AlarmResponse;
using etcdserverpb::AlarmType;

constexpr char kNoSpace[] = "etcdserver: mvcc: database space exceeded";
constexpr int64_t kQuotaBytes = 1 << 20;

std::unique_ptr<grpc::ClientContext> Deadline() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
  return ctx;
}

grpc::Status Put(ServerStubs& s, const std::string& key, const std::string& value,
                 int64_t lease = 0, int64_t* rev = nullptr) {
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  etcdserverpb::PutResponse resp;
  grpc::Status st = s.kv->Put(Deadline().get(), req, &resp);
  if (rev) *rev = resp.header().revision();
  return st;
}

// Every key at `rev` (0: current).
grpc::Status RangeAll(ServerStubs& s, int64_t rev, etcdserverpb::RangeResponse* resp) {
  etcdserverpb::RangeRequest req;
  req.set_key(std::string(1, '\0'));
  req.set_range_end(std::string(1, '\0'));
  req.set_revision(rev);
  return s.kv->Range(Deadline().get(), req, resp);
}

std::vector<etcdserverpb::AlarmMember> Alarms(ServerStubs& s) {
  AlarmRequest req;
  req.set_action(AlarmRequest::GET);
  AlarmResponse resp;
  EXPECT_TRUE(s.maintenance->Alarm(Deadline().get(), req, &resp).ok());
  return {resp.alarms().begin(), resp.alarms().end()};
}

// ---------------------------------------------------------------------------
// Quota and the NOSPACE alarm, the same test against etcd and Capstan.

class QuotaTest : public ::testing::TestWithParam<ServerFlavor> {};

TEST_P(QuotaTest, FillAlarmRecoverDisarm) {
  ServerOptions options = GetParam() == ServerFlavor::kEtcd ? ServerOptions::Etcd()
                                                            : ServerOptions::Capstan();
  options.extra_args = {"--quota-backend-bytes", std::to_string(kQuotaBytes)};
  auto server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ServerStubs s((*server)->NewChannel());

  // Fill: 20 KB values until the quota refuses one (etcd: ~45 of them into
  // 1 MiB). The refused write names the error etcd names.
  const std::string value(20000, 'x');
  int written = 0;
  grpc::Status st;
  while (written < 400) {
    st = Put(s, absl::StrCat("/quota/", written), value);
    if (!st.ok()) break;
    ++written;
  }
  ASSERT_FALSE(st.ok()) << "no NOSPACE after " << written << " puts";
  EXPECT_EQ(st.error_code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_EQ(st.error_message(), kNoSpace);
  EXPECT_GT(written, 10);

  // The alarm is raised, and stays: a small write is refused too.
  auto alarms = Alarms(s);
  ASSERT_EQ(alarms.size(), 1u);
  EXPECT_EQ(alarms[0].alarm(), AlarmType::NOSPACE);
  st = Put(s, "/quota/small", "v");
  EXPECT_EQ(st.error_code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_EQ(st.error_message(), kNoSpace);
  CommandResult list = EtcdctlCommand(**server, "alarm list");
  EXPECT_TRUE(list.exit.exited && list.exit.exit_code == 0) << list.err;
  EXPECT_NE(list.out.find("alarm:NOSPACE"), std::string::npos) << list.out;

  // Reads, deletes, compaction and defragmentation still work. The refused
  // put is not stored by Capstan, which checks the quota before applying.
  // etcd checks it twice: before proposing, against a size that moves only
  // when its backend commits (every 100 ms), and while applying, where a put
  // that crosses the quota is stored and still answered NOSPACE
  // (quotaApplierV3.Put); which of the two refuses it depends on timing.
  const int stored_refused = GetParam() == ServerFlavor::kEtcd ? 1 : 0;
  etcdserverpb::RangeResponse range;
  ASSERT_TRUE(RangeAll(s, 0, &range).ok());
  EXPECT_GE(range.count(), written);
  EXPECT_LE(range.count(), written + stored_refused);
  const int64_t stored = range.count();
  etcdserverpb::DeleteRangeRequest del;
  del.set_key("/quota/");
  del.set_range_end("/quota0");
  etcdserverpb::DeleteRangeResponse del_resp;
  ASSERT_TRUE(s.kv->DeleteRange(Deadline().get(), del, &del_resp).ok());
  EXPECT_EQ(del_resp.deleted(), stored);
  etcdserverpb::CompactionRequest compact;
  compact.set_revision(del_resp.header().revision());
  compact.set_physical(true);
  etcdserverpb::CompactionResponse compact_resp;
  ASSERT_TRUE(s.kv->Compact(Deadline().get(), compact, &compact_resp).ok());
  etcdserverpb::DefragmentResponse defrag_resp;
  ASSERT_TRUE(s.maintenance->Defragment(Deadline().get(), {}, &defrag_resp).ok());
  etcdserverpb::StatusResponse status;
  ASSERT_TRUE(s.maintenance->Status(Deadline().get(), {}, &status).ok());
  EXPECT_LT(status.dbsize(), kQuotaBytes);
  ASSERT_EQ(status.errors_size(), 1);
  EXPECT_NE(status.errors(0).find("alarm:NOSPACE"), std::string::npos) << status.errors(0);

  // Freeing space does not clear the alarm, and neither does a restart.
  EXPECT_EQ(Put(s, "/quota/small", "v").error_code(), grpc::RESOURCE_EXHAUSTED);
  (*server)->Stop();
  ASSERT_TRUE((*server)->Restart().ok()) << (*server)->ReadLog(2000);
  ServerStubs after((*server)->NewChannel());
  ASSERT_EQ(Alarms(after).size(), 1u);
  st = Put(after, "/quota/small", "v");
  EXPECT_EQ(st.error_code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_EQ(st.error_message(), kNoSpace);

  // The operator disarms it as with etcd; writes go through again.
  CommandResult disarm = EtcdctlCommand(**server, "alarm disarm");
  EXPECT_TRUE(disarm.exit.exited && disarm.exit.exit_code == 0) << disarm.err;
  EXPECT_NE(disarm.out.find("alarm:NOSPACE"), std::string::npos) << disarm.out;
  EXPECT_TRUE(Alarms(after).empty());
  EXPECT_TRUE(Put(after, "/quota/small", "v").ok());
  (*server)->Stop();
  ASSERT_TRUE((*server)->Restart().ok());
  ServerStubs restarted((*server)->NewChannel());
  EXPECT_TRUE(Alarms(restarted).empty());
}

INSTANTIATE_TEST_SUITE_P(EtcdAndCapstan, QuotaTest,
                         ::testing::Values(ServerFlavor::kEtcd, ServerFlavor::kCapstan),
                         [](const auto& info) { return std::string(FlavorName(info.param)); });

// etcdctl's maintenance commands not covered by diff_foundation_test, the
// same on both servers.
class DiffOpsTest : public DiffTest {};

TEST_F(DiffOpsTest, EtcdctlAlarmDisarmWithoutAlarms) {
  EXPECT_SAME_CTL(Etcdctl({"alarm", "disarm"}, "", /*json=*/false));
  EXPECT_SAME_CTL(Etcdctl({"alarm", "disarm"}));
}

TEST_F(DiffOpsTest, EtcdctlCompactionThenHashKVAtRevision) {
  PutBoth(K("a"), "1");
  const int64_t rev = PutBoth(K("a"), "2");
  PutBoth(K("b"), "1");
  EXPECT_SAME_CTL(Etcdctl({"compaction", std::to_string(rev)}, "", /*json=*/false));
  EXPECT_SAME_CTL(Etcdctl({"endpoint", "hashkv", "--rev", std::to_string(rev + 1)}));
  // Below the compaction: the same error from both.
  EXPECT_SAME_CTL(Etcdctl({"endpoint", "hashkv", "--rev", std::to_string(rev - 1)}));
}

// ---------------------------------------------------------------------------
// Snapshot save (etcdctl, from Capstan); status and restore by capstan and by
// etcdctl (into a real etcd), compared with the source.

TEST(SnapshotTest, SaveRestoreEveryRevision) {
  auto source = ServerProcess::Start(ServerOptions::Capstan());
  ASSERT_TRUE(source.ok()) << source.status();
  ServerStubs s((*source)->NewChannel());

  // History: overwrites, deletes, a txn, a key on a lease, a compaction.
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(600);
  etcdserverpb::LeaseGrantResponse lease;
  ASSERT_TRUE(s.lease->LeaseGrant(Deadline().get(), grant, &lease).ok());
  for (int round = 0; round < 4; ++round) {
    for (int k = 0; k < 10; ++k) {
      ASSERT_TRUE(Put(s, absl::StrCat("/snap/", k), absl::StrCat("v", round, "-", k)).ok());
    }
  }
  ASSERT_TRUE(Put(s, "/snap/leased", "l", lease.id()).ok());
  etcdserverpb::DeleteRangeRequest del;
  del.set_key("/snap/3");
  etcdserverpb::DeleteRangeResponse del_resp;
  ASSERT_TRUE(s.kv->DeleteRange(Deadline().get(), del, &del_resp).ok());
  const int64_t compact_rev = del_resp.header().revision() - 20;
  etcdserverpb::CompactionRequest compact;
  compact.set_revision(compact_rev);
  etcdserverpb::CompactionResponse compact_resp;
  ASSERT_TRUE(s.kv->Compact(Deadline().get(), compact, &compact_resp).ok());
  etcdserverpb::TxnRequest txn;
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key("/snap/txn");
  put->set_value("t");
  txn.add_success()->mutable_request_delete_range()->set_key("/snap/4");
  etcdserverpb::TxnResponse txn_resp;
  ASSERT_TRUE(s.kv->Txn(Deadline().get(), txn, &txn_resp).ok());
  const int64_t current = txn_resp.header().revision();

  TempDir dir("capstan-snapshot");
  const std::string file = dir.path() + "/snap.db";
  CommandResult save = EtcdctlCommand(**source, "snapshot save " + file);
  ASSERT_TRUE(save.exit.exited && save.exit.exit_code == 0) << save.err;

  // capstan snapshot status reads and prints it as etcdctl does.
  CommandResult st;
  for (const std::string format : {"simple", "table", "json"}) {
    st = RunCommand({CapstanBinary(), "snapshot", "status", file, "-w", format});
    ASSERT_TRUE(st.exit.exited && st.exit.exit_code == 0) << st.err;
    CommandResult etcd_st = RunCommand({EtcdctlBinary(), "snapshot", "status", file, "-w", format});
    ASSERT_TRUE(etcd_st.exit.exited && etcd_st.exit.exit_code == 0) << etcd_st.err;
    EXPECT_EQ(st.out, etcd_st.out) << format;
  }
  google::protobuf::Value json;
  ASSERT_TRUE(ParseJson(st.out, &json)) << st.out;
  EXPECT_EQ(json.struct_value().fields().at("revision").number_value(), current);

  // Without its SHA-256 trailer it is a bare db file: refused, as etcdctl
  // refuses it, and nothing is written.
  const std::string bare = dir.path() + "/bare.db";
  std::filesystem::copy_file(file, bare);
  std::filesystem::resize_file(bare, std::filesystem::file_size(file) - 32);
  CommandResult refused =
      RunCommand({CapstanBinary(), "snapshot", "restore", bare, "--data-dir", dir.path() + "/r"});
  EXPECT_EQ(refused.exit.exit_code, 1) << refused.out;
  EXPECT_TRUE(absl::StrContains(refused.err, "no SHA-256 trailer")) << refused.err;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/r"));

  // Restored by capstan into a new Capstan, and by etcdctl into a new etcd:
  // both hold the same history as the source.
  auto restored = ServerProcess::Start(ServerOptions::Capstan());
  ASSERT_TRUE(restored.ok()) << restored.status();
  (*restored)->Stop();
  ASSERT_TRUE(RemoveTree((*restored)->data_dir()));
  CommandResult restore =
      RunCommand({CapstanBinary(), "snapshot", "restore", file, "--data-dir", (*restored)->data_dir()});
  ASSERT_TRUE(restore.exit.exited && restore.exit.exit_code == 0) << restore.err;
  ASSERT_TRUE((*restored)->Restart().ok()) << (*restored)->ReadLog(2000);

  auto etcd = ServerProcess::Start(ServerOptions::Etcd());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  (*etcd)->Stop();
  ASSERT_TRUE(RemoveTree((*etcd)->data_dir()));
  CommandResult etcd_restore = RunCommand(
      {EtcdctlBinary(), "snapshot", "restore", file, "--data-dir", (*etcd)->data_dir(), "--name",
       "default", "--initial-cluster", "default=" + (*etcd)->peer_url(),
       "--initial-advertise-peer-urls", (*etcd)->peer_url()},
      "", std::chrono::seconds(30));
  ASSERT_TRUE(etcd_restore.exit.exited && etcd_restore.exit.exit_code == 0) << etcd_restore.err;
  ASSERT_TRUE((*etcd)->Restart().ok()) << (*etcd)->ReadLog(2000);

  for (const ServerProcess* server : {restored->get(), etcd->get()}) {
    SCOPED_TRACE(FlavorName(server->flavor()));
    ServerStubs r(server->NewChannel());
    // Every key at every retained revision; compacted ones refused alike.
    for (int64_t rev = compact_rev - 1; rev <= current + 1; ++rev) {
      etcdserverpb::RangeResponse want, got;
      grpc::Status want_st = RangeAll(s, rev, &want);
      grpc::Status got_st = RangeAll(r, rev, &got);
      ASSERT_EQ(want_st.error_code(), got_st.error_code()) << "rev " << rev;
      EXPECT_EQ(want_st.error_message(), got_st.error_message()) << "rev " << rev;
      EXPECT_EQ(want.header().revision(), got.header().revision());
      ASSERT_EQ(want.kvs_size(), got.kvs_size()) << "rev " << rev;
      for (int i = 0; i < want.kvs_size(); ++i) {
        EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(want.kvs(i), got.kvs(i)))
            << "rev " << rev << ": " << want.kvs(i).ShortDebugString() << " vs "
            << got.kvs(i).ShortDebugString();
      }
    }
    etcdserverpb::HashKVResponse want_hash, got_hash;
    ASSERT_TRUE(s.maintenance->HashKV(Deadline().get(), {}, &want_hash).ok());
    ASSERT_TRUE(r.maintenance->HashKV(Deadline().get(), {}, &got_hash).ok());
    EXPECT_EQ(want_hash.hash(), got_hash.hash());
    EXPECT_EQ(want_hash.compact_revision(), got_hash.compact_revision());
    // The lease and its key came along.
    etcdserverpb::LeaseTimeToLiveRequest ttl;
    ttl.set_id(lease.id());
    ttl.set_keys(true);
    etcdserverpb::LeaseTimeToLiveResponse ttl_resp;
    ASSERT_TRUE(r.lease->LeaseTimeToLive(Deadline().get(), ttl, &ttl_resp).ok());
    EXPECT_EQ(ttl_resp.grantedttl(), 600);
    ASSERT_EQ(ttl_resp.keys_size(), 1);
    EXPECT_EQ(ttl_resp.keys(0), "/snap/leased");
  }
}

// A client that leaves a snapshot stream early ends it: the server goes on
// serving, later snapshots are whole, and no checkpoint is left behind.
TEST(SnapshotTest, ClientThatLeavesMidStream) {
  auto server = ServerProcess::Start(ServerOptions::Capstan());
  ASSERT_TRUE(server.ok()) << server.status();
  ServerStubs s((*server)->NewChannel());
  int64_t rev = 0;
  // 16 MiB: far more than the server queues ahead of a client (2 MiB).
  for (int i = 0; i < 256; ++i) {
    ASSERT_TRUE(Put(s, absl::StrCat("/leave/", i), std::string(64 << 10, 'v'), 0, &rev).ok());
  }
  for (int round = 0; round < 3; ++round) {
    grpc::ClientContext ctx;
    auto reader = s.maintenance->Snapshot(&ctx, etcdserverpb::SnapshotRequest());
    etcdserverpb::SnapshotResponse first;
    ASSERT_TRUE(reader->Read(&first)) << round;
    EXPECT_GT(first.remaining_bytes(), 16u << 20);
    if (round > 0) std::this_thread::sleep_for(std::chrono::milliseconds(200 * round));
    ctx.TryCancel();
    EXPECT_EQ(reader->Finish().error_code(), grpc::CANCELLED);
  }
  TempDir dir("capstan-snapshot-leave");
  const std::string file = dir.path() + "/snap.db";
  CommandResult save = EtcdctlCommand(**server, "snapshot save " + file);
  ASSERT_TRUE(save.exit.exited && save.exit.exit_code == 0) << save.err;
  CommandResult st = RunCommand({EtcdctlBinary(), "snapshot", "status", file, "-w", "json"});
  ASSERT_TRUE(st.exit.exited && st.exit.exit_code == 0) << st.err;
  google::protobuf::Value json;
  ASSERT_TRUE(ParseJson(st.out, &json)) << st.out;
  EXPECT_EQ(json.struct_value().fields().at("revision").number_value(), rev);
  // Each cancelled stream's producer removes its checkpoint as it stops.
  bool left = true;
  for (int i = 0; i < 100 && left; ++i) {
    left = false;
    for (const auto& e : std::filesystem::directory_iterator((*server)->data_dir())) {
      left |= e.path().filename().string().find(".snapshot-") != std::string::npos;
    }
    if (left) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_FALSE(left) << "a snapshot checkpoint is left in " << (*server)->data_dir();
}

// ---------------------------------------------------------------------------
// /metrics.

// Prometheus text: family types, and sample values by "name{labels}".
struct Scrape {
  std::map<std::string, std::string> types;
  std::map<std::string, double> samples;

  double Value(const std::string& sample) const {
    auto it = samples.find(sample);
    return it == samples.end() ? 0 : it->second;
  }
};

Scrape ScrapeMetrics(const ServerProcess& server) {
  Scrape out;
  httplib::Client client("127.0.0.1", server.metrics_port());
  auto res = client.Get("/metrics");
  EXPECT_TRUE(res && res->status == 200);
  if (!res) return out;
  EXPECT_NE(res->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  for (absl::string_view line : absl::StrSplit(res->body, '\n', absl::SkipEmpty())) {
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ');
    if (line.substr(0, 7) == "# TYPE " && words.size() == 4) {
      out.types[std::string(words[2])] = std::string(words[3]);
    } else if (line[0] != '#') {
      const size_t space = line.rfind(' ');
      double v = 0;
      EXPECT_TRUE(absl::SimpleAtod(line.substr(space + 1), &v)) << line;
      out.samples[std::string(line.substr(0, space))] = v;
    }
  }
  return out;
}

// Polls sample `name` of server's /metrics until `done` holds of it (at most
// 15 s), and returns its last value.
double AwaitMetric(const ServerProcess& server, const std::string& name,
                   const std::function<bool(double)>& done) {
  const auto deadline = absl::Now() + absl::Seconds(15);
  double v = ScrapeMetrics(server).Value(name);
  while (!done(v) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));  // polling a condition, with a deadline
    v = ScrapeMetrics(server).Value(name);
  }
  return v;
}

// A Capstan and an etcd 3.5, each with `extra` flags, for a test that runs
// the same steps on both (Capstan first); none when either did not start,
// which fails the test.
std::vector<std::unique_ptr<ServerProcess>> StartCapstanAndEtcd(
    const std::vector<std::string>& extra = {}) {
  std::vector<std::unique_ptr<ServerProcess>> servers;
  for (ServerOptions o : {ServerOptions::Capstan(), ServerOptions::Etcd()}) {
    o.extra_args.insert(o.extra_args.end(), extra.begin(), extra.end());
    auto started = ServerProcess::Start(o);
    if (!started.ok()) {
      ADD_FAILURE() << FlavorName(o.flavor) << ": " << started.status();
      return {};
    }
    servers.push_back(std::move(*started));
  }
  return servers;
}

// etcd's keys gauge counts live keys: a put of a new key adds one, a delete
// takes one away at once (not when a compaction drops the tombstone).
TEST(MetricsTest, KeysGaugeCountsLiveKeysAsEtcd) {
  auto capstan = ServerProcess::Start(ServerOptions::Capstan());
  ASSERT_TRUE(capstan.ok()) << capstan.status();
  auto etcd = ServerProcess::Start(ServerOptions::Etcd());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  ServerStubs c((*capstan)->NewChannel()), e((*etcd)->NewChannel());
  auto keys_total = [](const ServerProcess& server) {
    return ScrapeMetrics(server).Value("etcd_debugging_mvcc_keys_total");
  };
  for (ServerStubs* s : {&c, &e}) {
    for (const char* key : {"/g/a", "/g/b", "/g/c", "/g/a"}) ASSERT_TRUE(Put(*s, key, "v").ok());
  }
  EXPECT_EQ(keys_total(**capstan), 3);
  EXPECT_EQ(keys_total(**etcd), 3);
  for (ServerStubs* s : {&c, &e}) {
    etcdserverpb::DeleteRangeRequest del;
    del.set_key("/g/b");
    etcdserverpb::DeleteRangeResponse resp;
    ASSERT_TRUE(s->kv->DeleteRange(Deadline().get(), del, &resp).ok());
    ASSERT_TRUE(Put(*s, "/g/d", "v").ok());
  }
  EXPECT_EQ(keys_total(**capstan), 3);
  EXPECT_EQ(keys_total(**etcd), 3);
}

// etcd's client traffic counters count each message's encoding as its codec
// does: the bytes of every request received and every answer sent, here
// those of a put, a range, a lease grant, a keep-alive and a watch's
// creation and event (the methods that read raw bytes, the decoding ones
// and both kinds of stream).
TEST(MetricsTest, ClientTrafficCountsMessageBytesAsEtcd) {
  const auto servers = StartCapstanAndEtcd();
  ASSERT_EQ(servers.size(), 2u);
  for (const auto& server : servers) {
    const std::string who = FlavorName(server->flavor());
    ServerStubs s(server->NewChannel());
    auto value = [&](const char* name) { return ScrapeMetrics(*server).Value(name); };
    const double received_before = value("etcd_network_client_grpc_received_bytes_total");
    const double sent_before = value("etcd_network_client_grpc_sent_bytes_total");
    size_t received = 0, sent = 0;

    grpc::ClientContext watch_ctx;
    auto stream = s.watch->Watch(&watch_ctx);
    etcdserverpb::WatchRequest create;
    create.mutable_create_request()->set_key("/traffic/key");
    create.mutable_create_request()->set_prev_kv(true);
    ASSERT_TRUE(stream->Write(create)) << who;
    received += create.ByteSizeLong();
    etcdserverpb::WatchResponse created;
    ASSERT_TRUE(stream->Read(&created)) << who;
    ASSERT_TRUE(created.created()) << who;
    sent += created.ByteSizeLong();

    etcdserverpb::PutRequest put;
    put.set_key("/traffic/key");
    put.set_value(std::string(1000, 'v'));
    etcdserverpb::PutResponse put_resp;
    ASSERT_TRUE(s.kv->Put(Deadline().get(), put, &put_resp).ok()) << who;
    received += put.ByteSizeLong();
    sent += put_resp.ByteSizeLong();
    etcdserverpb::WatchResponse event;
    ASSERT_TRUE(stream->Read(&event)) << who;
    ASSERT_EQ(event.events_size(), 1) << who;
    sent += event.ByteSizeLong();

    etcdserverpb::RangeRequest range;
    range.set_key("/traffic/");
    range.set_range_end("/traffic0");
    etcdserverpb::RangeResponse range_resp;
    ASSERT_TRUE(s.kv->Range(Deadline().get(), range, &range_resp).ok()) << who;
    ASSERT_EQ(range_resp.kvs_size(), 1) << who;
    received += range.ByteSizeLong();
    sent += range_resp.ByteSizeLong();

    etcdserverpb::LeaseGrantRequest grant;
    grant.set_ttl(60);
    etcdserverpb::LeaseGrantResponse granted;
    ASSERT_TRUE(s.lease->LeaseGrant(Deadline().get(), grant, &granted).ok()) << who;
    received += grant.ByteSizeLong();
    sent += granted.ByteSizeLong();
    {
      auto ctx = Deadline();
      auto keep_alive = s.lease->LeaseKeepAlive(ctx.get());
      etcdserverpb::LeaseKeepAliveRequest req;
      req.set_id(granted.id());
      ASSERT_TRUE(keep_alive->Write(req)) << who;
      received += req.ByteSizeLong();
      etcdserverpb::LeaseKeepAliveResponse resp;
      ASSERT_TRUE(keep_alive->Read(&resp)) << who;
      sent += resp.ByteSizeLong();
      keep_alive->WritesDone();
      while (keep_alive->Read(&resp)) {
      }
      EXPECT_TRUE(keep_alive->Finish().ok()) << who;
    }
    EXPECT_EQ(value("etcd_network_client_grpc_received_bytes_total") - received_before,
              static_cast<double>(received))
        << who;
    EXPECT_EQ(value("etcd_network_client_grpc_sent_bytes_total") - sent_before,
              static_cast<double>(sent))
        << who;
    watch_ctx.TryCancel();
    etcdserverpb::WatchResponse rest;
    while (stream->Read(&rest)) {
    }
  }
}

// etcd's maintenance timings move alike: a physical compaction, a
// defragmentation, a Hash, a HashKV and a snapshot each add one
// observation, and the compaction counts the revisions it deleted.
TEST(MetricsTest, MaintenanceTimingsAsEtcd) {
  const auto servers = StartCapstanAndEtcd();
  ASSERT_EQ(servers.size(), 2u);
  for (const auto& server : servers) {
    const std::string who = FlavorName(server->flavor());
    ServerStubs s(server->NewChannel());
    auto value = [&](const std::string& name) { return ScrapeMetrics(*server).Value(name); };
    const Scrape before = ScrapeMetrics(*server);
    for (const char* name :
         {"etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds_count",
          "etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds_count",
          "etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count",
          "etcd_debugging_mvcc_db_compaction_keys_total", "etcd_debugging_mvcc_db_compaction_last",
          "etcd_disk_backend_defrag_duration_seconds_count", "etcd_disk_defrag_inflight",
          "etcd_mvcc_hash_duration_seconds_count", "etcd_mvcc_hash_rev_duration_seconds_count",
          "etcd_disk_backend_snapshot_duration_seconds_count"}) {
      EXPECT_EQ(before.samples.count(name), 1u) << who << ": " << name;
      EXPECT_EQ(before.Value(name), 0) << who << ": " << name;
    }
    // Three revisions of a key; a compaction at the last deletes two.
    int64_t rev = 0;
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(Put(s, "/maint/key", "v", 0, &rev).ok()) << who;
    etcdserverpb::CompactionRequest compact;
    compact.set_revision(rev);
    compact.set_physical(true);
    etcdserverpb::CompactionResponse compacted;
    ASSERT_TRUE(s.kv->Compact(Deadline().get(), compact, &compacted).ok()) << who;
    EXPECT_EQ(value("etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds_count"), 1)
        << who;
    EXPECT_EQ(value("etcd_debugging_mvcc_db_compaction_total_duration_milliseconds_count"), 1)
        << who;
    // A pause is a full batch's (1,000 revisions by default): none here.
    EXPECT_EQ(value("etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds_count"), 0)
        << who;
    EXPECT_EQ(value("etcd_debugging_mvcc_db_compaction_keys_total"), 2) << who;
    EXPECT_GT(value("etcd_debugging_mvcc_db_compaction_last"), 1.7e9) << who;

    etcdserverpb::DefragmentResponse defragmented;
    ASSERT_TRUE(
        s.maintenance->Defragment(Deadline().get(), etcdserverpb::DefragmentRequest(), &defragmented)
            .ok())
        << who;
    EXPECT_EQ(value("etcd_disk_backend_defrag_duration_seconds_count"), 1) << who;
    EXPECT_EQ(value("etcd_disk_defrag_inflight"), 0) << who;

    etcdserverpb::HashResponse hash;
    ASSERT_TRUE(s.maintenance->Hash(Deadline().get(), etcdserverpb::HashRequest(), &hash).ok())
        << who;
    etcdserverpb::HashKVResponse hash_kv;
    ASSERT_TRUE(
        s.maintenance->HashKV(Deadline().get(), etcdserverpb::HashKVRequest(), &hash_kv).ok())
        << who;
    EXPECT_EQ(value("etcd_mvcc_hash_duration_seconds_count"), 1) << who;
    EXPECT_EQ(value("etcd_mvcc_hash_rev_duration_seconds_count"), 1) << who;

    {
      auto ctx = Deadline();
      auto stream = s.maintenance->Snapshot(ctx.get(), etcdserverpb::SnapshotRequest());
      etcdserverpb::SnapshotResponse chunk;
      while (stream->Read(&chunk)) {
      }
      ASSERT_TRUE(stream->Finish().ok()) << who;
    }
    // Recorded as the server lets the stream go, after the client saw its end.
    EXPECT_EQ(AwaitMetric(*server, "etcd_disk_backend_snapshot_duration_seconds_count",
                          [](double v) { return v >= 1; }),
              1)
        << who;
  }
}

// etcd's apply timings move alike: each write applied adds one observation
// to its op's series (success or not), and with a warning duration every
// apply exceeds, each is counted slow and logged as etcd logs it, and so is
// a Range.
TEST(MetricsTest, ApplyDurationsAsEtcd) {
  const auto servers = StartCapstanAndEtcd({"--experimental-warning-apply-duration=1ns"});
  ASSERT_EQ(servers.size(), 2u);
  for (const auto& server : servers) {
    const std::string who = FlavorName(server->flavor());
    ServerStubs s(server->NewChannel());
    const Scrape before = ScrapeMetrics(*server);
    auto series = [](const char* op, bool success) {
      return absl::StrCat(R"(etcd_server_apply_duration_seconds_count{op=")", op,
                          R"(",success=")", success ? "true" : "false", R"(",version="v3"})");
    };
    int64_t rev = 0;
    ASSERT_TRUE(Put(s, "/apply/a", "v", 0, &rev).ok()) << who;
    ASSERT_TRUE(Put(s, "/apply/a", "w", 0, &rev).ok()) << who;
    etcdserverpb::TxnRequest txn;
    auto* cmp = txn.add_compare();
    cmp->set_key("/apply/a");
    cmp->set_target(etcdserverpb::Compare::VERSION);
    cmp->set_version(2);
    txn.add_success()->mutable_request_put()->set_key("/apply/b");
    etcdserverpb::TxnResponse txn_resp;
    ASSERT_TRUE(s.kv->Txn(Deadline().get(), txn, &txn_resp).ok()) << who;
    etcdserverpb::CompactionRequest compact;
    compact.set_revision(rev);
    etcdserverpb::CompactionResponse compacted;
    ASSERT_TRUE(s.kv->Compact(Deadline().get(), compact, &compacted).ok()) << who;
    etcdserverpb::LeaseGrantRequest grant;
    grant.set_ttl(60);
    etcdserverpb::LeaseGrantResponse granted;
    ASSERT_TRUE(s.lease->LeaseGrant(Deadline().get(), grant, &granted).ok()) << who;
    // A Range is no apply, but etcd warns of a slow one and counts it with
    // the slow applies.
    etcdserverpb::RangeResponse range;
    ASSERT_TRUE(RangeAll(s, 0, &range).ok()) << who;
    const Scrape after = ScrapeMetrics(*server);
    auto added = [&](const char* op, bool success) {
      return after.Value(series(op, success)) - before.Value(series(op, success));
    };
    EXPECT_EQ(added("Put", true), 2) << who;
    EXPECT_EQ(added("Txn", true), 1) << who;
    EXPECT_EQ(added("Compaction", true), 1) << who;
    EXPECT_EQ(added("LeaseGrant", true), 1) << who;
    EXPECT_EQ(after.types.at("etcd_server_apply_duration_seconds"), "histogram") << who;
    // Every apply, and the Range, exceeded 1 ns.
    EXPECT_EQ(after.Value("etcd_server_slow_apply_total") -
                  before.Value("etcd_server_slow_apply_total"),
              6)
        << who;
  }
  for (const auto& server : servers) {
    const std::string log = server->ReadLog(1 << 20);
    EXPECT_TRUE(absl::StrContains(log, "apply request took too long"))
        << FlavorName(server->flavor());
    EXPECT_TRUE(absl::StrContains(log, "read-only range")) << FlavorName(server->flavor());
  }
}

// etcd's watch gauges and event counter move alike: one stream with two
// watchers of a key, a put to it, the stream closed.
TEST(MetricsTest, WatchGaugesAndEventsCountAsEtcd) {
  const auto servers = StartCapstanAndEtcd();
  ASSERT_EQ(servers.size(), 2u);
  for (const auto& server : servers) {
    const std::string who = FlavorName(server->flavor());
    ServerStubs s(server->NewChannel());
    auto value = [&](const char* name) { return ScrapeMetrics(*server).Value(name); };
    EXPECT_EQ(value("etcd_debugging_mvcc_watcher_total"), 0) << who;
    EXPECT_EQ(value("etcd_debugging_mvcc_watch_stream_total"), 0) << who;
    const double events_before = value("etcd_debugging_mvcc_events_total");
    {
      grpc::ClientContext ctx;
      auto stream = s.watch->Watch(&ctx);
      for (int i = 0; i < 2; ++i) {
        etcdserverpb::WatchRequest req;
        req.mutable_create_request()->set_key("/w/key");
        ASSERT_TRUE(stream->Write(req)) << who;
        etcdserverpb::WatchResponse created;
        ASSERT_TRUE(stream->Read(&created)) << who;
        ASSERT_TRUE(created.created()) << who;
      }
      EXPECT_EQ(value("etcd_debugging_mvcc_watcher_total"), 2) << who;
      EXPECT_EQ(value("etcd_debugging_mvcc_watch_stream_total"), 1) << who;
      EXPECT_EQ(value("etcd_debugging_mvcc_slow_watcher_total"), 0) << who;
      ASSERT_TRUE(Put(s, "/w/key", "v").ok()) << who;
      for (int i = 0; i < 2; ++i) {
        etcdserverpb::WatchResponse event;
        ASSERT_TRUE(stream->Read(&event)) << who;
        EXPECT_EQ(event.events_size(), 1) << who;
      }
      // Each watcher's event was sent.
      EXPECT_EQ(value("etcd_debugging_mvcc_events_total") - events_before, 2) << who;
      ctx.TryCancel();
      etcdserverpb::WatchResponse rest;
      while (stream->Read(&rest)) {
      }
    }
    // The server lets the stream go once it sees the cancel.
    EXPECT_EQ(AwaitMetric(*server, "etcd_debugging_mvcc_watcher_total",
                          [](double v) { return v == 0; }),
              0)
        << who;
    EXPECT_EQ(value("etcd_debugging_mvcc_watch_stream_total"), 0) << who;
  }
}

// etcd's lease counters and TTL histogram move alike: three grants, a
// keep-alive, a revoke and an expiry.
TEST(MetricsTest, LeaseCountersAsEtcd) {
  const auto servers = StartCapstanAndEtcd();
  ASSERT_EQ(servers.size(), 2u);
  for (const auto& server : servers) {
    const std::string who = FlavorName(server->flavor());
    ServerStubs s(server->NewChannel());
    auto value = [&](const char* name) { return ScrapeMetrics(*server).Value(name); };
    std::vector<int64_t> ids;
    for (int64_t ttl : {60, 60, 2}) {
      etcdserverpb::LeaseGrantRequest req;
      req.set_ttl(ttl);
      etcdserverpb::LeaseGrantResponse resp;
      ASSERT_TRUE(s.lease->LeaseGrant(Deadline().get(), req, &resp).ok()) << who;
      ids.push_back(resp.id());
    }
    {
      auto ctx = Deadline();
      auto stream = s.lease->LeaseKeepAlive(ctx.get());
      etcdserverpb::LeaseKeepAliveRequest req;
      req.set_id(ids[0]);
      ASSERT_TRUE(stream->Write(req)) << who;
      etcdserverpb::LeaseKeepAliveResponse resp;
      ASSERT_TRUE(stream->Read(&resp)) << who;
      EXPECT_EQ(resp.ttl(), 60) << who;
      stream->WritesDone();
    }
    etcdserverpb::LeaseRevokeRequest revoke;
    revoke.set_id(ids[1]);
    etcdserverpb::LeaseRevokeResponse revoked;
    ASSERT_TRUE(s.lease->LeaseRevoke(Deadline().get(), revoke, &revoked).ok()) << who;
    EXPECT_EQ(value("etcd_debugging_lease_renewed_total"), 1) << who;
    EXPECT_EQ(value("etcd_debugging_lease_ttl_total_count"), 3) << who;
    EXPECT_EQ(value("etcd_debugging_lease_ttl_total_bucket{le=\"2\"}"), 1) << who;
    EXPECT_EQ(value("etcd_debugging_lease_ttl_total_bucket{le=\"64\"}"), 3) << who;
    // The 2 s lease expires and its leader revokes it.
    EXPECT_EQ(AwaitMetric(*server, "etcd_debugging_server_lease_expired_total",
                          [](double v) { return v >= 1; }),
              1)
        << who;
    EXPECT_EQ(value("etcd_debugging_lease_revoked_total"), 2) << who;
  }
}

TEST(MetricsTest, NamesAndTypesAsEtcdValuesMove) {
  auto capstan = ServerProcess::Start(ServerOptions::Capstan());
  ASSERT_TRUE(capstan.ok()) << capstan.status();
  auto etcd = ServerProcess::Start(ServerOptions::Etcd());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  ServerStubs s((*capstan)->NewChannel());
  ASSERT_TRUE(Put(s, "/m/warm", "v").ok());
  ServerStubs e((*etcd)->NewChannel());
  ASSERT_TRUE(Put(e, "/m/warm", "v").ok());

  const Scrape before = ScrapeMetrics(**capstan);
  const Scrape etcd_metrics = ScrapeMetrics(**etcd);
  // Every metric Capstan names like etcd's exists in etcd with the same type.
  for (const char* name :
       {"etcd_server_has_leader", "etcd_server_is_leader", "etcd_server_version",
        "etcd_mvcc_db_total_size_in_bytes", "etcd_mvcc_db_total_size_in_use_in_bytes",
        "etcd_debugging_mvcc_keys_total", "etcd_mvcc_put_total", "etcd_mvcc_delete_total",
        "etcd_mvcc_range_total", "etcd_mvcc_txn_total", "etcd_debugging_mvcc_current_revision",
        "etcd_debugging_mvcc_compact_revision", "etcd_server_proposals_applied_total",
        "etcd_server_proposals_committed_total", "etcd_server_proposals_pending",
        "etcd_server_proposals_failed_total", "etcd_server_leader_changes_seen_total",
        "etcd_server_is_learner", "etcd_server_id", "etcd_server_slow_read_indexes_total",
        "etcd_server_read_indexes_failed_total", "etcd_server_heartbeat_send_failures_total",
        "etcd_debugging_mvcc_watcher_total", "etcd_debugging_mvcc_slow_watcher_total",
        "etcd_debugging_mvcc_watch_stream_total", "etcd_debugging_mvcc_events_total",
        "etcd_debugging_lease_renewed_total", "etcd_debugging_lease_revoked_total",
        "etcd_debugging_lease_ttl_total", "etcd_debugging_server_lease_expired_total",
        "process_cpu_seconds_total", "process_open_fds", "process_max_fds",
        "process_virtual_memory_bytes", "process_virtual_memory_max_bytes",
        "process_start_time_seconds", "process_network_receive_bytes_total",
        "process_network_transmit_bytes_total", "os_fd_used", "os_fd_limit",
        "etcd_disk_backend_commit_duration_seconds", "etcd_disk_wal_fsync_duration_seconds",
        "etcd_server_quota_backend_bytes", "etcd_debugging_lease_granted_total",
        "grpc_server_started_total", "grpc_server_handled_total",
        "process_resident_memory_bytes", "etcd_cluster_version",
        "etcd_network_client_grpc_received_bytes_total",
        "etcd_network_client_grpc_sent_bytes_total", "capstan_commit_groups_total",
        "capstan_commit_group_requests_total", "capstan_leases"}) {
    EXPECT_TRUE(before.types.count(name)) << name << " missing";
  }
  // etcd 3.6's and 3.7's, which the 3.5 reference lacks: their types as
  // etcd 3.6 and 3.7 register them (diff_health_test checks their labels
  // and buckets).
  const std::map<std::string, std::string> newer_etcd = {
      {"etcd_server_request_duration_seconds", "histogram"},
      {"etcd_server_range_duration_seconds", "histogram"},
      {"etcd_debugging_server_alarms", "gauge"},
      {"etcd_server_feature_enabled", "gauge"}};
  for (const auto& [name, type] : before.types) {
    if (name.rfind("capstan_", 0) == 0) continue;
    if (auto newer = newer_etcd.find(name); newer != newer_etcd.end()) {
      EXPECT_EQ(type, newer->second) << name;
      continue;
    }
    auto it = etcd_metrics.types.find(name);
    if (it == etcd_metrics.types.end()) {
      ADD_FAILURE() << name << " is not an etcd metric; name Capstan's own capstan_*";
    } else {
      EXPECT_EQ(type, it->second) << name;
    }
  }
  // The handling-time histogram comes only with --metrics=extensive.
  EXPECT_EQ(before.types.count("grpc_server_handling_seconds"), 0u);
  EXPECT_EQ(etcd_metrics.types.count("grpc_server_handling_seconds"), 0u);
  EXPECT_EQ(before.Value("etcd_server_has_leader"), 1);
  // A single member saw one leader, itself, and committed what it applied,
  // as etcd's does.
  for (const Scrape* m : {&before, &etcd_metrics}) {
    EXPECT_EQ(m->Value("etcd_server_is_leader"), 1);
    EXPECT_EQ(m->Value("etcd_server_leader_changes_seen_total"), 1);
    EXPECT_EQ(m->Value("etcd_server_is_learner"), 0);
    EXPECT_EQ(m->Value("etcd_server_proposals_pending"), 0);
    EXPECT_EQ(m->Value("etcd_server_proposals_failed_total"), 0);
    EXPECT_EQ(m->Value("etcd_server_proposals_committed_total"),
              m->Value("etcd_server_proposals_applied_total"));
  }
  EXPECT_EQ(before.Value(absl::StrCat("etcd_server_version{server_version=\"", CAPSTAN_ETCD_API_VERSION, "\"}")), 1);
  // The cluster version as etcd labels it, major.minor (the minor of the
  // API Capstan speaks).
  const std::string api_version = CAPSTAN_ETCD_API_VERSION;
  const std::string minor = api_version.substr(0, api_version.find('.', api_version.find('.') + 1));
  EXPECT_EQ(before.Value(absl::StrCat(R"(etcd_cluster_version{cluster_version=")", minor, R"("})")), 1);
  EXPECT_EQ(etcd_metrics.Value(R"(etcd_cluster_version{cluster_version="3.5"})"), 1);
  EXPECT_GT(before.Value("etcd_mvcc_db_total_size_in_bytes"), 0);
  // Every gate as etcd 3.6 exports it (stage "" for GA), at its default.
  EXPECT_EQ(before.samples.count(R"(etcd_server_feature_enabled{name="AllAlpha",stage="ALPHA"})"), 1u);
  EXPECT_EQ(before.Value(R"(etcd_server_feature_enabled{name="AllAlpha",stage="ALPHA"})"), 0);
  EXPECT_EQ(before.Value(R"(etcd_server_feature_enabled{name="StopGRPCServiceOnDefrag",stage="ALPHA"})"), 0);

  // Three puts, a range, a failing range, a lease.
  int64_t rev = 0;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(Put(s, absl::StrCat("/m/", i), "v", 0, &rev).ok());
  etcdserverpb::RangeResponse range;
  ASSERT_TRUE(RangeAll(s, 0, &range).ok());
  EXPECT_EQ(RangeAll(s, rev + 100, &range).error_code(), grpc::OUT_OF_RANGE);
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(60);
  etcdserverpb::LeaseGrantResponse lease;
  ASSERT_TRUE(s.lease->LeaseGrant(Deadline().get(), grant, &lease).ok());
  // A keep-alive stream with one renewal, closed by the client, and a watch
  // stream (the methods that count themselves rather than through the
  // interceptor; a watch is handled only when it ends, after this scrape).
  {
    auto ctx = Deadline();
    auto stream = s.lease->LeaseKeepAlive(ctx.get());
    etcdserverpb::LeaseKeepAliveRequest renew;
    renew.set_id(lease.id());
    etcdserverpb::LeaseKeepAliveResponse renewed;
    ASSERT_TRUE(stream->Write(renew));
    ASSERT_TRUE(stream->Read(&renewed));
    EXPECT_EQ(renewed.id(), lease.id());
    ASSERT_TRUE(stream->WritesDone());
    EXPECT_TRUE(stream->Finish().ok());
  }
  auto watch_ctx = Deadline();
  auto watch = s.watch->Watch(watch_ctx.get());
  {
    etcdserverpb::WatchRequest create;
    create.mutable_create_request()->set_key("/m/");
    etcdserverpb::WatchResponse created;
    ASSERT_TRUE(watch->Write(create));
    ASSERT_TRUE(watch->Read(&created));
    EXPECT_TRUE(created.created());
  }

  const Scrape after = ScrapeMetrics(**capstan);
  auto delta = [&](const std::string& sample) {
    return after.Value(sample) - before.Value(sample);
  };
  EXPECT_EQ(delta("etcd_mvcc_put_total"), 3);
  EXPECT_EQ(delta("etcd_debugging_mvcc_keys_total"), 3);
  EXPECT_EQ(after.Value("etcd_debugging_mvcc_current_revision"), rev);
  EXPECT_EQ(delta("etcd_debugging_lease_granted_total"), 1);
  EXPECT_EQ(delta("capstan_leases"), 1);
  EXPECT_GE(delta("etcd_disk_backend_commit_duration_seconds_count"), 1);
  // A single member's synced write is its group commit: each of the three
  // puts waited for one, as each waits for a WAL fsync in etcd.
  EXPECT_GE(delta("etcd_disk_wal_fsync_duration_seconds_count"), 3);
  const std::string kv = "grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"";
  EXPECT_EQ(delta("grpc_server_started_total{" + kv + "}"), 3);
  EXPECT_EQ(delta("grpc_server_handled_total{grpc_code=\"OK\"," + kv + "}"), 3);
  EXPECT_EQ(delta("grpc_server_handled_total{grpc_code=\"OutOfRange\",grpc_method=\"Range\","
                  "grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}"),
            1);
  EXPECT_EQ(delta("grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Range\","
                  "grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"}"),
            1);
  // Counted by the interceptor.
  const std::string grant_labels =
      "grpc_method=\"LeaseGrant\",grpc_service=\"etcdserverpb.Lease\",grpc_type=\"unary\"";
  EXPECT_EQ(delta("grpc_server_started_total{" + grant_labels + "}"), 1);
  EXPECT_EQ(delta("grpc_server_handled_total{grpc_code=\"OK\"," + grant_labels + "}"), 1);
  const std::string keep_alive_labels =
      "grpc_method=\"LeaseKeepAlive\",grpc_service=\"etcdserverpb.Lease\","
      "grpc_type=\"bidi_stream\"";
  EXPECT_EQ(delta("grpc_server_started_total{" + keep_alive_labels + "}"), 1);
  EXPECT_EQ(delta("grpc_server_handled_total{grpc_code=\"OK\"," + keep_alive_labels + "}"), 1);
  EXPECT_EQ(delta("grpc_server_started_total{grpc_method=\"Watch\",grpc_service=\"etcdserverpb."
                  "Watch\",grpc_type=\"bidi_stream\"}"),
            1);
  watch_ctx->TryCancel();
  watch->Finish().IgnoreError();

  // A Lock without a lease grants one for its session, and etcd's lessor
  // counts that grant too.
  v3lockpb::LockRequest lock;
  lock.set_name("/m/lock");
  v3lockpb::LockResponse locked;
  ASSERT_TRUE(s.lock->Lock(Deadline().get(), lock, &locked).ok());
  const Scrape locked_scrape = ScrapeMetrics(**capstan);
  EXPECT_EQ(locked_scrape.Value("etcd_debugging_lease_granted_total") -
                after.Value("etcd_debugging_lease_granted_total"),
            1);
}

TEST(MetricsTest, WatchCacheStateAndTheRangesItAnswered) {
  ServerOptions options = ServerOptions::Capstan();
  options.extra_args.push_back("--watch-cache-prefixes=/registry/pods/,/registry/nodes/");
  auto server = ServerProcess::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  ServerStubs s((*server)->NewChannel());
  int64_t rev = 0;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(Put(s, absl::StrCat("/registry/pods/default/p", i), "{}", 0, &rev).ok());
  }
  const std::string pods = "{prefix=\"/registry/pods/\"}";
  const std::string nodes = "{prefix=\"/registry/nodes/\"}";
  // The cache follows the store a moment later.
  Scrape before;
  for (int i = 0; i < 500; ++i) {
    before = ScrapeMetrics(**server);
    if (before.Value("capstan_watch_cache_revision" + pods) >= rev) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(before.Value("capstan_watch_cache_revision" + pods), rev);
  EXPECT_EQ(before.types.at("capstan_watch_cache_ranges_total"), "counter");
  EXPECT_EQ(before.types.at("capstan_watch_cache_objects"), "gauge");
  EXPECT_EQ(before.Value("capstan_watch_cache_objects" + pods), 5);
  EXPECT_EQ(before.samples.count("capstan_watch_cache_objects" + nodes), 1u);
  EXPECT_EQ(before.Value("capstan_watch_cache_objects" + nodes), 0);
  EXPECT_GT(before.Value("capstan_watch_cache_object_bytes" + pods), 0);
  EXPECT_GT(before.Value("capstan_watch_cache_memory_bytes"), 0);

  auto range = [&](const std::string& key, const std::string& end, bool by_value) {
    etcdserverpb::RangeRequest req;
    req.set_key(key);
    req.set_range_end(end);
    if (by_value) req.set_sort_target(etcdserverpb::RangeRequest::VALUE);
    etcdserverpb::RangeResponse resp;
    EXPECT_TRUE(s.kv->Range(Deadline().get(), req, &resp).ok());
    return resp.count();
  };
  EXPECT_EQ(range("/registry/pods/", "/registry/pods0", false), 5);  // served
  EXPECT_EQ(range("/registry/pods/default/p1", "", false), 1);      // served
  EXPECT_EQ(range("/registry/pods/", "/registry/pods0", true), 5);   // sorted by value: declined
  EXPECT_EQ(range("/m/", "/m0", false), 0);                          // not cached: not counted
  const Scrape after = ScrapeMetrics(**server);
  auto delta = [&](const std::string& sample) {
    return after.Value(sample) - before.Value(sample);
  };
  EXPECT_EQ(delta("capstan_watch_cache_ranges_total{result=\"served\"}"), 2);
  EXPECT_EQ(delta("capstan_watch_cache_ranges_total{result=\"declined\"}"), 1);
}

// The Lock and Election services' calls in progress, and the Observe
// streams held back for a client that reads too slowly.
TEST(MetricsTest, LockElectionCallsAndObservePauses) {
  auto server = ServerProcess::Start(ServerOptions::Capstan());
  ASSERT_TRUE(server.ok()) << server.status();
  ServerStubs s((*server)->NewChannel());
  auto value = [&](const std::string& sample) { return ScrapeMetrics(**server).Value(sample); };
  // The sample once it is want (or at least want), or after 5 s: the
  // recipes' thread counts asynchronously.
  auto await = [&](const std::string& sample, double want, bool at_least = false) {
    for (int i = 0; i < 500; ++i) {
      const double v = value(sample);
      if (v == want || (at_least && v > want)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return value(sample);
  };
  EXPECT_EQ(ScrapeMetrics(**server).types.at("capstan_lock_election_calls"), "gauge");
  EXPECT_EQ(value("capstan_lock_election_calls"), 0);

  // A Lock waits behind the holder: one call in progress until it gives up.
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(60);
  etcdserverpb::LeaseGrantResponse a, b;
  ASSERT_TRUE(s.lease->LeaseGrant(Deadline().get(), grant, &a).ok());
  ASSERT_TRUE(s.lease->LeaseGrant(Deadline().get(), grant, &b).ok());
  v3lockpb::LockRequest lock;
  lock.set_name("/m/lock");
  lock.set_lease(a.id());
  v3lockpb::LockResponse held;
  ASSERT_TRUE(s.lock->Lock(Deadline().get(), lock, &held).ok());
  lock.set_lease(b.id());
  grpc::ClientContext waiting;
  std::thread waiter([&] {
    v3lockpb::LockResponse r;
    s.lock->Lock(&waiting, lock, &r);
  });
  EXPECT_EQ(await("capstan_lock_election_calls", 1), 1);
  waiting.TryCancel();
  waiter.join();
  EXPECT_EQ(await("capstan_lock_election_calls", 0), 0);

  // An observer that does not read while the leader proclaims more than
  // the stream's flow-control window holds.
  v3electionpb::CampaignRequest campaign;
  campaign.set_name("/m/election");
  campaign.set_lease(a.id());
  v3electionpb::CampaignResponse leader;
  ASSERT_TRUE(s.election->Campaign(Deadline().get(), campaign, &leader).ok());
  grpc::ClientContext observing;
  v3electionpb::LeaderRequest observe;
  observe.set_name("/m/election");
  auto reader = s.election->Observe(&observing, observe);
  v3electionpb::ProclaimRequest proclaim;
  *proclaim.mutable_leader() = leader.leader();
  proclaim.set_value(std::string(32 * 1024, 'x'));
  for (int i = 0; i < 400; ++i) {
    v3electionpb::ProclaimResponse r;
    ASSERT_TRUE(s.election->Proclaim(Deadline().get(), proclaim, &r).ok());
  }
  EXPECT_GE(await("capstan_lock_election_observe_pauses_total", 1, /*at_least=*/true), 1);
  EXPECT_EQ(value("capstan_lock_election_calls"), 1);  // the Observe stream
  observing.TryCancel();
  EXPECT_EQ(await("capstan_lock_election_calls", 0), 0);
}

TEST(MetricsTest, ExtensiveAddsTheHandlingTimeHistogramAsEtcd) {
  ServerOptions capstan_options = ServerOptions::Capstan();
  capstan_options.extra_args.push_back("--metrics=extensive");
  ServerOptions etcd_options = ServerOptions::Etcd();
  etcd_options.extra_args.push_back("--metrics=extensive");
  const std::string put = "{grpc_method=\"Put\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"";
  for (const auto& options : {capstan_options, etcd_options}) {
    auto server = ServerProcess::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    ServerStubs s((*server)->NewChannel());
    ASSERT_TRUE(Put(s, "/m/warm", "v").ok());
    const Scrape before = ScrapeMetrics(**server);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(Put(s, absl::StrCat("/m/", i), "v").ok());
    const Scrape after = ScrapeMetrics(**server);
    EXPECT_EQ(after.types.count("grpc_server_handling_seconds"), 1u);
    EXPECT_EQ(after.types.at("grpc_server_handling_seconds"), "histogram");
    EXPECT_EQ(after.Value("grpc_server_handling_seconds_count" + put + "}") -
                  before.Value("grpc_server_handling_seconds_count" + put + "}"),
              4);
    // Prometheus's default buckets; a local put takes well under 10 s.
    EXPECT_EQ(after.Value("grpc_server_handling_seconds_bucket" + put + ",le=\"10\"}"),
              after.Value("grpc_server_handling_seconds_count" + put + "}"));
    EXPECT_EQ(after.samples.count("grpc_server_handling_seconds_bucket" + put + ",le=\"0.005\"}"),
              1u);
    EXPECT_GT(after.Value("grpc_server_handling_seconds_sum" + put + "}"), 0);
  }
}

}  // namespace
}  // namespace capstan::testing
