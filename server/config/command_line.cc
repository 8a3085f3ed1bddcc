#include "server/config/command_line.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/config/failure.h"
#include "server/config/flags.h"
#include "util/go_text.h"

namespace capstan::server::config_internal {
namespace {

using gotext::GoQuote;

// Sets flag, found as -name on the command line, from the value given with
// it ("-name=value") or, for a flag that is not a bool, from the next
// argument, args[*next], advancing *next past it.
absl::Status SetFromArgs(const FlagSpec& flag, const std::string& name, bool has_value,
                         std::string value, const std::vector<std::string>& args, size_t* next,
                         ParseState* st) {
  if (flag.value.is_bool) {
    if (has_value) {
      if (absl::Status s = flag.value.set(*st, value); !s.ok()) {
        return UsageError(absl::StrCat("invalid boolean value ", GoQuote(value), " for -", name,
                                       ": ", s.message()));
      }
    } else if (absl::Status s = flag.value.set(*st, "true"); !s.ok()) {
      return UsageError(absl::StrCat("invalid boolean flag ", name, ": ", s.message()));
    }
    return absl::OkStatus();
  }
  if (!has_value && *next < args.size()) {
    value = args[(*next)++];
    has_value = true;
  }
  if (!has_value) return UsageError(absl::StrCat("flag needs an argument: -", name));
  if (absl::Status s = flag.value.set(*st, value); !s.ok()) {
    return UsageError(
        absl::StrCat("invalid value ", GoQuote(value), " for flag -", name, ": ", s.message()));
  }
  return absl::OkStatus();
}

// ETCD_X -> flag name, for every flag.
std::map<std::string, std::string> EnvToFlag() {
  std::map<std::string, std::string> env_to_flag;
  for (const FlagSpec& f : Flags()) env_to_flag[FlagToEnv(f.name)] = std::string(f.name);
  return env_to_flag;
}

// Sets each flag not set on the command line from its variable, flags in
// name order, and adds the variables used to *used. Returns the error of the
// last value that does not parse; the flags before and after it are set.
absl::Status SetUnsetFlagsFromEnv(const std::map<std::string, std::string>& env, ParseState* st,
                                  std::set<std::string>* used) {
  std::set<std::string>& explicitly = st->cfg.explicitly_set;
  std::vector<absl::string_view> names;
  for (const FlagSpec& f : Flags()) names.push_back(f.name);
  std::sort(names.begin(), names.end());
  absl::Status env_error;
  for (absl::string_view name : names) {
    std::string key = FlagToEnv(name);
    if (explicitly.count(std::string(name)) != 0) continue;
    auto it = env.find(key);
    if (it == env.end() || it->second.empty()) continue;
    used->insert(key);
    if (key == "ETCD_VERSION") continue;  // refused by CheckOtherEnv
    if (absl::Status s = LookupFlag(name)->value.set(*st, it->second); !s.ok()) {
      env_error = VerifyError(
          absl::StrCat("invalid value ", GoQuote(it->second), " for ", key, ": ", s.message()));
      continue;
    }
    explicitly.insert(std::string(name));
    st->cfg.used_env_vars.push_back(absl::StrCat(key, "=", it->second));
  }
  return env_error;
}

// The variables SetUnsetFlagsFromEnv did not use: ETCD_VERSION is refused
// with a warning, one shadowed by its flag on the command line is fatal, and
// any other ETCD_* variable is warned about.
absl::Status CheckOtherEnv(const std::map<std::string, std::string>& env,
                           const std::set<std::string>& used, ParseState* st) {
  const std::map<std::string, std::string> env_to_flag = EnvToFlag();
  for (const auto& [key, value] : env) {
    if (key == "ETCD_VERSION" && !value.empty()) {
      st->cfg.warnings.push_back(
          absl::StrCat("cannot set special environment variable ETCD_VERSION=", value));
      continue;
    }
    if (used.count(key) != 0) continue;
    if (auto it = env_to_flag.find(key);
        it != env_to_flag.end() && st->cfg.explicitly_set.count(it->second) != 0) {
      return VerifyError(absl::StrCat(
          "conflicting environment variable ", GoQuote(key),
          " is shadowed by corresponding command-line flag (either unset environment variable "
          "or disable flag)"));
    }
    if (absl::StartsWith(key, "ETCD_")) {
      st->cfg.warnings.push_back(
          absl::StrCat("unrecognized environment variable ", key, "=", value));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseArgs(const std::vector<std::string>& args, ParseState* st) {
  size_t i = 0;
  while (i < args.size()) {
    const std::string& arg = args[i];
    if (arg.size() < 2 || arg[0] != '-') break;
    size_t minuses = 1;
    if (arg[1] == '-') {
      minuses = 2;
      if (arg.size() == 2) {  // "--" ends the flags
        ++i;
        break;
      }
    }
    std::string name = arg.substr(minuses);
    if (name.empty() || name[0] == '-' || name[0] == '=') {
      return UsageError(absl::StrCat("bad flag syntax: ", arg));
    }
    ++i;
    bool has_value = false;
    std::string value;
    if (size_t eq = name.find('=', 1); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    const FlagSpec* flag = LookupFlag(name);
    if (flag == nullptr) {
      if (name == "help" || name == "h") {
        st->cfg.help_requested = true;
        return absl::OkStatus();
      }
      return UsageError(absl::StrCat("flag provided but not defined: -", name));
    }
    if (absl::Status s = SetFromArgs(*flag, name, has_value, std::move(value), args, &i, st);
        !s.ok()) {
      return s;
    }
    st->cfg.explicitly_set.insert(std::string(flag->name));
  }
  if (i < args.size()) {
    return VerifyError(absl::StrCat("'", args[i], "' is not a valid flag"));
  }
  return absl::OkStatus();
}

absl::Status SetFlagsFromEnv(const std::map<std::string, std::string>& env, ParseState* st) {
  // The last bad value is the one reported, after the check for variables
  // shadowed by flags.
  std::set<std::string> used;
  absl::Status env_error = SetUnsetFlagsFromEnv(env, st, &used);
  if (absl::Status s = CheckOtherEnv(env, used, st); !s.ok()) return s;
  return env_error;
}

}  // namespace capstan::server::config_internal
