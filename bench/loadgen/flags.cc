#include "bench/loadgen/flags.h"

#include <cerrno>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace capstan::bench {

namespace {

std::string DefaultText(const auto& target) {
  using T = std::decay_t<decltype(*target)>;
  if constexpr (std::is_same_v<T, bool>) {
    return *target ? "true" : "false";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return absl::StrCat("\"", *target, "\"");
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return absl::StrJoin(*target, ",");
  } else if constexpr (std::is_same_v<T, absl::Duration>) {
    return absl::FormatDuration(*target);
  } else {
    return absl::StrCat(*target);
  }
}

}  // namespace

void FlagSet::Add(const std::string& name, Target target, const std::string& help) {
  Flag f{target, help, std::visit([](auto* t) { return DefaultText(t); }, target)};
  flags_[name] = std::move(f);
}

void FlagSet::Int(const std::string& name, int* v, const std::string& help) { Add(name, v, help); }
void FlagSet::Int64(const std::string& name, int64_t* v, const std::string& help) {
  Add(name, v, help);
}
void FlagSet::Double(const std::string& name, double* v, const std::string& help) {
  Add(name, v, help);
}
void FlagSet::Bool(const std::string& name, bool* v, const std::string& help) {
  Add(name, v, help);
}
void FlagSet::String(const std::string& name, std::string* v, const std::string& help) {
  Add(name, v, help);
}
void FlagSet::StringList(const std::string& name, std::vector<std::string>* v,
                         const std::string& help) {
  Add(name, v, help);
}
void FlagSet::Duration(const std::string& name, absl::Duration* v, const std::string& help) {
  Add(name, v, help);
}

absl::Status FlagSet::Assign(const std::string& name, Flag& flag, const std::string& value) {
  auto bad = [&](const char* what) {
    return absl::InvalidArgumentError(
        absl::StrFormat("invalid argument \"%s\" for \"--%s\" flag: %s", value, name, what));
  };
  set_.insert(name);
  return std::visit(
      [&](auto* t) -> absl::Status {
        using T = std::decay_t<decltype(*t)>;
        if constexpr (std::is_same_v<T, int>) {
          if (!absl::SimpleAtoi(value, t)) return bad("not an integer");
        } else if constexpr (std::is_same_v<T, int64_t>) {
          if (!absl::SimpleAtoi(value, t)) return bad("not an integer");
        } else if constexpr (std::is_same_v<T, double>) {
          if (!absl::SimpleAtod(value, t)) return bad("not a number");
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!absl::SimpleAtob(value, t)) return bad("not a boolean");
        } else if constexpr (std::is_same_v<T, std::string>) {
          *t = value;
        } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          *t = absl::StrSplit(value, ',', absl::SkipEmpty());
        } else if constexpr (std::is_same_v<T, absl::Duration>) {
          double secs;
          if (absl::SimpleAtod(value, &secs)) {
            *t = absl::Seconds(secs);
          } else if (!absl::ParseDuration(value, t)) {
            return bad("not a duration (e.g. 30s, 2m, 500ms)");
          }
        }
        return absl::OkStatus();
      },
      flag.target);
}

absl::Status FlagSet::Parse(const std::vector<std::string>& args,
                            std::vector<std::string>* positional, bool stop_at_positional) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      positional->insert(positional->end(), args.begin() + i + 1, args.end());
      break;
    }
    if (a.size() < 2 || a[0] != '-' || a == "-") {
      if (stop_at_positional) {
        positional->insert(positional->end(), args.begin() + i, args.end());
        break;
      }
      positional->push_back(a);
      continue;
    }
    std::string body = a.substr(a[1] == '-' ? 2 : 1);
    std::string name = body, value;
    bool has_value = false;
    if (auto eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    auto it = flags_.find(name);
    if (it == flags_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag: --", name));
    }
    if (!has_value) {
      if (std::holds_alternative<bool*>(it->second.target)) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("flag needs an argument: --", name));
      }
    }
    if (auto s = Assign(name, it->second, value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string FlagSet::Usage() const {
  std::string out;
  for (const auto& [name, f] : flags_) {
    absl::StrAppendFormat(&out, "      --%-24s %s (default %s)\n", name, f.help, f.default_text);
  }
  return out;
}

}  // namespace capstan::bench
