// The client URLs' HTTP side against etcd's: the JSON gateway (/v3/...),
// its streams, its errors and status codes, CORS, and /health, /version and
// /metrics on the client port. Each request goes to both servers, etcd
// first; JSON answers are compared normalized as etcdctl's are, and then
// byte for byte with each server's own IDs and ports masked.

#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "diff_fixture.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "http_client.h"

namespace capstan::testing {
namespace {

namespace pb = google::protobuf;
using Headers = std::vector<std::pair<std::string, std::string>>;

struct HttpPair {
  HttpAnswer etcd;
  HttpAnswer capstan;
};

std::string B64(const std::string& s) { return absl::Base64Escape(s); }

class DiffHttpTest : public DiffTest {
 protected:
  HttpPair Both(const std::string& path, const std::string& body, const std::string& method = "POST",
                const Headers& headers = {}) {
    HttpPair p;
    p.etcd = HttpRequestTo(etcd().client_port(), method, path, body, headers);
    p.capstan = HttpRequestTo(capstan().client_port(), method, path, body, headers);
    return p;
  }

  // Same status, content type, and body: as normalized JSON if both are
  // JSON, else as text. drop: top-level fields left out of the comparison.
  ::testing::AssertionResult Same(const HttpPair& p, const std::vector<std::string>& drop = {}) {
    if (p.etcd.status == 0 || p.capstan.status == 0) {
      return ::testing::AssertionFailure() << "no answer: etcd " << p.etcd.status << ", capstan "
                                           << p.capstan.status;
    }
    if (p.etcd.status != p.capstan.status) {
      return ::testing::AssertionFailure() << "status " << p.etcd.status << " vs " << p.capstan.status
                                           << "\netcd: " << p.etcd.body
                                           << "\ncapstan: " << p.capstan.body;
    }
    auto type = [](const HttpAnswer& a) {
      auto it = a.headers.find("content-type");
      return it == a.headers.end() ? std::string() : it->second;
    };
    if (type(p.etcd) != type(p.capstan)) {
      return ::testing::AssertionFailure() << "content type " << type(p.etcd) << " vs "
                                           << type(p.capstan);
    }
    return SameBody(p.etcd.body, p.capstan.body, drop);
  }

  ::testing::AssertionResult SameBody(const std::string& e, const std::string& c,
                                      const std::vector<std::string>& drop = {}) {
    pb::Value ej, cj;
    if (ParseJson(e, &ej) && ParseJson(c, &cj)) {
      NormalizeJson(&ej, etcd());
      NormalizeJson(&cj, capstan());
      for (const auto& d : drop) {
        ej.mutable_struct_value()->mutable_fields()->erase(d);
        cj.mutable_struct_value()->mutable_fields()->erase(d);
      }
      std::string diff;
      pb::util::MessageDifferencer differ;
      differ.ReportDifferencesToString(&diff);
      if (!differ.Compare(ej, cj)) {
        return ::testing::AssertionFailure() << diff << "\netcd: " << e << "\ncapstan: " << c;
      }
      // The same values: then the same bytes (spacing, escapes, field
      // order), unless fields were dropped from the comparison.
      if (!drop.empty() || Masked(e, etcd()) == Masked(c, capstan())) {
        return ::testing::AssertionSuccess();
      }
      return ::testing::AssertionFailure() << "bytes differ\netcd: " << e << "\ncapstan: " << c;
    }
    if (NormalizePorts(e, etcd()) == NormalizePorts(c, capstan())) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "etcd: " << e << "\ncapstan: " << c;
  }

  // A JSON text with what differs between two servers masked: member and
  // cluster IDs, terms, and their own ports.
  static std::string Masked(const std::string& json, const ServerProcess& server) {
    static const std::regex kIds(R"re("(cluster_id|member_id|raft_term|ID)":"[0-9]+")re");
    return std::regex_replace(NormalizePorts(json, server), kIds, "\"$1\":\"-\"");
  }

  // The gRPC code of a gateway error body.
  static double Code(const HttpAnswer& a) {
    pb::Value v;
    if (!ParseJson(a.body, &v)) return -1;
    const auto& f = v.struct_value().fields();
    auto it = f.find("code");
    return it == f.end() ? -1 : it->second.number_value();
  }

