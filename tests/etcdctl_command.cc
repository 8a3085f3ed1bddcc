#include "etcdctl_command.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace capstan::testing {

CommandResult EtcdctlCommand(const ServerProcess& server, const std::vector<std::string>& args,
                             const std::string& stdin_data) {
  std::vector<std::string> argv = {EtcdctlBinary(), "--endpoints", server.endpoint()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, stdin_data);
}

CommandResult EtcdctlCommand(const ServerProcess& server, std::string_view args,
                             const std::string& stdin_data) {
  std::vector<std::string> words;
  for (absl::string_view w :
       absl::StrSplit(absl::string_view(args.data(), args.size()), ' ', absl::SkipEmpty())) {
    words.push_back(w == "''" ? std::string() : std::string(w));
  }
  return EtcdctlCommand(server, words, stdin_data);
}

absl::Status EtcdctlServer::Start(ServerOptions options) {
  auto server = ServerProcess::Start(std::move(options));
  if (!server.ok()) return server.status();
  server_ = *std::move(server);
  return absl::OkStatus();
}

void EtcdctlServer::Stop() {
  if (server_ && server_->running()) server_->Stop();
}

std::string EtcdctlServer::Ctl(const std::string& args, const std::string& input, int* rc) {
  CommandResult r = EtcdctlCommand(*server_, args, input);
  const int code = r.exit.exited ? r.exit.exit_code : -1;
  if (rc != nullptr) {
    *rc = code;
  } else {
    EXPECT_EQ(code, 0) << "etcdctl " << args.substr(0, 200) << ": " << r.err;
  }
  return r.out;
}

etcdserverpb::RangeResponse EtcdctlServer::GetAll(int64_t rev) {
  etcdserverpb::RangeResponse r;
  EXPECT_TRUE(r.ParseFromString(
      Ctl(absl::StrCat("get '' --prefix -w protobuf", rev > 0 ? absl::StrCat(" --rev=", rev) : ""))));
  return r;
}

int64_t EtcdctlServer::Grant(int ttl) {
  // "lease 694d77aa9e8bd00b granted with TTL(60s)"
  const std::string out = Ctl(absl::StrCat("lease grant ", ttl));
  return static_cast<int64_t>(std::stoull(out.substr(6, out.find(' ', 6) - 6), nullptr, 16));
}

}  // namespace capstan::testing
