// The flag table: every flag etcd 3.5 accepts (and Capstan's own), each with
// how its text is read into ServerConfig, its --help section, default and
// text, and whether it has any effect in a single-member Capstan.
//
// The table is read by the command line (command_line.h), the environment
// (ETCD_* variables, also command_line.h), the config file (config.cc) and
// --help (usage.cc). Its order is the order of --help within a section and
// of ServerConfig::ignored_flags.
//
// Internal to server/config. Thread safety: the table is built once and
// read-only after; everything here may be called from any thread.

#ifndef CAPSTAN_SERVER_CONFIG_FLAGS_H_
#define CAPSTAN_SERVER_CONFIG_FLAGS_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/config/config.h"

namespace capstan::server::config_internal {

// The configuration while it is read: a few flags are held as text until
// validation, as etcd does.
struct ParseState {
  ServerConfig cfg;
  std::string auto_compaction_mode = "periodic";
  std::string log_level = "info";
  std::string initial_cluster_state = "new";
  // The experimental bool flags etcd 3.6 maps to feature gates
  // (--experimental-initial-corrupt-check, ...), by flag name, when set.
  std::map<std::string, bool> gate_flags;
  // The last --feature-gates text (etcd 3.6 looks for gate names in it).
  std::string feature_gates_text;
  // --warning-unary-request-duration and its experimental name; zero unless
  // set (etcd 3.6's parseWarningUnaryRequestDuration decides from both).
  absl::Duration warning_unary_request_duration = absl::ZeroDuration();
  absl::Duration experimental_warning_unary_request_duration = absl::ZeroDuration();
};

// Sets a flag from its text. On failure returns the bare reason ("parse
// error", "invalid value", ...) that the caller wraps in etcd's sentence.
using Setter = std::function<absl::Status(ParseState&, absl::string_view)>;

// How a flag's text is read (flag_values.h makes them).
struct Value {
  Setter set;
  // A bool flag: "--flag" alone means true, and it never takes the next
  // argument as its value (Go's boolFlag).
  bool is_bool = false;
};

// The --help section a flag is listed under.
enum class Section {
  kMember,
  kClustering,
  kSecurity,
  kAuth,
  kProfiling,
  kLogging,
  kTracing,
  kProxy,
  kExperimental,
  kUnsafe,
  kCapstan,
  kHidden,  // version, config-file, etcd's ignored legacy flags
};

struct FlagSpec {
  absl::string_view name;
  Section section;
  Value value;
  absl::string_view default_text;  // as --help shows it, quotes included
  absl::string_view help;          // may hold several lines, "\n"-separated
  bool no_effect = false;          // accepted but meaningless for one member
};

// Every flag, in table order. The returned table lives for the process.
const std::vector<FlagSpec>& Flags();

// The flag named name (without dashes), or null. The result lives for the
// process.
const FlagSpec* LookupFlag(absl::string_view name);

// pkg/flags.FlagToEnv("ETCD", name): "data-dir" -> "ETCD_DATA_DIR".
std::string FlagToEnv(absl::string_view name);

}  // namespace capstan::server::config_internal

#endif  // CAPSTAN_SERVER_CONFIG_FLAGS_H_