  // A streaming call on both servers: its first n lines from each.
  struct Stream {
    std::unique_ptr<HttpClient> client[2];
    HttpAnswer head[2];
    std::vector<std::string> lines[2];
  };
  std::unique_ptr<Stream> Open(const std::string& path, const std::string& body) {
    auto s = std::make_unique<Stream>();
    for (int i = 0; i < 2; ++i) {
      s->client[i] = std::make_unique<HttpClient>(i == 0 ? etcd().client_port()
                                                         : capstan().client_port());
      EXPECT_TRUE(s->client[i]->Send("POST", path, body));
    }
    return s;
  }
  void ReadBoth(Stream* s, size_t n) {
    for (int i = 0; i < 2; ++i) {
      if (s->head[i].status == 0) {
        ASSERT_TRUE(s->client[i]->ReadHead(&s->head[i], std::chrono::seconds(10)))
            << (i == 0 ? "etcd" : "capstan");
      }
      const size_t before = s->lines[i].size();
      EXPECT_TRUE(s->client[i]->ReadLines(n, &s->lines[i], std::chrono::seconds(10)))
          << (i == 0 ? "etcd" : "capstan") << " gave " << s->lines[i].size() - before << " of "
          << n;
    }
  }
  // The same lines in any order (several watchers of one stream answer in
  // the order each catches up).
  void ExpectSameLinesInAnyOrder(const Stream& s) {
    ASSERT_EQ(s.lines[0].size(), s.lines[1].size());
    std::vector<bool> used(s.lines[1].size(), false);
    for (const std::string& e : s.lines[0]) {
      bool found = false;
      for (size_t j = 0; j < s.lines[1].size() && !found; ++j) {
        if (!used[j] && SameBody(e, s.lines[1][j])) used[j] = found = true;
      }
      EXPECT_TRUE(found) << "etcd's " << e << " not among capstan's:\n"
                         << absl::StrJoin(s.lines[1], "\n");
    }
  }
  void ExpectSameLines(const Stream& s) {
    EXPECT_EQ(s.head[0].status, s.head[1].status);
    EXPECT_EQ(s.head[0].headers.at("transfer-encoding"), "chunked");
    EXPECT_EQ(s.head[1].headers.at("transfer-encoding"), "chunked");
    ASSERT_EQ(s.lines[0].size(), s.lines[1].size());
    for (size_t i = 0; i < s.lines[0].size(); ++i) {
      EXPECT_TRUE(SameBody(s.lines[0][i], s.lines[1][i])) << "line " << i;
    }
  }
};

TEST_F(DiffHttpTest, PutRangeDelete) {
  for (const char* k : {"a", "b", "c"}) {
    auto p = Both("/v3/kv/put",
                  absl::StrCat(R"({"key":")", B64(K(k)), R"(","value":")", B64(k), R"(","prev_kv":true})"));
    EXPECT_TRUE(Same(p));
    EXPECT_EQ(p.etcd.status, 200);
  }
  // Overwrite, with the previous value back.
  EXPECT_TRUE(Same(Both("/v3/kv/put", absl::StrCat(R"({"key":")", B64(K("a")),
                                                   R"(","value":"eHg=","prev_kv":true})"))));
  const std::string range = absl::StrCat(R"("key":")", B64(K("")), R"(","range_end":")",
                                         B64(PrefixEnd(K(""))), R"(")");
  for (const std::string extra :
       {"", R"(,"limit":"2")", R"(,"sort_order":"DESCEND","sort_target":"MOD")",
        R"(,"count_only":true)", R"(,"keys_only":true)", R"(,"min_mod_revision":"1","limit":1)",
        R"(,"serializable":true,"sort_order":1,"sort_target":1)"}) {
    auto p = Both("/v3/kv/range", absl::StrCat("{", range, extra, "}"));
    EXPECT_TRUE(Same(p)) << extra;
  }
  // Unknown fields are ignored, as etcd's decoder ignores them.
  EXPECT_TRUE(Same(Both("/v3/kv/range", absl::StrCat(R"({"key":")", B64(K("b")),
                                                     R"(","no_such_field":[1,2]})"))));
  EXPECT_TRUE(Same(Both("/v3/kv/deleterange", absl::StrCat("{", range, R"(,"prev_kv":true})"))));
  EXPECT_TRUE(Same(Both("/v3/kv/range", absl::StrCat("{", range, "}"))));
}

TEST_F(DiffHttpTest, Txn) {
  PutBoth(K("t"), "v");
  const std::string t = B64(K("t"));
  for (const std::string& value : {B64("v"), B64("w")}) {
    auto p = Both("/v3/kv/txn",
                  absl::StrCat(R"({"compare":[{"target":"VALUE","key":")", t, R"(","value":")",
                               value, R"("},{"target":"VERSION","key":")", t,
                               R"(","result":"GREATER","version":"0"}],)",
                               R"("success":[{"request_range":{"key":")", t, R"("}},)",
                               R"({"request_put":{"key":")", B64(K("u")), R"(","value":"MQ=="}}],)",
                               R"("failure":[{"request_txn":{"success":[{"request_delete_range":{"key":")",
                               t, R"(","prev_kv":true}}]}}]})"));
    EXPECT_TRUE(Same(p));
    EXPECT_EQ(p.etcd.status, 200);
  }
}

