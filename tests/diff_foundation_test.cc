// Differential tests of the foundation: Maintenance.Status, Cluster.MemberList,
// Alarm, their etcdctl views, gRPC's health service, and the list of RPCs
// Capstan still answers UNIMPLEMENTED.
//
// Status and MemberList differ between the fixture's servers in their values
// (versions, sizes, raft indexes, ports, and the ids derived from the ports),
// so these cases compare shape: which fields are set, how they relate to each
// other, and the normalized rest. NewMemberIdsAreEtcds gives both servers the
// same peer URLs and compares the ids themselves.

#include <functional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "diff_fixture.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace capstan::testing {
namespace {

namespace pb = google::protobuf;
using namespace etcdserverpb;  // NOLINT: the messages are the vocabulary here

class DiffFoundationTest : public DiffTest {};

// Names of the fields of `m` (recursively, as "a.b") that hold a non-default
// value. Repeated fields count as set when non-empty.
std::set<std::string> SetFields(const pb::Message& m, const std::string& path = "") {
  std::set<std::string> out;
  std::vector<const pb::FieldDescriptor*> fields;
  m.GetReflection()->ListFields(m, &fields);
  for (const pb::FieldDescriptor* f : fields) {
    std::string name = path + f->name();
    out.insert(name);
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      auto sub = SetFields(m.GetReflection()->GetMessage(m, f), name + ".");
      out.insert(sub.begin(), sub.end());
    }
  }
  return out;
}

std::string Join(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ", ") + x;
  return out;
}

void ExpectStatusInvariants(const char* who, const StatusResponse& s) {
  SCOPED_TRACE(who);
  EXPECT_NE(s.header().cluster_id(), 0u);
  EXPECT_NE(s.header().member_id(), 0u);
  EXPECT_GT(s.header().raft_term(), 0u);
  EXPECT_GT(s.header().revision(), 0);
  EXPECT_EQ(s.leader(), s.header().member_id()) << "a single member leads itself";
  EXPECT_GT(s.raftterm(), 0u);
  EXPECT_EQ(s.raftterm(), s.header().raft_term());
  EXPECT_GT(s.raftindex(), 0u);
  EXPECT_GT(s.raftappliedindex(), 0u);
  EXPECT_LE(s.raftappliedindex(), s.raftindex());
  EXPECT_GT(s.dbsize(), 0);
  EXPECT_GT(s.dbsizeinuse(), 0);
  EXPECT_LE(s.dbsizeinuse(), s.dbsize());
  EXPECT_EQ(s.errors_size(), 0);
  EXPECT_FALSE(s.islearner());
}

TEST_F(DiffFoundationTest, StatusShape) {
  auto p = Both(StatusRequest());
  ASSERT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
  ASSERT_TRUE(p.capstan.status.ok()) << Describe(p.capstan.status);
  ExpectStatusInvariants("etcd", p.etcd.resp);
  ExpectStatusInvariants("capstan", p.capstan.resp);
  EXPECT_TRUE(std::regex_match(p.etcd.resp.version(), std::regex(R"(3\.\d+\.\d+)")))
      << p.etcd.resp.version();
  std::set<std::string> capstan_fields = SetFields(p.capstan.resp);
  if (!BothEtcd()) {
    // Capstan reports the etcd API version it implements (3.6.x), real etcd
    // its own release (3.5.16 here).
    EXPECT_EQ(p.capstan.resp.version(), CAPSTAN_ETCD_API_VERSION);
    EXPECT_TRUE(std::regex_match(p.capstan.resp.version(), std::regex(R"(3\.6\.\d+)")));
    // etcd 3.6's fields, which 3.5 does not have (diff_health_test checks
    // their values).
    for (const char* f : {"storageVersion", "dbSizeQuota", "downgradeInfo"}) {
      EXPECT_EQ(capstan_fields.erase(f), 1u) << f;
    }
  }
  EXPECT_EQ(SetFields(p.etcd.resp), capstan_fields)
      << "etcd sets: " << Join(SetFields(p.etcd.resp))
      << "\ncapstan sets: " << Join(capstan_fields);
  EXPECT_SAME(p);
}

