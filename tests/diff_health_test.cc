// /livez, /readyz and their checks' paths, against etcd 3.5.16's, on the
// client and the metrics URLs: status, the headers a client reads and the
// body, for every form (plain, ?verbose, ?exclude= one, two or an unknown
// check, one check's path, an unknown check's path, other methods), then
// the same with a CORRUPT alarm raised on both through Maintenance.Alarm.
// Also what etcd 3.6 added and 3.5.16 lacks: the non_learner check, the
// Status fields storageVersion, dbSizeQuota and downgradeInfo, /version's
// "storage", and the request metrics of 3.6 and 3.7.
//
// etcd keeps its checks in a Go map, so the order of its lines varies from
// one answer to the next: lines are compared as sets, and Capstan's
// non_learner line (3.6's check) is left out where 3.5.16 has none.

#include <algorithm>
#include <chrono>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "http_client.h"
#include "process_fixture.h"

namespace capstan::testing {
namespace {

constexpr char kNonLearnerLine[] = "[+]non_learner ok";

class DiffHealthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    missing_ = MissingReference("real etcd", EtcdBinary());
    if (!missing_.empty()) return;
    auto etcd = ServerProcess::Start(ServerOptions::Etcd());
    auto capstan = ServerProcess::Start(ServerOptions::Capstan());
    if (!etcd.ok() || !capstan.ok()) {
      error_ = absl::StrCat("etcd: ", etcd.status().ToString(), "; capstan: ",
                            capstan.status().ToString());
      return;
    }
    etcd_ = std::move(*etcd).release();
    capstan_ = std::move(*capstan).release();
  }
  static void TearDownTestSuite() {
    delete etcd_;
    delete capstan_;
    etcd_ = capstan_ = nullptr;
  }
  void SetUp() override {
    if (!missing_.empty()) CAPSTAN_REFERENCE_MISSING(missing_);
    ASSERT_TRUE(error_.empty()) << error_;
  }

  // The body's lines without the last "ok" (kept apart), sorted; Capstan's
  // non_learner line dropped.
  static std::vector<std::string> Lines(const std::string& body) {
    std::vector<std::string> lines = absl::StrSplit(body, '\n');
    lines.erase(std::remove(lines.begin(), lines.end(), kNonLearnerLine), lines.end());
    std::sort(lines.begin(), lines.end());
    return lines;
  }

  // The same status, Content-Type, X-Content-Type-Options and Allow, and
  // the same body up to the order of its check lines.
  static ::testing::AssertionResult Same(const HttpAnswer& e, const HttpAnswer& c) {
    if (e.status == 0 || c.status == 0) {
      return ::testing::AssertionFailure() << "no answer: etcd " << e.status << ", capstan "
                                           << c.status;
    }
    if (e.status != c.status) {
      return ::testing::AssertionFailure() << "status " << e.status << " vs " << c.status
                                           << "\netcd: " << e.body << "\ncapstan: " << c.body;
    }
    for (const char* h : {"content-type", "x-content-type-options", "allow"}) {
      auto ei = e.headers.find(h);
      auto ci = c.headers.find(h);
      const std::string ev = ei == e.headers.end() ? "(none)" : ei->second;
      const std::string cv = ci == c.headers.end() ? "(none)" : ci->second;
      if (ev != cv) return ::testing::AssertionFailure() << h << ": " << ev << " vs " << cv;
    }
    // Each ends the same way ("ok\n", or the failure's extra newline).
    const bool same_end = absl::EndsWith(e.body, "\n\n") == absl::EndsWith(c.body, "\n\n") &&
                          absl::EndsWith(e.body, "ok\n") == absl::EndsWith(c.body, "ok\n");
    if (!same_end || Lines(e.body) != Lines(c.body)) {
      return ::testing::AssertionFailure() << "body\netcd:\n" << e.body << "capstan:\n" << c.body;
    }
    return ::testing::AssertionSuccess();
  }

