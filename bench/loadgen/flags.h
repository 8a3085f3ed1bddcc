// Command-line flags in the style of etcd's benchmark (cobra/pflag):
// `--name=value`, `--name value`, `-name value`; booleans as `--name` or
// `--name=false`; `--` ends the flags. Anything else is a positional argument.
//
// Not thread-safe; build and parse a FlagSet on one thread, before the run.

#ifndef CAPSTAN_BENCH_LOADGEN_FLAGS_H_
#define CAPSTAN_BENCH_LOADGEN_FLAGS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace capstan::bench {

class FlagSet {
 public:
  // The pointed-to variables hold the defaults and must outlive the FlagSet.
  // Registering a name twice replaces the first registration.
  void Int(const std::string& name, int* value, const std::string& help);
  void Int64(const std::string& name, int64_t* value, const std::string& help);
  void Double(const std::string& name, double* value, const std::string& help);
  void Bool(const std::string& name, bool* value, const std::string& help);
  void String(const std::string& name, std::string* value, const std::string& help);
  // Comma-separated list.
  void StringList(const std::string& name, std::vector<std::string>* value,
                  const std::string& help);
  // Go duration syntax ("30s", "1m30s", "500ms"); a bare number means seconds.
  void Duration(const std::string& name, absl::Duration* value, const std::string& help);

  // Parses args (without the program or subcommand name). Unknown flags and
  // bad values are errors naming the flag. With stop_at_positional, the first
  // positional argument and everything after it go to positional unparsed.
  absl::Status Parse(const std::vector<std::string>& args, std::vector<std::string>* positional,
                     bool stop_at_positional = false);

  bool WasSet(const std::string& name) const { return set_.count(name) > 0; }
  bool Has(const std::string& name) const { return flags_.count(name) > 0; }
  // One line per flag: name, default and help.
  std::string Usage() const;

 private:
  using Target = std::variant<int*, int64_t*, double*, bool*, std::string*,
                              std::vector<std::string>*, absl::Duration*>;
  struct Flag {
    Target target;
    std::string help;
    std::string default_text;
  };
  void Add(const std::string& name, Target target, const std::string& help);
  absl::Status Assign(const std::string& name, Flag& flag, const std::string& value);

  std::map<std::string, Flag> flags_;
  std::set<std::string> set_;
};

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_FLAGS_H_