TEST_F(DiffFoundationTest, StatusRaftIndexAdvancesWithWrites) {
  auto before = Both(StatusRequest());
  PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  auto after = Both(StatusRequest());
  ASSERT_TRUE(before.etcd.status.ok() && after.etcd.status.ok());
  ASSERT_TRUE(before.capstan.status.ok()) << Describe(before.capstan.status);
  ASSERT_TRUE(after.capstan.status.ok()) << Describe(after.capstan.status);
  EXPECT_GE(after.etcd.resp.raftindex(), before.etcd.resp.raftindex() + 2);
  EXPECT_GE(after.capstan.resp.raftindex(), before.capstan.resp.raftindex() + 2)
      << "each write is one entry of the ordered log";
  EXPECT_GE(after.capstan.resp.raftappliedindex(), before.capstan.resp.raftappliedindex() + 2);
  EXPECT_EQ(after.etcd.resp.header().revision(), before.etcd.resp.header().revision() + 2);
  EXPECT_SAME(after);
}

TEST_F(DiffFoundationTest, MemberListShape) {
  auto p = Both(MemberListRequest());
  ASSERT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
  ASSERT_TRUE(p.capstan.status.ok()) << Describe(p.capstan.status);
  for (auto [who, resp, server] :
       {std::tuple{"etcd", &p.etcd.resp, &etcd()}, std::tuple{"capstan", &p.capstan.resp, &capstan()}}) {
    SCOPED_TRACE(who);
    ASSERT_EQ(resp->members_size(), 1);
    const Member& m = resp->members(0);
    EXPECT_NE(m.id(), 0u);
    EXPECT_EQ(m.id(), resp->header().member_id());
    EXPECT_EQ(m.name(), "diff");
    ASSERT_EQ(m.clienturls_size(), 1);
    EXPECT_EQ(m.clienturls(0), server->client_url());
    ASSERT_EQ(m.peerurls_size(), 1);
    EXPECT_EQ(m.peerurls(0), server->peer_url());
    EXPECT_FALSE(m.islearner());
    EXPECT_NE(resp->header().cluster_id(), 0u);
  }
  EXPECT_EQ(SetFields(p.etcd.resp), SetFields(p.capstan.resp))
      << "etcd sets: " << Join(SetFields(p.etcd.resp))
      << "\ncapstan sets: " << Join(SetFields(p.capstan.resp));
  EXPECT_EQ(SetFields(p.etcd.resp.members(0)), SetFields(p.capstan.resp.members(0)));
  EXPECT_SAME(p);
}

TEST_F(DiffFoundationTest, HeaderIdsAgreeAcrossServices) {
  // cluster_id and member_id are the same in every service's header.
  auto status = Both(StatusRequest());
  auto members = Both(MemberListRequest());
  RangeRequest r;
  r.set_key(K("x"));
  auto range = Both(r);
  ASSERT_TRUE(status.capstan.status.ok() && members.capstan.status.ok() &&
              range.capstan.status.ok());
  for (auto [who, s, m, g] :
       {std::tuple{"etcd", &status.etcd.resp, &members.etcd.resp, &range.etcd.resp},
        std::tuple{"capstan", &status.capstan.resp, &members.capstan.resp, &range.capstan.resp}}) {
    SCOPED_TRACE(who);
    EXPECT_EQ(s->header().cluster_id(), m->header().cluster_id());
    EXPECT_EQ(s->header().cluster_id(), g->header().cluster_id());
    EXPECT_EQ(s->header().member_id(), m->header().member_id());
    EXPECT_EQ(s->header().member_id(), g->header().member_id());
    EXPECT_EQ(s->header().raft_term(), g->header().raft_term());
  }
  EXPECT_SAME(range);
}