// Errors come back as etcd 3.5.16's gateway (grpc-gateway v2) writes them:
// the HTTP status of the gRPC code (grpc-gateway v2's table), and the
// google.rpc.Status `{"code":3, "message":"..."}`.
TEST_F(DiffHttpTest, Errors) {
  const std::string k = B64(K("k"));
  for (const auto& [path, body] : std::vector<std::pair<std::string, std::string>>{
           {"/v3/kv/range", "{}"},                                           // no key
           {"/v3/kv/range", ""},                                             // no body
           {"/v3/kv/put", R"({"value":"eA=="})"},                            // no key
           {"/v3/kv/range", absl::StrCat(R"({"key":")", k, R"(","revision":"99999"})")},
           {"/v3/kv/put", absl::StrCat(R"({"key":")", k, R"(","lease":"12345"})")},
           {"/v3/lease/revoke", R"({"ID":"12345"})"},
           {"/v3/kv/lease/timetolive", R"({"ID":"12345"})"},  // 200, TTL -1
           {"/v3/auth/authenticate", R"({"name":"x","password":"y"})"},
           {"/v3/auth/user/get", R"({"name":"nobody"})"},
           {"/v3/kv/txn", absl::StrCat(R"({"success":[{"request_put":{"key":")", k,
                                       R"("}},{"request_put":{"key":")", k, R"("}}]})")},
           {"/v3/kv/compaction", R"({"revision":"99999"})"},
           {"/v3/lock/unlock", "{}"},
           {"/v3/election/leader", R"({"name":"bm8tZWxlY3Rpb24="})"},
       }) {
    auto p = Both(path, body);
    EXPECT_TRUE(Same(p)) << path << " " << body;
    if (p.etcd.status != 200) {
      EXPECT_EQ(p.capstan.body, p.etcd.body) << path << " " << body;
    }
  }
  // FailedPrecondition is 400 in grpc-gateway v2 (412 in v1).
  auto failed = Both("/v3/auth/user/get", R"({"name":"nobody"})");
  EXPECT_EQ(failed.etcd.status, 400);
  EXPECT_EQ(failed.capstan.body, R"({"code":9, "message":"etcdserver: user name not found"})");
  // Bodies that do not decode: the same status and code; the decoders'
  // texts differ (Go's encoding/json and protobuf's JSON parser).
  for (const std::string body : {"notjson", R"({"key":5})", R"({"key":"YQ","limit":"x"})"}) {
    auto p = Both("/v3/kv/range", body);
    EXPECT_EQ(p.etcd.status, 400) << body;
    EXPECT_EQ(p.capstan.status, 400) << body;
    EXPECT_EQ(Code(p.etcd), 3) << body;
    EXPECT_EQ(Code(p.capstan), 3) << body;
  }
  // A server-streaming call's body that does not decode fails as a unary
  // call's does.
  auto snapshot = Both("/v3/maintenance/snapshot", "garbage");
  EXPECT_EQ(snapshot.etcd.status, 400);
  EXPECT_EQ(snapshot.capstan.status, 400);
  EXPECT_EQ(Code(snapshot.etcd), 3);
  EXPECT_EQ(Code(snapshot.capstan), 3);
  // A bidirectional stream's request that does not decode ends what is
  // sent: the gateway closes its side of the call, even before the first
  // request. A keep-alive stream then ends with nothing said (200, chunked,
  // no content type); a watch stream waits with nothing to say.
  auto keep_alive = Both("/v3/lease/keepalive", "garbage");
  EXPECT_TRUE(Same(keep_alive));
  EXPECT_EQ(keep_alive.etcd.status, 200);
  EXPECT_EQ(keep_alive.capstan.headers["transfer-encoding"], "chunked");
  EXPECT_EQ(keep_alive.capstan.headers.count("content-type"), 0u);
  EXPECT_EQ(keep_alive.capstan.body, "");
  auto watch = Open("/v3/watch", "garbage");
  for (int i = 0; i < 2; ++i) {
    HttpAnswer head;
    EXPECT_FALSE(watch->client[i]->ReadHead(&head, std::chrono::milliseconds(500)))
        << (i == 0 ? "etcd" : "capstan") << " answered " << head.status;
  }
}