  // Every form, on the client and the metrics URLs of both.
  void ExpectSameForms() {
    const std::vector<std::pair<std::string, std::string>> forms = {
        {"GET", "/livez"},
        {"GET", "/readyz"},
        {"GET", "/livez?verbose"},
        {"GET", "/readyz?verbose"},
        {"GET", "/readyz?verbose=false"},
        {"GET", "/readyz?exclude=linearizable_read&verbose"},
        {"GET", "/readyz?exclude=linearizable_read&exclude=data_corruption&verbose"},
        {"GET", "/readyz?exclude=no_such_check&verbose"},
        {"GET", "/readyz?exclude=&verbose"},
        {"GET", "/readyz?exclude=data_corruption"},
        {"GET", "/livez?exclude=serializable_read&verbose"},
        {"GET", "/readyz/linearizable_read"},
        {"GET", "/readyz/linearizable_read?verbose"},
        {"GET", "/readyz/serializable_read?verbose"},
        {"GET", "/readyz/data_corruption"},
        {"GET", "/readyz/data_corruption?verbose"},
        {"GET", "/livez/serializable_read?verbose"},
        {"GET", "/livez/linearizable_read"},  // not a check of /livez
        {"GET", "/readyz/no_such_check"},
        {"GET", "/readyz/"},
        {"GET", "/livez/"},
        {"GET", "/readyzz"},
        {"POST", "/readyz"},
        {"PUT", "/livez"},
        {"HEAD", "/readyz"},
        {"POST", "/readyz/linearizable_read"},
        {"GET", "/health"},
    };
    for (const auto& [method, path] : forms) {
      for (bool metrics_url : {false, true}) {
        const HttpAnswer e = HttpRequestTo(
            metrics_url ? etcd_->metrics_port() : etcd_->client_port(), method, path);
        const HttpAnswer c = HttpRequestTo(
            metrics_url ? capstan_->metrics_port() : capstan_->client_port(), method, path);
        EXPECT_TRUE(Same(e, c)) << method << " " << path << (metrics_url ? " (metrics URL)" : "");
      }
    }
  }