// etcd 3.5 fills the AlarmResponse header (maintenanceServer.Alarm:
// hdr.fill; 3.4 sent none).
TEST_F(DiffFoundationTest, AlarmGetNoneHasAHeader) {
  AlarmRequest r;
  r.set_action(AlarmRequest::GET);
  auto p = Both(r);
  ASSERT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
  EXPECT_EQ(p.etcd.resp.alarms_size(), 0);
  EXPECT_TRUE(p.etcd.resp.has_header());
  EXPECT_SAME(p);
  EXPECT_EQ(p.capstan.resp.header().revision(), Revision());
}

TEST_F(DiffFoundationTest, AlarmDeactivateNothing) {
  AlarmRequest r;
  r.set_action(AlarmRequest::DEACTIVATE);
  r.set_alarm(AlarmType::NOSPACE);
  auto p = Both(r);
  ASSERT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
  ASSERT_TRUE(p.capstan.status.ok()) << Describe(p.capstan.status);
  EXPECT_EQ(p.etcd.resp.alarms_size(), p.capstan.resp.alarms_size());
}

// --- Maintenance RPCs ------------------------------------------------------

TEST_F(DiffFoundationTest, Defragment) {
  PutBoth(K("a"), "1");
  auto p = Both(DefragmentRequest());
  EXPECT_SAME(p);
  EXPECT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
}

TEST_F(DiffFoundationTest, HashHeader) {
  // The hash covers etcd's bbolt file: only the header is compared.
  PutBoth(K("a"), "1");
  auto p = Both(HashRequest());
  EXPECT_SAME(p);
  EXPECT_NE(p.capstan.resp.hash(), 0u);
}

TEST_F(DiffFoundationTest, HashKVCurrent) {
  // etcd's HashKV is a CRC-32C over the key bucket (revision key, encoded
  // KeyValue) pairs: the same data in etcd's layout hashes the same.
  PutBoth(K("a"), "1");
  PutBoth(K("b"), "2");
  DeleteBoth(K("a"));
  auto p = Both(HashKVRequest());
  EXPECT_SAME(p);
}

TEST_F(DiffFoundationTest, HashKVAtPastRevision) {
  const int64_t rev = PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  HashKVRequest r;
  r.set_revision(rev);
  EXPECT_SAME(Both(r));
}

TEST_F(DiffFoundationTest, HashKVFutureRevision) {
  HashKVRequest r;
  r.set_revision(Revision() + 10);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
}

TEST_F(DiffFoundationTest, MoveLeaderToUnknownMember) {
  MoveLeaderRequest r;
  r.set_targetid(0);
  auto p = Both(r);
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
}

TEST_F(DiffFoundationTest, MoveLeaderToItself) {
  // A single member can't transfer its leadership to itself either.
  auto members = Both(MemberListRequest());
  ASSERT_TRUE(members.etcd.status.ok() && members.capstan.status.ok());
  MoveLeaderRequest re, rc;
  re.set_targetid(members.etcd.resp.members(0).id());
  rc.set_targetid(members.capstan.resp.members(0).id());
  AnswerPair<MoveLeaderResponse> p;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
    p.etcd.status = etcd_stubs().maintenance->MoveLeader(&ctx, re, &p.etcd.resp);
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
    p.capstan.status = capstan_stubs().maintenance->MoveLeader(&ctx, rc, &p.capstan.resp);
  }
  EXPECT_SAME(p);
}

// Reads a whole Snapshot stream.
struct SnapshotStream {
  grpc::Status status;
  std::vector<SnapshotResponse> messages;
};

SnapshotStream ReadSnapshot(ServerStubs& s) {
  SnapshotStream out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = s.maintenance->Snapshot(&ctx, SnapshotRequest());
  SnapshotResponse m;
  while (reader->Read(&m)) out.messages.push_back(m);
  out.status = reader->Finish();
  return out;
}