TEST_F(DiffHttpTest, CompactionAndCompactedReads) {
  PutBoth(K("c"), "1");
  const int64_t rev = PutBoth(K("c"), "2");
  PutBoth(K("c"), "3");
  EXPECT_TRUE(Same(Both("/v3/kv/compaction", absl::StrCat(R"({"revision":")", rev, R"(","physical":true})"))));
  for (int64_t at : {rev - 1, rev, rev + 1}) {
    auto p = Both("/v3/kv/range", absl::StrCat(R"({"key":")", B64(K("c")), R"(","revision":")", at, R"("})"));
    EXPECT_TRUE(Same(p)) << at;
  }
  auto again = Both("/v3/kv/compaction", absl::StrCat(R"({"revision":")", rev - 1, R"("})"));
  EXPECT_TRUE(Same(again));
  EXPECT_EQ(again.etcd.status, 400);
}

TEST_F(DiffHttpTest, Leases) {
  const std::string id = "7340032";  // explicit: both servers hold the same ID
  EXPECT_TRUE(Same(Both("/v3/lease/grant", absl::StrCat(R"({"ID":")", id, R"(","TTL":"60"})"))));
  auto taken = Both("/v3/lease/grant", absl::StrCat(R"({"ID":")", id, R"(","TTL":"60"})"));
  EXPECT_TRUE(Same(taken));
  EXPECT_EQ(taken.etcd.status, 400);  // FailedPrecondition: 400 in grpc-gateway v2
  EXPECT_TRUE(Same(Both("/v3/kv/put", absl::StrCat(R"({"key":")", B64(K("l")),
                                                  R"(","value":"eA==","lease":")", id, R"("})"))));
  for (const char* path : {"/v3/lease/timetolive", "/v3/kv/lease/timetolive"}) {
    // The remaining TTL may have ticked on one server and not the other.
    auto p = Both(path, absl::StrCat(R"({"ID":")", id, R"(","keys":true})"));
    EXPECT_TRUE(Same(p, {"TTL"})) << path;
    EXPECT_TRUE(absl::StrContains(p.capstan.body, B64(K("l")))) << p.capstan.body;
  }
  for (const char* path : {"/v3/lease/leases", "/v3/kv/lease/leases"}) {
    auto p = Both(path, "{}");
    EXPECT_EQ(p.etcd.status, 200);
    EXPECT_EQ(p.capstan.status, 200);
    EXPECT_TRUE(absl::StrContains(p.etcd.body, absl::StrCat(R"({"ID":")", id, R"("})")));
    EXPECT_TRUE(absl::StrContains(p.capstan.body, absl::StrCat(R"({"ID":")", id, R"("})")))
        << p.capstan.body;
  }
  // Keep-alive is a stream: one answer per request in the body.
  auto s = Open("/v3/lease/keepalive",
                absl::StrCat(R"({"ID":")", id, R"("} {"ID":"99"})"));
  ReadBoth(s.get(), 2);
  ExpectSameLines(*s);
  EXPECT_TRUE(absl::StrContains(s->lines[1][0], R"("TTL":"60")")) << s->lines[1][0];
  s.reset();
  for (const char* path : {"/v3/lease/revoke", "/v3/kv/lease/revoke"}) {
    auto p = Both(path, absl::StrCat(R"({"ID":")", id, R"("})"));
    EXPECT_TRUE(Same(p)) << path;
  }
  EXPECT_TRUE(Same(Both("/v3/kv/range", absl::StrCat(R"({"key":")", B64(K("l")), R"("})"))));
}

TEST_F(DiffHttpTest, Watch) {
  const int64_t first = PutBoth(K("w"), "1");
  PutBoth(K("w"), "2");
  DeleteBoth(K("w"));
  // History from the first put with previous values, and a second watcher
  // on the prefix without deletes. (The gateway sends a body's requests at
  // once: a progress request here would find the first watcher catching up,
  // and etcd 3.5 drops such a request; see WatchProgress.)
  auto s = Open("/v3/watch",
                absl::StrCat(R"({"create_request":{"key":")", B64(K("w")), R"(","start_revision":")",
                             first, R"(","prev_kv":true}})", "\n",
                             R"({"create_request":{"key":")", B64(K("")), R"(","range_end":")",
                             B64(PrefixEnd(K(""))), R"(","filters":["NODELETE"],"watch_id":"7"}})"));
  // created, history, created (7): the history may come before or after the
  // second watcher's answer.
  ReadBoth(s.get(), 3);
  ExpectSameLinesInAnyOrder(*s);
  EXPECT_TRUE(absl::StrContains(absl::StrJoin(s->lines[1], "\n"), R"("type":"DELETE")"));
  // A write now reaches both watchers (in no set order on etcd).
  PutBoth(K("w"), "3");
  for (auto& l : s->lines) l.clear();
  ReadBoth(s.get(), 2);
  ExpectSameLinesInAnyOrder(*s);
}

