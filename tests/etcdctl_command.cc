#include "etcdctl_command.h"

#include "absl/strings/str_split.h"

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

}  // namespace capstan::testing