TEST_F(DiffFoundationTest, SnapshotStreamShape) {
  // The snapshot is etcd's bbolt file, so only the stream's shape is
  // compared: chunks whose remaining_bytes count down to 0, then a last
  // message holding the 32-byte SHA-256 of the data, with remaining_bytes 0.
  PutBoth(K("a"), "1");
  for (ServerStubs* s : {&etcd_stubs(), &capstan_stubs()}) {
    SCOPED_TRACE(s == &etcd_stubs() ? "etcd" : "capstan");
    SnapshotStream st = ReadSnapshot(*s);
    ASSERT_TRUE(st.status.ok()) << Describe(st.status);
    std::string shape;
    for (const auto& m : st.messages) {
      shape += absl::StrCat("[", m.has_header() ? "header, " : "", "blob ", m.blob().size(),
                            " B, remaining ", m.remaining_bytes(), "] ");
    }
    SCOPED_TRACE("stream: " + shape);
    ASSERT_GE(st.messages.size(), 2u);
    uint64_t total = 0;
    for (size_t i = 0; i + 1 < st.messages.size(); ++i) total += st.messages[i].blob().size();
    uint64_t sent = 0;
    for (size_t i = 0; i + 1 < st.messages.size(); ++i) {
      sent += st.messages[i].blob().size();
      EXPECT_EQ(st.messages[i].remaining_bytes(), total - sent) << "message " << i;
    }
    EXPECT_EQ(st.messages.back().remaining_bytes(), 0u);
    EXPECT_EQ(st.messages.back().blob().size(), 32u) << "sha256 of the snapshot";
    EXPECT_FALSE(st.messages[0].has_header());
    // etcd 3.6's version field, on every message: the storage version,
    // which etcd 3.5 does not send.
    for (const auto& m : st.messages) {
      EXPECT_EQ(m.version(), s == &etcd_stubs() ? "" : "3.6.0");
    }
  }
}

// --- etcdctl views --------------------------------------------------------

// Key names and value kinds of a JSON value, recursively ("a.b:number").
void JsonShape(const pb::Value& v, const std::string& path, std::set<std::string>* out) {
  switch (v.kind_case()) {
    case pb::Value::kStructValue:
      out->insert(path + ":object");
      for (const auto& [k, child] : v.struct_value().fields()) JsonShape(child, path + "." + k, out);
      break;
    case pb::Value::kListValue:
      out->insert(path + ":list");
      for (const auto& child : v.list_value().values()) JsonShape(child, path + "[]", out);
      break;
    case pb::Value::kNumberValue:
      out->insert(path + ":number");
      break;
    case pb::Value::kStringValue:
      out->insert(path + ":string");
      break;
    case pb::Value::kBoolValue:
      out->insert(path + ":bool");
      break;
    default:
      out->insert(path + ":null");
  }
}

const pb::Value& Field(const pb::Value& v, const std::string& name) {
  static const pb::Value kNull;
  if (v.kind_case() != pb::Value::kStructValue) return kNull;
  auto it = v.struct_value().fields().find(name);
  return it == v.struct_value().fields().end() ? kNull : it->second;
}