// A progress request on a stream whose watchers are synced: answered with
// watch ID -1 at the current revision (before or after the created answer:
// etcd sends the two from different queues).
TEST_F(DiffHttpTest, WatchProgress) {
  PutBoth(K("p"), "1");
  auto s = Open("/v3/watch", absl::StrCat(R"({"create_request":{"key":")", B64(K("p")), R"("}})",
                                          R"( {"progress_request":{}})"));
  ReadBoth(s.get(), 2);
  ExpectSameLinesInAnyOrder(*s);
  EXPECT_TRUE(absl::StrContains(absl::StrJoin(s->lines[1], "\n"), R"("watch_id":"-1")"));
}

TEST_F(DiffHttpTest, WatchFromCompactedRevision) {
  const int64_t first = PutBoth(K("x"), "1");
  const int64_t second = PutBoth(K("x"), "2");
  Both("/v3/kv/compaction", absl::StrCat(R"({"revision":")", second, R"("})"));
  auto s = Open("/v3/watch", absl::StrCat(R"({"create_request":{"key":")", B64(K("x")),
                                          R"(","start_revision":")", first, R"("}})"));
  ReadBoth(s.get(), 2);
  ExpectSameLines(*s);
  EXPECT_TRUE(absl::StrContains(s->lines[1][1], R"("compact_revision")")) << s->lines[1][1];
}

TEST_F(DiffHttpTest, LockAndElection) {
  const std::string id = "7340033";
  Both("/v3/lease/grant", absl::StrCat(R"({"ID":")", id, R"(","TTL":"60"})"));
  const std::string name = B64(K("lock"));
  auto lock = Both("/v3/lock/lock", absl::StrCat(R"({"name":")", name, R"(","lease":")", id, R"("})"));
  EXPECT_TRUE(Same(lock));
  pb::Value v;
  ASSERT_TRUE(ParseJson(lock.capstan.body, &v)) << lock.capstan.body;
  const std::string key = v.struct_value().fields().at("key").string_value();
  EXPECT_TRUE(Same(Both("/v3/lock/unlock", absl::StrCat(R"({"key":")", key, R"("})"))));

  const std::string election = B64(K("election"));
  auto campaign = Both("/v3/election/campaign",
                       absl::StrCat(R"({"name":")", election, R"(","lease":")", id,
                                    R"(","value":"b25l"})"));
  EXPECT_TRUE(Same(campaign));
  ASSERT_TRUE(ParseJson(campaign.capstan.body, &v)) << campaign.capstan.body;
  pb::Value leader = v.struct_value().fields().at("leader");
  std::string leader_json;
  ASSERT_TRUE(pb::util::MessageToJsonString(leader, &leader_json).ok());
  EXPECT_TRUE(Same(Both("/v3/election/leader", absl::StrCat(R"({"name":")", election, R"("})"))));
  EXPECT_TRUE(Same(Both("/v3/election/proclaim",
                        absl::StrCat(R"({"leader":)", leader_json, R"(,"value":"dHdv"})"))));
  auto observe = Open("/v3/election/observe", absl::StrCat(R"({"name":")", election, R"("})"));
  ReadBoth(observe.get(), 1);
  ExpectSameLines(*observe);
  EXPECT_TRUE(Same(Both("/v3/election/resign", absl::StrCat(R"({"leader":)", leader_json, "}"))));
  Both("/v3/lease/revoke", absl::StrCat(R"({"ID":")", id, R"("})"));
}

