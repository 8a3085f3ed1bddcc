#include "diff_fixture.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"

namespace capstan::testing {

namespace pb = google::protobuf;
using etcdserverpb::RangeRequest;
using etcdserverpb::RangeResponse;

// ---------------------------------------------------------------------------
// Normalization

std::string NormalizePorts(std::string s, const ServerProcess& server) {
  // Longest, most specific first; ports are distinct per process.
  return absl::StrReplaceAll(
      s, {{absl::StrCat("127.0.0.1:", server.client_port()), "127.0.0.1:CLIENT-PORT"},
          {absl::StrCat("127.0.0.1:", server.peer_port()), "127.0.0.1:PEER-PORT"},
          {absl::StrCat("127.0.0.1:", server.metrics_port()), "127.0.0.1:METRICS-PORT"}});
}

void Normalize(pb::Message* m, const ServerProcess& server) {
  const pb::Descriptor* d = m->GetDescriptor();
  const pb::Reflection* r = m->GetReflection();
  const std::string& type = d->full_name();
  auto clear = [&](const char* field) {
    const pb::FieldDescriptor* f = d->FindFieldByName(field);
    if (f != nullptr) r->ClearField(m, f);
  };
  if (type == "etcdserverpb.ResponseHeader") {
    clear("cluster_id");
    clear("member_id");
    clear("raft_term");
  } else if (type == "etcdserverpb.Member") {
    clear("ID");
    for (const char* urls : {"peerURLs", "clientURLs"}) {
      const pb::FieldDescriptor* f = d->FindFieldByName(urls);
      for (int i = 0; i < r->FieldSize(*m, f); ++i) {
        r->SetRepeatedString(m, f, i, NormalizePorts(r->GetRepeatedString(*m, f, i), server));
      }
    }
  } else if (type == "etcdserverpb.AlarmMember") {
    clear("memberID");
  } else if (type == "etcdserverpb.StatusResponse") {
    for (const char* f :
         {"version", "dbSize", "dbSizeInUse", "leader", "raftIndex", "raftTerm", "raftAppliedIndex",
          // etcd 3.6's, which the 3.5 reference lacks (diff_health_test
          // checks Capstan's).
          "storageVersion", "dbSizeQuota", "downgradeInfo"}) {
      clear(f);
    }
  } else if (type == "etcdserverpb.HashResponse") {
    clear("hash");  // a hash of etcd's bbolt file: differs by design
  }
  std::vector<const pb::FieldDescriptor*> fields;
  r->ListFields(*m, &fields);
  for (const pb::FieldDescriptor* f : fields) {
    if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (f->is_repeated()) {
      for (int i = 0; i < r->FieldSize(*m, f); ++i) {
        Normalize(r->MutableRepeatedMessage(m, f, i), server);
      }
    } else {
      Normalize(r->MutableMessage(m, f), server);
    }
  }
}

std::string Describe(const pb::Message& m, size_t max_bytes) {
  pb::TextFormat::Printer printer;
  printer.SetTruncateStringFieldLongerThan(256);
  std::string s;
  printer.PrintToString(m, &s);
  if (s.empty()) s = "<empty>\n";
  if (s.size() > max_bytes) s = s.substr(0, max_bytes) + "\n... (truncated)\n";
  return s;
}

std::string Describe(const grpc::Status& s) {
  if (s.ok()) return "OK";
  return absl::StrCat("code ", static_cast<int>(s.error_code()), " \"", s.error_message(), "\"");
}

::testing::AssertionResult SameAnswer(const grpc::Status& etcd_status,
                                      const pb::Message& etcd_resp, const ServerProcess& etcd,
                                      const grpc::Status& capstan_status,
                                      const pb::Message& capstan_resp,
                                      const ServerProcess& capstan) {
  const std::string what = etcd_resp.GetDescriptor()->name();
  if (etcd_status.error_code() != capstan_status.error_code() ||
      etcd_status.error_message() != capstan_status.error_message()) {
    return ::testing::AssertionFailure()
           << what << ": status differs\n  etcd:    " << Describe(etcd_status)
           << "\n  capstan: " << Describe(capstan_status)
           << (etcd_status.ok() ? "\netcd response:\n" + Describe(etcd_resp) : "")
           << (capstan_status.ok() ? "\ncapstan response:\n" + Describe(capstan_resp) : "");
  }
  if (!etcd_status.ok()) return ::testing::AssertionSuccess();
  std::unique_ptr<pb::Message> e(etcd_resp.New());
  std::unique_ptr<pb::Message> c(capstan_resp.New());
  e->CopyFrom(etcd_resp);
  c->CopyFrom(capstan_resp);
  Normalize(e.get(), etcd);
  Normalize(c.get(), capstan);
  pb::util::MessageDifferencer differ;
  std::string diff;
  differ.ReportDifferencesToString(&diff);
  if (differ.Compare(*e, *c)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": responses differ (normalized; left = etcd, right = capstan)\n"
         << diff << "etcd:\n" << Describe(*e) << "capstan:\n" << Describe(*c);
}

// ---------------------------------------------------------------------------
// JSON (etcdctl)

bool ParseJson(const std::string& text, pb::Value* out) {
  std::string_view t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.remove_suffix(1);
  while (!t.empty() && (t.front() == '\n' || t.front() == ' ')) t.remove_prefix(1);
  if (t.empty() || (t.front() != '{' && t.front() != '[')) return false;
  pb::util::JsonParseOptions opts;
  return pb::util::JsonStringToMessage(std::string(t), out, opts).ok();
}

void NormalizeJson(pb::Value* v, const ServerProcess& server, bool in_members) {
  switch (v->kind_case()) {
    case pb::Value::kStructValue: {
      auto* fields = v->mutable_struct_value()->mutable_fields();
      for (const char* k : {"cluster_id", "member_id", "raft_term"}) fields->erase(k);
      if (in_members) fields->erase("ID");
      for (auto& [k, child] : *fields) {
        NormalizeJson(&child, server, k == "members");
      }
      break;
    }
    case pb::Value::kListValue:
      for (auto& child : *v->mutable_list_value()->mutable_values()) {
        NormalizeJson(&child, server, in_members);
      }
      break;
    case pb::Value::kStringValue:
      v->set_string_value(NormalizePorts(v->string_value(), server));
      break;
    default:
      break;
  }
}

namespace {

// etcdctl logs failed retries to stderr as JSON lines with timestamps
// and client ids; they are noise, not output.
std::string DropLogLines(const std::string& s) {
  std::vector<std::string> keep;
  for (absl::string_view line : absl::StrSplit(s, '\n')) {
    if (absl::StartsWith(line, "{\"level\":")) continue;
    keep.emplace_back(line);
  }
  return absl::StrJoin(keep, "\n");
}

std::string Indent(const std::string& s) {
  if (s.empty()) return "    <empty>\n";
  std::string out;
  for (absl::string_view line : absl::StrSplit(s, '\n')) absl::StrAppend(&out, "    ", line, "\n");
  return out;
}

std::string JsonText(const pb::Value& v) {
  std::string s;
  pb::util::JsonPrintOptions o;
  o.add_whitespace = false;
  (void)pb::util::MessageToJsonString(v, &s, o);
  return s;
}

}  // namespace

::testing::AssertionResult SameEtcdctl(const EtcdctlPair& p) {
  const EtcdctlResult& e = p.etcd;
  const EtcdctlResult& c = p.capstan;
  auto describe = [](const EtcdctlResult& r) {
    return absl::StrCat("  ", r.raw.exit.ToString(), r.raw.timed_out ? " (timed out)" : "",
                        "\n  stdout:\n", Indent(r.is_json ? JsonText(r.json) : r.out),
                        "  stderr:\n", Indent(r.err));
  };
  auto fail = [&](const std::string& why) {
    return ::testing::AssertionFailure()
           << "etcdctl " << absl::StrJoin(e.argv.begin() + 1, e.argv.end(), " ") << ": " << why
           << "\netcd:\n" << describe(e) << "capstan:\n" << describe(c);
  };
  if (e.raw.exit.exited != c.raw.exit.exited || e.raw.exit.exit_code != c.raw.exit.exit_code ||
      e.raw.exit.term_signal != c.raw.exit.term_signal || e.raw.timed_out || c.raw.timed_out) {
    return fail("exit status differs");
  }
  if (e.err != c.err) return fail("stderr differs");
  if (e.is_json != c.is_json) return fail("only one stdout is JSON");
  if (e.is_json) {
    pb::util::MessageDifferencer differ;
    std::string diff;
    differ.ReportDifferencesToString(&diff);
    if (!differ.Compare(e.json, c.json)) return fail("JSON differs (normalized):\n" + diff);
  } else if (e.out != c.out) {
    return fail("stdout differs");
  }
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------
// DiffTest

int EnvCount(const char* name, int fallback) {
  const char* v = std::getenv(name);
  int n = 0;
  return v != nullptr && absl::SimpleAtoi(v, &n) && n > 0 ? n : fallback;
}

ServerStubs::ServerStubs(std::shared_ptr<grpc::Channel> ch)
    : channel(std::move(ch)),
      kv(etcdserverpb::KV::NewStub(channel)),
      watch(etcdserverpb::Watch::NewStub(channel)),
      lease(etcdserverpb::Lease::NewStub(channel)),
      maintenance(etcdserverpb::Maintenance::NewStub(channel)),
      cluster(etcdserverpb::Cluster::NewStub(channel)),
      auth(etcdserverpb::Auth::NewStub(channel)),
      lock(v3lockpb::Lock::NewStub(channel)),
      election(v3electionpb::Election::NewStub(channel)) {}

std::unique_ptr<ServerProcess> DiffTest::etcd_;
std::unique_ptr<ServerProcess> DiffTest::capstan_;
std::unique_ptr<ServerStubs> DiffTest::etcd_stubs_;
std::unique_ptr<ServerStubs> DiffTest::capstan_stubs_;
std::string DiffTest::skip_reason_;
std::string DiffTest::error_;
int DiffTest::sequence_ = 0;
bool DiffTest::resync_failed_ = false;
bool DiffTest::resynced_ = false;

bool DiffTest::BothEtcd() {
  const char* v = std::getenv("CAPSTAN_DIFF_BOTH_ETCD");
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

bool DiffTest::Verbose() {
  const char* v = std::getenv("CAPSTAN_DIFF_VERBOSE");
  return v != nullptr && *v != '\0' && std::string_view(v) != "0";
}

void DiffTest::LogAnswer(const pb::Message& req, const grpc::Status& status,
                         const pb::Message& resp) {
  std::fprintf(stderr, "--- %s\n%s--> etcd: %s\n%s", req.GetDescriptor()->name().c_str(),
               Describe(req, 1024).c_str(), Describe(status).c_str(),
               status.ok() ? Describe(resp, 2048).c_str() : "");
}

void DiffTest::SetUpTestSuite() {
  skip_reason_.clear();
  error_.clear();
  resync_failed_ = false;
  resynced_ = false;
  skip_reason_ = MissingReference("real etcd", EtcdBinary());
  if (!skip_reason_.empty()) {
    absl::StrAppend(&skip_reason_, " (install etcd-server or set CAPSTAN_ETCD_BINARY)");
    return;
  }
  // Both servers get the same member name, so that names compare equal,
  // and the cheapest bcrypt cost, so that auth cases hash passwords fast.
  ServerOptions eo = ServerOptions::Etcd();
  eo.name = "diff";
  eo.extra_args = {"--bcrypt-cost=4"};
  ServerOptions co = BothEtcd() ? ServerOptions::Etcd() : ServerOptions::Capstan();
  co.name = "diff";
  co.extra_args = eo.extra_args;
  if (!BothEtcd() && !IsExecutable(CapstanBinary())) {
    error_ = absl::StrCat("capstan binary not found: '", CapstanBinary(),
                          "' (build the `capstan` target or set CAPSTAN_BINARY)");
    return;
  }
  auto e = ServerProcess::Start(eo);
  if (!e.ok()) {
    error_ = absl::StrCat("starting etcd: ", e.status().ToString());
    return;
  }
  auto c = ServerProcess::Start(co);
  if (!c.ok()) {
    error_ = absl::StrCat("starting ", BothEtcd() ? "etcd (as capstan)" : "capstan", ": ",
                          c.status().ToString());
    return;
  }
  etcd_ = std::move(*e);
  capstan_ = std::move(*c);
  etcd_stubs_ = std::make_unique<ServerStubs>(etcd_->NewChannel());
  capstan_stubs_ = std::make_unique<ServerStubs>(capstan_->NewChannel());
  // kResyncKey exists on both servers from the start, so that a resync (puts
  // to it on one server) changes no key count, only that key's versions.
  for (ServerStubs* s : {etcd_stubs_.get(), capstan_stubs_.get()}) {
    etcdserverpb::PutRequest put;
    put.set_key(std::string(kResyncKey));
    put.set_value("resync");
    etcdserverpb::PutResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
    grpc::Status st = s->kv->Put(&ctx, put, &resp);
    if (!st.ok()) {
      error_ = absl::StrCat("initial put of ", std::string(kResyncKey), " on ",
                            s == etcd_stubs_.get() ? "etcd" : "capstan", ": ", Describe(st));
      return;
    }
  }
}

namespace {

// How a server ends on SIGTERM when it shuts down cleanly: etcd re-raises
// SIGTERM after its shutdown, capstan exits with 0.
bool EndedCleanly(const ExitInfo& ex) {
  return (ex.exited && ex.exit_code == 0) || (!ex.exited && ex.term_signal == SIGTERM);
}

}  // namespace

void DiffTest::TearDownTestSuite() {
  etcd_stubs_.reset();
  capstan_stubs_.reset();
  for (auto* s : {&etcd_, &capstan_}) {
    if (*s == nullptr) continue;
    if ((*s)->running()) {
      ExitInfo ex = (*s)->Stop();
      if (!EndedCleanly(ex)) {
        std::fprintf(stderr, "capstan-test: %s ended with %s on SIGTERM; log tail:\n%s\n",
                     FlavorName((*s)->flavor()), ex.ToString().c_str(),
                     (*s)->ReadLog(2000).c_str());
      }
    }
    s->reset();
  }
}

void DiffTest::SetUp() {
  if (!skip_reason_.empty()) CAPSTAN_REFERENCE_MISSING(skip_reason_);
  ASSERT_TRUE(error_.empty()) << error_;
  ASSERT_TRUE(etcd_ != nullptr && capstan_ != nullptr);
  ASSERT_TRUE(etcd_->running()) << "etcd is gone; log tail:\n" << etcd_->ReadLog(4000);
  ASSERT_TRUE(capstan_->running()) << "capstan is gone (" << capstan_->options().binary
                                   << "); log tail:\n"
                                   << capstan_->ReadLog(4000);
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  prefix_ = absl::StrFormat("/diff/%04d-%s.%s/", ++sequence_, info->test_suite_name(),
                            info->name());
}

void DiffTest::TearDown() {
  if (!skip_reason_.empty() || !error_.empty() || etcd_ == nullptr || capstan_ == nullptr) return;
  if (!etcd_->running() || !capstan_->running()) {
    ADD_FAILURE() << "a server died during this test:\n  etcd: "
                  << (etcd_->running() ? "running" : "gone") << "\n  capstan: "
                  << (capstan_->running() ? "running" : "gone") << "\ncapstan log tail:\n"
                  << capstan_->ReadLog(4000);
    return;
  }
  RangeRequest r;
  r.set_key(std::string(kResyncKey));
  r.set_count_only(true);
  auto p = Both(r);
  if (!p.etcd.status.ok() || !p.capstan.status.ok()) {
    ADD_FAILURE() << "revision check after the test failed: etcd " << Describe(p.etcd.status)
                  << ", capstan " << Describe(p.capstan.status);
    return;
  }
  const int64_t er = p.etcd.resp.header().revision();
  const int64_t cr = p.capstan.resp.header().revision();
  if (er != cr) {
    if (resync_failed_) {
      ADD_FAILURE() << "servers' revisions differ after this test: etcd " << er << ", capstan "
                    << cr << " (an earlier resync failed; revisions in later cases differ too)";
      return;
    }
    ADD_FAILURE() << "servers' revisions diverged during this test: etcd " << er << ", capstan "
                  << cr << "; bringing the lagging server level with writes to " << kResyncKey;
    Resync(er, cr);
  }
}

void DiffTest::Resync(int64_t etcd_rev, int64_t capstan_rev) {
  resynced_ = true;
  ServerStubs& lagging = etcd_rev < capstan_rev ? etcd_stubs() : capstan_stubs();
  int64_t gap = std::abs(etcd_rev - capstan_rev);
  for (int64_t i = 0; i < gap && i < 100000; ++i) {
    etcdserverpb::PutRequest put;
    put.set_key(std::string(kResyncKey));
    put.set_value("resync");
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
    etcdserverpb::PutResponse resp;
    grpc::Status s = lagging.kv->Put(&ctx, put, &resp);
    if (!s.ok()) {
      std::fprintf(stderr, "capstan-test: resync put failed: %s\n", Describe(s).c_str());
      resync_failed_ = true;
      return;
    }
    if (resp.header().revision() >= std::max(etcd_rev, capstan_rev)) return;
  }
}

int64_t DiffTest::PutBoth(const std::string& key, const std::string& value, int64_t lease) {
  etcdserverpb::PutRequest r;
  r.set_key(key);
  r.set_value(value);
  r.set_lease(lease);
  auto p = Both(r);
  EXPECT_TRUE(p.etcd.status.ok()) << "etcd Put " << key << ": " << Describe(p.etcd.status);
  EXPECT_SAME(p);
  return p.etcd.resp.header().revision();
}

void DiffTest::DeleteBoth(const std::string& key, const std::string& range_end) {
  etcdserverpb::DeleteRangeRequest r;
  r.set_key(key);
  r.set_range_end(range_end);
  auto p = Both(r);
  EXPECT_TRUE(p.etcd.status.ok()) << "etcd DeleteRange " << key << ": " << Describe(p.etcd.status);
  EXPECT_SAME(p);
}

int64_t DiffTest::GrantBoth(int64_t ttl, int64_t id) {
  etcdserverpb::LeaseGrantRequest r;
  r.set_ttl(ttl);
  r.set_id(id);
  AnswerPair<etcdserverpb::LeaseGrantResponse> p;
  p.etcd = CallUnary(etcd_stubs().lease.get(), &etcdserverpb::Lease::Stub::LeaseGrant, r);
  EXPECT_TRUE(p.etcd.status.ok()) << "etcd LeaseGrant: " << Describe(p.etcd.status);
  // Capstan gets the ID etcd chose, so that later requests name one lease.
  r.set_id(p.etcd.resp.id());
  p.capstan = CallUnary(capstan_stubs().lease.get(), &etcdserverpb::Lease::Stub::LeaseGrant, r);
  EXPECT_SAME(p);
  return p.etcd.resp.id();
}

int64_t DiffTest::Revision() {
  RangeRequest r;
  r.set_key(std::string(kResyncKey));
  r.set_count_only(true);
  auto p = Both(r);
  EXPECT_TRUE(p.etcd.status.ok() && p.capstan.status.ok())
      << "etcd " << Describe(p.etcd.status) << ", capstan " << Describe(p.capstan.status);
  EXPECT_EQ(p.etcd.resp.header().revision(), p.capstan.resp.header().revision())
      << "servers' revisions differ";
  return p.etcd.resp.header().revision();
}

absl::Status DiffTest::RestartBoth(bool crash) {
  if (Verbose()) std::fprintf(stderr, "--- restart (%s)\n", crash ? "SIGKILL" : "SIGTERM");
  struct Side {
    const char* name;
    ServerProcess* server;
    ServerStubs* stubs;
  };
  const Side sides[] = {{"etcd", etcd_.get(), etcd_stubs_.get()},
                        {"capstan", capstan_.get(), capstan_stubs_.get()}};
  for (const Side& side : sides) {
    const ExitInfo ex = crash ? side.server->Kill() : side.server->Stop();
    if (!crash && !EndedCleanly(ex)) {
      return absl::InternalError(absl::StrCat(side.name, " ended with ", ex.ToString(),
                                              " on SIGTERM; log tail:\n",
                                              side.server->ReadLog(4000)));
    }
  }
  for (const Side& side : sides) {
    if (absl::Status s = side.server->Restart(); !s.ok()) return s;
  }
  const auto deadline = std::chrono::system_clock::now() + kRpcDeadline;
  for (const Side& side : sides) {
    if (!side.stubs->channel->WaitForConnected(deadline)) {
      return absl::UnavailableError(absl::StrCat("the fixture's channel to ", side.name,
                                                 " did not reconnect after the restart"));
    }
  }
  return absl::OkStatus();
}

EtcdctlResult DiffTest::RunEtcdctl(const ServerProcess& server,
                                   const std::vector<std::string>& args,
                                   const std::string& stdin_data, bool json) {
  EtcdctlResult r;
  r.argv = {EtcdctlBinary(), "--endpoints=" + server.endpoint()};
  r.argv.insert(r.argv.end(), args.begin(), args.end());
  if (json) {
    r.argv.push_back("-w");
    r.argv.push_back("json");
  }
  r.raw = RunCommand(r.argv, stdin_data, std::chrono::seconds(60));
  r.out = NormalizePorts(r.raw.out, server);
  r.err = NormalizePorts(DropLogLines(r.raw.err), server);
  r.is_json = ParseJson(r.raw.out, &r.json);
  if (r.is_json) NormalizeJson(&r.json, server, false);
  return r;
}

EtcdctlPair DiffTest::Etcdctl(const std::vector<std::string>& args, const std::string& stdin_data,
                              bool json) {
  EtcdctlPair p;
  p.etcd = RunEtcdctl(etcd(), args, stdin_data, json);
  p.capstan = RunEtcdctl(capstan(), args, stdin_data, json);
  return p;
}

}  // namespace capstan::testing