TEST_F(DiffFoundationTest, EtcdctlEndpointStatusShape) {
  EtcdctlPair p = Etcdctl({"endpoint", "status"});
  for (const EtcdctlResult* r : {&p.etcd, &p.capstan}) {
    SCOPED_TRACE(r == &p.etcd ? "etcd" : "capstan");
    ASSERT_TRUE(r->raw.exit.exited && r->raw.exit.exit_code == 0)
        << r->raw.exit.ToString() << "\n" << r->raw.err;
    pb::Value raw;
    ASSERT_TRUE(ParseJson(r->raw.out, &raw)) << r->raw.out;
    ASSERT_EQ(raw.list_value().values_size(), 1) << r->raw.out;
    const pb::Value& st = Field(raw.list_value().values(0), "Status");
    EXPECT_EQ(Field(st, "leader").number_value(),
              Field(Field(st, "header"), "member_id").number_value());
    EXPECT_GT(Field(st, "raftTerm").number_value(), 0);
    EXPECT_GT(Field(st, "dbSize").number_value(), 0);
    EXPECT_TRUE(std::regex_match(Field(st, "version").string_value(), std::regex(R"(3\.\d+\.\d+)")));
    // Normalized: the endpoint is the server's own.
    EXPECT_EQ(Field(r->json.list_value().values(0), "Endpoint").string_value(),
              "127.0.0.1:CLIENT-PORT");
  }
  std::set<std::string> es, cs;
  JsonShape(p.etcd.json, "", &es);
  JsonShape(p.capstan.json, "", &cs);
  EXPECT_EQ(es, cs) << "etcd: " << Join(es) << "\ncapstan: " << Join(cs);
  EXPECT_EQ(p.etcd.err, p.capstan.err);
}

TEST_F(DiffFoundationTest, EtcdctlMemberList) {
  EtcdctlPair p = Etcdctl({"member", "list"});
  ASSERT_TRUE(p.etcd.is_json) << p.etcd.raw.out << p.etcd.raw.err;
  for (const EtcdctlResult* r : {&p.etcd, &p.capstan}) {
    SCOPED_TRACE(r == &p.etcd ? "etcd" : "capstan");
    pb::Value raw;
    ASSERT_TRUE(ParseJson(r->raw.out, &raw)) << r->raw.out << r->raw.err;
    const pb::Value& members = Field(raw, "members");
    ASSERT_EQ(members.list_value().values_size(), 1);
    EXPECT_EQ(Field(members.list_value().values(0), "ID").number_value(),
              Field(Field(raw, "header"), "member_id").number_value());
  }
  EXPECT_SAME_CTL(p);
}

TEST_F(DiffFoundationTest, EtcdctlMemberListTable) {
  // The simple format prints "<hex id>, started, <name>, <peer>, <client>, <learner>".
  EtcdctlPair p = Etcdctl({"member", "list"}, "", /*json=*/false);
  auto strip_id = [](std::string s) { return s.substr(s.find(',')); };
  ASSERT_EQ(p.etcd.raw.exit.exit_code, 0) << p.etcd.raw.err;
  EXPECT_EQ(p.capstan.raw.exit.exit_code, 0) << p.capstan.raw.err;
  EXPECT_EQ(strip_id(p.etcd.out), strip_id(p.capstan.out));
  EXPECT_EQ(p.etcd.err, p.capstan.err);
}

TEST_F(DiffFoundationTest, EtcdctlEndpointHealth) {
  EtcdctlPair p = Etcdctl({"endpoint", "health"});
  for (EtcdctlResult* r : {&p.etcd, &p.capstan}) {
    SCOPED_TRACE(r == &p.etcd ? "etcd" : "capstan");
    ASSERT_TRUE(r->is_json) << r->raw.out << r->raw.err;
    // "took" is a duration.
    for (auto& v : *r->json.mutable_list_value()->mutable_values()) {
      EXPECT_TRUE(v.struct_value().fields().contains("took"));
      v.mutable_struct_value()->mutable_fields()->erase("took");
    }
  }
  EXPECT_SAME_CTL(p);
}

TEST_F(DiffFoundationTest, EtcdctlAlarmList) {
  EXPECT_SAME_CTL(Etcdctl({"alarm", "list"}, "", /*json=*/false));
}

TEST_F(DiffFoundationTest, EtcdctlDefrag) {
  EXPECT_SAME_CTL(Etcdctl({"defrag"}, "", /*json=*/false));
}

TEST_F(DiffFoundationTest, EtcdctlEndpointHashKV) {
  PutBoth(K("a"), "1");
  EXPECT_SAME_CTL(Etcdctl({"endpoint", "hashkv"}));
}