TEST_F(DiffHttpTest, ClusterAndMaintenance) {
  EXPECT_TRUE(Same(Both("/v3/cluster/member/list", "{}")));
  // Status: the same fields (their values are each server's own).
  auto status = Both("/v3/maintenance/status", "{}");
  ASSERT_EQ(status.etcd.status, 200);
  ASSERT_EQ(status.capstan.status, 200);
  pb::Value e, c;
  ASSERT_TRUE(ParseJson(status.etcd.body, &e));
  ASSERT_TRUE(ParseJson(status.capstan.body, &c));
  for (const char* field : {"header", "version", "dbSize", "leader", "raftIndex", "raftTerm"}) {
    EXPECT_TRUE(e.struct_value().fields().contains(field)) << field;
    EXPECT_TRUE(c.struct_value().fields().contains(field)) << field << ": " << status.capstan.body;
  }
  // /v3/maintenance/hash is Hash (etcd's protos map HashKV there too): a
  // revision is ignored rather than checked.
  auto hash = Both("/v3/maintenance/hash", R"({"revision":"99999"})");
  EXPECT_EQ(hash.etcd.status, 200) << hash.etcd.body;
  EXPECT_EQ(hash.capstan.status, 200) << hash.capstan.body;
  EXPECT_TRUE(absl::StrContains(hash.capstan.body, R"("hash":)")) << hash.capstan.body;
  // An alarm request is answered with a header (whose IDs differ).
  auto alarm = Both("/v3/maintenance/alarm", R"({"action":"GET"})");
  EXPECT_TRUE(absl::StrContains(alarm.etcd.body, R"("header":)")) << alarm.etcd.body;
  EXPECT_TRUE(Same(alarm, {"header"}));
}

// What is not a gateway call: wrong methods and paths, CORS preflight, and
// the health, version and metrics endpoints on the client port.
TEST_F(DiffHttpTest, PathsMethodsAndEndpoints) {
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/v3/kv/range"}, {"PUT", "/v3/kv/put"}, {"GET", "/v3/watch"},
           {"POST", "/v3/no/such/call"}, {"GET", "/no-such-page"}, {"POST", "/health"},
           {"PUT", "/version"}, {"HEAD", "/version"}, {"HEAD", "/health"}, {"HEAD", "/v3/kv/range"},
           {"POST", "/v3beta/kv/range"},  // still served as /v3/, by 3.5 too
           {"OPTIONS", "/v3/kv/range"}, {"OPTIONS", "/anything"}}) {
    auto p = Both(path, method == "GET" || method == "OPTIONS" ? "" : "{}", method);
    EXPECT_TRUE(Same(p)) << method << " " << path;
    for (const char* h : {"access-control-allow-origin", "access-control-allow-methods",
                          "access-control-allow-headers"}) {
      EXPECT_EQ(p.etcd.headers[h], p.capstan.headers[h]) << method << " " << path << " " << h;
    }
  }
  auto health = Both("/health", "", "GET");
  EXPECT_EQ(health.etcd.status, 200);
  EXPECT_EQ(health.etcd.body, R"({"health":"true","reason":""})");
  EXPECT_TRUE(Same(health));
  auto version = Both("/version", "", "GET");
  // 3.6's "storage", which the 3.5 reference lacks, is checked in
  // diff_health_test.
  EXPECT_TRUE(Same(version, {"etcdserver", "etcdcluster", "storage"}));
  EXPECT_TRUE(absl::StrContains(version.capstan.body, R"("etcdserver":")")) << version.capstan.body;
  for (const std::string method : {"GET", "POST"}) {  // Prometheus' handler takes any method
    auto metrics = Both("/metrics", "", method);
    EXPECT_EQ(metrics.capstan.status, 200) << method;
    for (const auto* a : {&metrics.etcd, &metrics.capstan}) {
      EXPECT_TRUE(absl::StrContains(a->body, "\netcd_server_has_leader 1\n")) << method;
    }
  }
}

