// Logs as etcd 3.5 writes them: one JSON object per line with "level",
// "ts" and "msg" first, in that order; --log-level filters; --log-outputs
// names the file, written line by line while the server runs.

#include <chrono>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "diff_fixture.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "process_fixture.h"

namespace capstan::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct LogLine {
  std::string level, ts, caller, msg;
};

// Parses every line; each must be a JSON object whose first keys are
// level, ts, caller and msg (etcd's zap order), with etcd's level names, an
// RFC 3339 UTC timestamp and a caller "dir/file.cc:line" relative to the
// checkout.
std::vector<LogLine> ParseLog(const std::string& text) {
  static const std::regex kTs(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z)");
  static const std::regex kCaller(R"((?:[a-z_]+/)+[a-z_0-9]+\.(cc|h):[1-9]\d*)");
  static const std::set<std::string> kLevels = {"debug", "info",  "warn",
                                                "error", "panic", "fatal"};
  std::vector<LogLine> lines;
  for (absl::string_view raw : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    const std::string line(raw);
    google::protobuf::Value json;
    if (!ParseJson(line, &json) || !json.has_struct_value()) {
      ADD_FAILURE() << "not a JSON object: " << line;
      continue;
    }
    const auto& f = json.struct_value().fields();
    if (!f.count("level") || !f.count("ts") || !f.count("caller") || !f.count("msg")) {
      ADD_FAILURE() << "level, ts, caller or msg missing: " << line;
      continue;
    }
    LogLine l{f.at("level").string_value(), f.at("ts").string_value(),
              f.at("caller").string_value(), f.at("msg").string_value()};
    EXPECT_TRUE(kLevels.count(l.level)) << line;
    EXPECT_TRUE(std::regex_match(l.ts, kTs)) << line;
    EXPECT_TRUE(std::regex_match(l.caller, kCaller)) << line;
    EXPECT_EQ(line.rfind("{\"level\":", 0), 0u) << line;
    EXPECT_LT(line.find("\"ts\":"), line.find("\"caller\":")) << line;
    EXPECT_LT(line.find("\"caller\":"), line.find("\"msg\":")) << line;
    lines.push_back(std::move(l));
  }
  return lines;
}

bool HasLine(const std::vector<LogLine>& lines, const std::string& level,
             const std::string& msg_prefix) {
  for (const auto& l : lines) {
    if (l.level == level && l.msg.rfind(msg_prefix, 0) == 0) return true;
  }
  return false;
}

// Starts capstan at `level` logging to a file and makes it log at every
// level it has: start-up at info, a healthy /health at debug, an unhealthy
// one (a NOSPACE alarm raised through the Alarm RPC) at warn. Returns the
// file's lines once the warn line is in the file, while the server still
// runs (lines are written as they come), and the server's stderr.
std::vector<LogLine> RunAtLevel(const std::string& level, std::string* stderr_log) {
  TempDir dir("capstan-logs");
  const std::string file = dir.path() + "/capstan.log";
  ServerOptions options = ServerOptions::Capstan();
  options.extra_args = {"--log-level", level, "--log-outputs", file};
  auto server = ServerProcess::Start(options);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return {};

  httplib::Client http("127.0.0.1", (*server)->metrics_port());
  auto healthy = http.Get("/health");
  EXPECT_TRUE(healthy && healthy->status == 200);
  ServerStubs s((*server)->NewChannel());
  etcdserverpb::AlarmRequest raise;
  raise.set_action(etcdserverpb::AlarmRequest::ACTIVATE);
  raise.set_memberid(1);
  raise.set_alarm(etcdserverpb::NOSPACE);
  etcdserverpb::AlarmResponse raised;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
  EXPECT_TRUE(s.maintenance->Alarm(&ctx, raise, &raised).ok());
  auto unhealthy = http.Get("/health");
  EXPECT_TRUE(unhealthy && unhealthy->status == 503);

  // The warn line is the last one the requests log; the ready line comes
  // from a thread of its own once the member's publish is applied, which
  // may be after it. Wait for both (bounded); the ready line is info.
  const bool ready_logged = level == "debug" || level == "info";
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    text = ReadFile(file);
    if ((text.find("/health error") != std::string::npos &&
         (!ready_logged || text.find("ready to serve client requests") != std::string::npos)) ||
        std::chrono::steady_clock::now() > deadline) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Whole lines only: the file ends with a newline.
  EXPECT_TRUE(!text.empty() && text.back() == '\n') << text;
  *stderr_log = (*server)->ReadLog();
  return ParseLog(text);
}

TEST(LogTest, DebugLevelWritesEveryLevelAsJsonToTheFile) {
  std::string err;
  const std::vector<LogLine> lines = RunAtLevel("debug", &err);
  EXPECT_TRUE(HasLine(lines, "info", "ready to serve client requests"));
  EXPECT_TRUE(HasLine(lines, "debug", "/health OK"));
  EXPECT_TRUE(HasLine(lines, "warn", "serving /health false due to an alarm"));
  EXPECT_TRUE(HasLine(lines, "warn", "/health error"));
  // The file is the only output: nothing of it goes to stderr.
  EXPECT_EQ(err.find("\"level\":"), std::string::npos) << err;
}

TEST(LogTest, WarnLevelHidesInfoAndDebug) {
  std::string err;
  const std::vector<LogLine> lines = RunAtLevel("warn", &err);
  EXPECT_TRUE(HasLine(lines, "warn", "serving /health false due to an alarm"));
  for (const auto& l : lines) {
    EXPECT_TRUE(l.level == "warn" || l.level == "error" || l.level == "fatal")
        << l.level << ": " << l.msg;
  }
  EXPECT_FALSE(HasLine(lines, "info", "ready to serve client requests"));
}

}  // namespace
}  // namespace capstan::testing