// --- RPCs Capstan does not implement yet ----------------------------------
//
// Edit this table as the server grows: when an RPC gets implemented, its row
// fails with "now implemented"; delete the row and add differential cases.
// Each call is harmless if the RPC is implemented (reads, or requests that
// fail validation).

struct UnimplementedRpc {
  const char* name;
  std::function<grpc::Status(ServerStubs&)> call;
};

template <typename Stub, typename Req, typename Resp>
grpc::Status Unary(Stub* stub, grpc::Status (Stub::*m)(grpc::ClientContext*, const Req&, Resp*),
                   const Req& req) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
  Resp resp;
  return (stub->*m)(&ctx, req, &resp);
}

// Msg: the request message name without "Request"; the rest sets fields.
#define UNARY(svc, Svc, Method, Msg, ...)                                             \
  UnimplementedRpc {                                                                  \
    #Svc "." #Method, [](ServerStubs& s) {                                            \
      Msg##Request req;                                                               \
      __VA_ARGS__;                                                                    \
      return Unary(s.svc.get(), &Svc::Stub::Method, req);                             \
    }                                                                                 \
  }

const std::vector<UnimplementedRpc>& StillUnimplemented() {
  static const auto* table = new std::vector<UnimplementedRpc>{
      UNARY(maintenance, Maintenance, Downgrade, Downgrade, req.set_action(DowngradeRequest::VALIDATE);
            req.set_version("0.0")),
      // The Cluster service is implemented: tests/cluster/cluster_membership_test.cc compares
      // it with a cluster of etcd members.
      // The Auth service is implemented: tests/auth_test.cc compares it with etcd.
  };
  return *table;
}

TEST_F(DiffFoundationTest, StillUnimplementedRpcsAnswerUnimplemented) {
  if (BothEtcd()) CAPSTAN_SKIP_IN_MODE("capstan-only case (CAPSTAN_DIFF_BOTH_ETCD is set)");
  for (const UnimplementedRpc& rpc : StillUnimplemented()) {
    grpc::Status s = rpc.call(capstan_stubs());
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNIMPLEMENTED)
        << rpc.name << " answers " << Describe(s)
        << ": if it is now implemented, remove its row from StillUnimplemented() and add "
           "differential cases for it";
  }
}

// gRPC's health service, as grpc_health_probe asks it: the empty name is
// SERVING; any other is unknown to Check (NOT_FOUND) and to Watch
// (SERVICE_UNKNOWN, the stream left open).
TEST_F(DiffFoundationTest, GrpcHealthService) {
  using grpc::health::v1::Health;
  using grpc::health::v1::HealthCheckRequest;
  using grpc::health::v1::HealthCheckResponse;
  for (const std::string service : {"", "etcdserverpb.KV", "no.such.Service"}) {
    SCOPED_TRACE("service '" + service + "'");
    HealthCheckRequest req;
    req.set_service(service);
    Answer<HealthCheckResponse> check[2], watch[2];
    for (int i = 0; i < 2; ++i) {
      auto stub = Health::NewStub(i == 0 ? etcd_stubs().channel : capstan_stubs().channel);
      grpc::ClientContext c;
      c.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
      check[i].status = stub->Check(&c, req, &check[i].resp);
      grpc::ClientContext w;
      w.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
      auto reader = stub->Watch(&w, req);
      EXPECT_TRUE(reader->Read(&watch[i].resp)) << i;
      w.TryCancel();
    }
    ExpectSame(check[0], check[1]);
    ExpectSame(watch[0], watch[1]);
    EXPECT_EQ(check[0].status.ok(), service.empty());
    EXPECT_EQ(watch[1].resp.status(), service.empty() ? HealthCheckResponse::SERVING
                                                      : HealthCheckResponse::SERVICE_UNKNOWN);
  }
}