// Strings as etcd's gateway writes them: protojson escapes only quotes,
// backslashes and control characters (<, & and U+2028 go out as they are).
TEST_F(DiffHttpTest, StringsInAnswers) {
  const std::string name = R"(s<t>&\u2028\u00e9\u0001\u001b\u007f/\"\\x)";
  EXPECT_TRUE(Same(
      Both("/v3/auth/user/add", absl::StrCat(R"({"name":")", name, R"(","password":"p"})"))));
  auto list = Both("/v3/auth/user/list", "{}");
  EXPECT_TRUE(Same(list));
  EXPECT_TRUE(absl::StrContains(list.capstan.body,
                                "\"s<t>&\xe2\x80\xa8\xc3\xa9\\u0001\\u001b\x7f/\\\"\\\\x\""))
      << list.capstan.body;
  EXPECT_TRUE(Same(Both("/v3/auth/user/delete", absl::StrCat(R"({"name":")", name, R"("})"))));
}

// A kept-alive connection carries one call after another, as Go's and
// curl's clients send them.
TEST_F(DiffHttpTest, KeptAliveConnection) {
  HttpClient e(etcd().client_port()), c(capstan().client_port());
  for (int i = 0; i < 3; ++i) {
    const std::string body =
        absl::StrCat(R"({"key":")", B64(K("ka")), R"(","value":")", B64(std::to_string(i)), R"("})");
    HttpPair p{e.Request("POST", "/v3/kv/put", body), c.Request("POST", "/v3/kv/put", body)};
    EXPECT_TRUE(Same(p)) << i;
    HttpPair r{e.Request("POST", "/v3/kv/range", absl::StrCat(R"({"key":")", B64(K("ka")), R"("})")),
               c.Request("POST", "/v3/kv/range", absl::StrCat(R"({"key":")", B64(K("ka")), R"("})"))};
    EXPECT_TRUE(Same(r)) << i;
  }
}

// Auth through the gateway: the token from /v3/auth/authenticate goes in
// the Authorization header. Last in the suite: it turns auth on and off.
TEST_F(DiffHttpTest, AuthWithToken) {
  EXPECT_TRUE(Same(Both("/v3/auth/user/add", R"({"name":"root","password":"pw"})")));
  EXPECT_TRUE(Same(Both("/v3/auth/user/grant", R"({"user":"root","role":"root"})")));
  EXPECT_TRUE(Same(Both("/v3/auth/enable", "{}")));
  const std::string range = absl::StrCat(R"({"key":")", B64(K("a")), R"("})");
  auto anonymous = Both("/v3/kv/range", range);
  EXPECT_TRUE(Same(anonymous));
  EXPECT_NE(anonymous.etcd.status, 200);
  auto login = Both("/v3/auth/authenticate", R"({"name":"root","password":"pw"})");
  EXPECT_TRUE(Same(login, {"token"}));
  std::string token[2];
  for (int i = 0; i < 2; ++i) {
    pb::Value v;
    ASSERT_TRUE(ParseJson(i == 0 ? login.etcd.body : login.capstan.body, &v));
    token[i] = v.struct_value().fields().at("token").string_value();
  }
  HttpPair p{HttpRequestTo(etcd().client_port(), "POST", "/v3/kv/range", range,
                           {{"Authorization", token[0]}}),
             HttpRequestTo(capstan().client_port(), "POST", "/v3/kv/range", range,
                           {{"Authorization", token[1]}})};
  EXPECT_TRUE(Same(p));
  EXPECT_EQ(p.capstan.status, 200);
  HttpPair bad{HttpRequestTo(etcd().client_port(), "POST", "/v3/kv/range", range,
                             {{"Authorization", "bogus"}}),
               HttpRequestTo(capstan().client_port(), "POST", "/v3/kv/range", range,
                             {{"Authorization", "bogus"}})};
  EXPECT_TRUE(Same(bad));
  EXPECT_EQ(bad.etcd.status, 401);
  // grpc-gateway v2 names the reason an Unauthenticated call failed.
  EXPECT_EQ(bad.etcd.headers["www-authenticate"], "etcdserver: invalid auth token");
  EXPECT_EQ(bad.capstan.headers["www-authenticate"], bad.etcd.headers["www-authenticate"]);
  HttpPair off{HttpRequestTo(etcd().client_port(), "POST", "/v3/auth/disable", "{}",
                             {{"Authorization", token[0]}}),
               HttpRequestTo(capstan().client_port(), "POST", "/v3/auth/disable", "{}",
                             {{"Authorization", token[1]}})};
  EXPECT_TRUE(Same(off));
  EXPECT_EQ(off.capstan.status, 200);
  EXPECT_TRUE(Same(Both("/v3/auth/user/delete", R"({"name":"root"})")));
}

}  // namespace
}  // namespace capstan::testing