  static etcdserverpb::StatusResponse Status(const ServerProcess& s) {
    auto stub = etcdserverpb::Maintenance::NewStub(s.NewChannel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    etcdserverpb::StatusResponse resp;
    const grpc::Status st = stub->Status(&ctx, etcdserverpb::StatusRequest(), &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp;
  }

  static grpc::Status RaiseCorrupt(const ServerProcess& s) {
    const uint64_t member = Status(s).header().member_id();
    auto stub = etcdserverpb::Maintenance::NewStub(s.NewChannel());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    etcdserverpb::AlarmRequest req;
    req.set_action(etcdserverpb::AlarmRequest::ACTIVATE);
    req.set_memberid(member);
    req.set_alarm(etcdserverpb::CORRUPT);
    etcdserverpb::AlarmResponse resp;
    grpc::Status st = stub->Alarm(&ctx, req, &resp);
    if (st.ok() && (resp.alarms_size() != 1 || resp.alarms(0).alarm() != etcdserverpb::CORRUPT)) {
      return grpc::Status(grpc::UNKNOWN, "the alarm is not in the answer: " + resp.DebugString());
    }
    return st;
  }

  static std::string Metrics(const ServerProcess& s) {
    return HttpRequestTo(s.metrics_port(), "GET", "/metrics").body;
  }

  static inline std::string missing_;
  static inline std::string error_;
  static inline ServerProcess* etcd_ = nullptr;
  static inline ServerProcess* capstan_ = nullptr;
};

TEST_F(DiffHealthTest, EveryFormAsEtcd) {
  ExpectSameForms();
  // The bodies themselves, in Capstan's fixed order.
  const HttpAnswer ready = HttpRequestTo(capstan_->client_port(), "GET", "/readyz?verbose");
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(ready.body,
            "[+]data_corruption ok\n[+]serializable_read ok\n[+]linearizable_read ok\n"
            "[+]non_learner ok\nok\n");
  EXPECT_EQ(HttpRequestTo(capstan_->client_port(), "GET", "/livez").body, "ok\n");
}

// 3.6's check, which 3.5.16 does not have (its path is a 404 there).
TEST_F(DiffHealthTest, NonLearnerCheckAsEtcd36) {
  const HttpAnswer c = HttpRequestTo(capstan_->client_port(), "GET", "/readyz/non_learner?verbose");
  EXPECT_EQ(c.status, 200);
  EXPECT_EQ(c.body, "[+]non_learner ok\nok\n");
  const HttpAnswer e = HttpRequestTo(etcd_->client_port(), "GET", "/readyz/non_learner");
  EXPECT_EQ(e.status, 404) << "etcd 3.5.16 has no non_learner check";
  const HttpAnswer excluded =
      HttpRequestTo(capstan_->client_port(), "GET", "/readyz?exclude=non_learner&verbose");
  EXPECT_FALSE(absl::StrContains(excluded.body, "non_learner")) << excluded.body;
}

TEST_F(DiffHealthTest, ChecksAreCountedAsEtcdCountsThem) {
  for (const ServerProcess* s : {etcd_, capstan_}) {
    ASSERT_EQ(HttpRequestTo(s->client_port(), "GET", "/readyz").status, 200);
    ASSERT_EQ(HttpRequestTo(s->client_port(), "GET", "/livez").status, 200);
  }
  const std::string e = Metrics(*etcd_), c = Metrics(*capstan_);
  for (const char* series :
       {"\netcd_server_healthcheck{name=\"linearizable_read\",type=\"readyz\"} 1\n",
        "\netcd_server_healthcheck{name=\"serializable_read\",type=\"livez\"} 1\n",
        "\netcd_server_healthcheck{name=\"data_corruption\",type=\"readyz\"} 1\n",
        "# TYPE etcd_server_healthchecks_total counter\n",
        "\netcd_server_healthchecks_total{name=\"serializable_read\",status=\"success\","
        "type=\"livez\"} "}) {
    EXPECT_TRUE(absl::StrContains(e, series)) << "etcd lacks " << series;
    EXPECT_TRUE(absl::StrContains(c, series)) << "capstan lacks " << series;
  }
}

TEST_F(DiffHealthTest, StatusAndVersionAsEtcd36) {
  // A new cluster decides its version a few milliseconds after its first
  // leader, and until then 3.6 reports none (server/http/
  // http_endpoints_test.cc has that answer): ask until it is decided, as a
  // client that needs it would.
  etcdserverpb::StatusResponse s = Status(*capstan_);
  for (const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
       s.storageversion().empty() && std::chrono::steady_clock::now() < give_up;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s = Status(*capstan_);
  }
  EXPECT_EQ(s.version(), CAPSTAN_ETCD_API_VERSION);
  EXPECT_TRUE(std::regex_match(s.version(), std::regex(R"(3\.6\.\d+)"))) << s.version();
  EXPECT_EQ(s.storageversion(), "3.6.0");
  EXPECT_EQ(s.dbsizequota(), int64_t{2} << 30) << "etcd's default --quota-backend-bytes";
  ASSERT_TRUE(s.has_downgradeinfo()) << "etcd 3.6 always sets it";
  EXPECT_FALSE(s.downgradeinfo().enabled());
  EXPECT_EQ(s.downgradeinfo().targetversion(), "");
  const HttpAnswer v = HttpRequestTo(capstan_->client_port(), "GET", "/version");
  EXPECT_EQ(v.status, 200);
  EXPECT_EQ(v.headers.at("content-type"), "application/json");
  EXPECT_EQ(v.body, absl::StrCat(R"({"etcdserver":")", CAPSTAN_ETCD_API_VERSION,
                                 R"(","etcdcluster":"3.6.0","storage":"3.6.0"})"));
  // etcd 3.5.16 has the first two, in that order.
  const HttpAnswer ev = HttpRequestTo(etcd_->client_port(), "GET", "/version");
  EXPECT_TRUE(std::regex_match(ev.body, std::regex(R"(\{"etcdserver":"3\.5\.\d+","etcdcluster":"3\.5\.0"\})")))
      << ev.body;
}

// etcd_server_request_duration_seconds (3.7) and
// etcd_server_range_duration_seconds (3.6): their type, labels and buckets,
// and that they move with the requests.
TEST_F(DiffHealthTest, RequestMetricsMoveWithRequests) {
  auto count = [](const std::string& text, const std::string& series) -> long {
    const size_t at = text.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stol(text.substr(at + series.size() + 2));
  };
  const std::string put_count = R"(etcd_server_request_duration_seconds_count{success="true",type="Put"})";
  const std::string range_count = R"(etcd_server_range_duration_seconds_count{success="true"})";
  const std::string failed_range =
      R"(etcd_server_request_duration_seconds_count{success="false",type="Range"})";
  const std::string before = Metrics(*capstan_);
  auto kv = etcdserverpb::KV::NewStub(capstan_->NewChannel());
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    etcdserverpb::PutRequest put;
    put.set_key("/request-metrics");
    put.set_value(std::to_string(i));
    etcdserverpb::PutResponse resp;
    ASSERT_TRUE(kv->Put(&ctx, put, &resp).ok());
  }
  {
    grpc::ClientContext ctx;
    etcdserverpb::RangeRequest range;
    range.set_key("/request-metrics");
    etcdserverpb::RangeResponse resp;
    ASSERT_TRUE(kv->Range(&ctx, range, &resp).ok());
  }
  {
    grpc::ClientContext ctx;
    etcdserverpb::RangeRequest range;  // no key: etcd's "key is not provided"
    etcdserverpb::RangeResponse resp;
    ASSERT_FALSE(kv->Range(&ctx, range, &resp).ok());
  }
  const std::string after = Metrics(*capstan_);
  EXPECT_EQ(count(after, put_count), std::max(count(before, put_count), 0L) + 3) << after;
  EXPECT_GE(count(after, range_count), std::max(count(before, range_count), 0L) + 1);
  EXPECT_EQ(count(after, failed_range), std::max(count(before, failed_range), 0L) + 1);
  for (const char* line : {
           "# TYPE etcd_server_request_duration_seconds histogram\n",
           "\netcd_server_request_duration_seconds_bucket{success=\"true\",type=\"Put\",le=\"0.001\"} ",
           "\netcd_server_request_duration_seconds_bucket{success=\"true\",type=\"Put\",le=\"8.192\"} ",
           "\netcd_server_request_duration_seconds_bucket{success=\"true\",type=\"Put\",le=\"+Inf\"} ",
           "# TYPE etcd_server_range_duration_seconds histogram\n",
           "\netcd_server_range_duration_seconds_bucket{success=\"true\",le=\"0.0001\"} ",
           "\netcd_server_range_duration_seconds_bucket{success=\"true\",le=\"52.4288\"} ",
       }) {
    EXPECT_TRUE(absl::StrContains(after, line)) << "no " << line;
  }
  // etcd's buckets exactly: 14 (1 ms doubling) and 20 (0.1 ms doubling), and +Inf.
  auto buckets = [&after](const std::string& prefix) {
    size_t n = 0;
    for (size_t at = after.find(prefix); at != std::string::npos; at = after.find(prefix, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(buckets(R"(etcd_server_request_duration_seconds_bucket{success="true",type="Put",)"), 15u);
  EXPECT_EQ(buckets(R"(etcd_server_range_duration_seconds_bucket{success="true",)"), 21u);
}

// Last: the alarm stays. etcd accepts a CORRUPT alarm raised through
// Maintenance.Alarm; both then fail /readyz's data_corruption check and no
// other.
TEST_F(DiffHealthTest, CorruptAlarmFailsReadyzAsEtcd) {
  ASSERT_TRUE(RaiseCorrupt(*etcd_).ok());
  ASSERT_TRUE(RaiseCorrupt(*capstan_).ok());
  ExpectSameForms();
  const HttpAnswer ready = HttpRequestTo(capstan_->client_port(), "GET", "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_EQ(ready.body,
            "[-]data_corruption failed: alarm activated: CORRUPT\n[+]serializable_read ok\n"
            "[+]linearizable_read ok\n[+]non_learner ok\n\n");
  EXPECT_EQ(HttpRequestTo(capstan_->client_port(), "GET", "/livez").status, 200);
  const std::string e = Metrics(*etcd_), c = Metrics(*capstan_);
  for (const char* series :
       {"\netcd_server_healthcheck{name=\"data_corruption\",type=\"readyz\"} 0\n",
        "\netcd_server_healthchecks_total{name=\"data_corruption\",status=\"error\","
        "type=\"readyz\"} "}) {
    EXPECT_TRUE(absl::StrContains(e, series)) << "etcd lacks " << series;
    EXPECT_TRUE(absl::StrContains(c, series)) << "capstan lacks " << series;
  }
  // etcd 3.6's alarm gauge, by member id in hex.
  const std::string member = absl::StrCat(absl::Hex(Status(*capstan_).header().member_id()));
  EXPECT_TRUE(absl::StrContains(
      c, absl::StrCat("\netcd_debugging_server_alarms{alarm_type=\"CORRUPT\",server_id=\"", member,
                      "\"} 1\n")))
      << c;
}

}  // namespace
}  // namespace capstan::testing