// A new member's ids are derived from its name's peer URLs and the cluster
// token, as etcd derives them: started with the same flags, both servers
// report the same member and cluster ids.
TEST_F(DiffFoundationTest, NewMemberIdsAreEtcds) {
  const std::vector<std::vector<std::string>> flag_sets = {
      {"--initial-advertise-peer-urls", "http://10.0.0.7:2380", "--initial-cluster",
       "ids=http://10.0.0.7:2380"},
      {"--initial-advertise-peer-urls", "http://10.0.0.7:2380,https://10.0.0.8:12380",
       "--initial-cluster", "ids=https://10.0.0.8:12380,ids=http://10.0.0.7:2380",
       "--initial-cluster-token", "capstan-e2e"},
  };
  std::set<uint64_t> member_ids;
  for (const auto& flags : flag_sets) {
    SCOPED_TRACE(absl::StrJoin(flags, " "));
    Answer<MemberListResponse> answers[2];
    for (int i = 0; i < 2; ++i) {
      ServerOptions o = i == 0 ? ServerOptions::Etcd() : ServerOptions::Capstan();
      o.name = "ids";
      o.extra_args = flags;
      auto server = ServerProcess::Start(o);
      ASSERT_TRUE(server.ok()) << server.status();
      auto stub = Cluster::NewStub((*server)->NewChannel());
      grpc::ClientContext c;
      c.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
      answers[i].status = stub->MemberList(&c, MemberListRequest(), &answers[i].resp);
      ASSERT_TRUE(answers[i].status.ok()) << Describe(answers[i].status);
      ASSERT_EQ(answers[i].resp.members_size(), 1);
    }
    const MemberListResponse& etcd = answers[0].resp;
    const MemberListResponse& capstan = answers[1].resp;
    EXPECT_EQ(capstan.members(0).id(), etcd.members(0).id());
    EXPECT_EQ(capstan.header().member_id(), etcd.header().member_id());
    EXPECT_EQ(capstan.header().cluster_id(), etcd.header().cluster_id());
    EXPECT_THAT(capstan.members(0).peerurls(), ::testing::ElementsAreArray(etcd.members(0).peerurls()));
    member_ids.insert(capstan.members(0).id());
  }
  EXPECT_EQ(member_ids.size(), flag_sets.size()) << "other URLs and tokens give other ids";
}

// etcd raises a lease's TTL to one and a half election timeouts in whole
// heartbeats: 2 s with the default flags, 8 s with the slower timing cloud
// deployments use. Both servers started with the same flags grant the same
// TTLs.
TEST_F(DiffFoundationTest, MinLeaseTtlFollowsTheElectionTimeout) {
  const std::vector<std::string> flags = {"--election-timeout=5000", "--heartbeat-interval=500"};
  std::vector<int64_t> granted[2];
  for (int i = 0; i < 2; ++i) {
    ServerOptions o = i == 0 ? ServerOptions::Etcd() : ServerOptions::Capstan();
    o.extra_args = flags;
    o.start_timeout = std::chrono::seconds(40);  // etcd elects itself after a timeout or two
    auto server = ServerProcess::Start(o);
    ASSERT_TRUE(server.ok()) << server.status();
    auto stub = Lease::NewStub((*server)->NewChannel());
    for (int64_t ttl : {1, 3, 7, 8, 9, 60}) {
      LeaseGrantRequest req;
      req.set_ttl(ttl);
      LeaseGrantResponse resp;
      grpc::ClientContext c;
      c.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
      ASSERT_TRUE(stub->LeaseGrant(&c, req, &resp).ok());
      granted[i].push_back(resp.ttl());
    }
  }
  EXPECT_EQ(granted[1], granted[0]);
  EXPECT_EQ(granted[0], (std::vector<int64_t>{8, 8, 8, 8, 9, 60})) << "etcd's own answers";
}

}  // namespace
}  // namespace capstan::testing
