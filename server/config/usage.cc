// --help and the short usage Go's flag package prints after a syntax error
// (UsageText() and ShortUsageText(), declared in config.h), from the flag
// table in flags.cc.

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "server/config/config.h"
#include "server/config/flags.h"

namespace capstan::server {

using config_internal::Flags;
using config_internal::FlagSpec;
using config_internal::Section;

std::string ShortUsageText() {
  return "Usage:\n"
         "\n"
         "  capstan [flags]\n"
         "    Start a Capstan server: a single-member key-value store that speaks etcd's v3 API\n"
         "    and takes etcd 3.5's and 3.6's flags and ETCD_* environment variables.\n"
         "\n"
         "  capstan --version\n"
         "    Show the version of Capstan.\n"
         "\n"
         "  capstan -h | --help\n"
         "    Show the help information about Capstan.\n"
         "\n"
         "  capstan --config-file\n"
         "    Path to an etcd server configuration file (YAML, keys named as the flags;\n"
         "    TLS under client-transport-security / peer-transport-security). When given,\n"
         "    other command line flags and environment variables are ignored, as in etcd.\n"
         "\n"
         "  Every flag can also be set by the environment variable ETCD_<FLAG_NAME>, e.g.\n"
         "  ETCD_DATA_DIR for --data-dir. A flag given on the command line and in the\n"
         "  environment is an error, as in etcd.\n";
}

std::string UsageText() {
  struct Heading {
    Section section;
    absl::string_view title;
  };
  static constexpr Heading kHeadings[] = {
      {Section::kMember, "Member"},
      {Section::kClustering, "Clustering"},
      {Section::kSecurity, "Security"},
      {Section::kAuth, "Auth"},
      {Section::kProfiling, "Profiling and Monitoring"},
      {Section::kLogging, "Logging"},
      {Section::kTracing, "Experimental distributed tracing"},
      {Section::kProxy, "v2 Proxy (not supported by Capstan)"},
      {Section::kExperimental, "Experimental feature"},
      {Section::kUnsafe, "Unsafe feature"},
      {Section::kCapstan, "Capstan"},
  };
  std::string out = ShortUsageText();
  for (const Heading& h : kHeadings) {
    absl::StrAppend(&out, "\n", h.title, ":\n");
    for (const FlagSpec& f : Flags()) {
      if (f.section != h.section) continue;
      absl::StrAppend(&out, "  --", f.name, " ", f.default_text, "\n");
      for (absl::string_view line : absl::StrSplit(f.help, '\n')) {
        absl::StrAppend(&out, "    ", line, "\n");
      }
    }
    if (h.section == Section::kUnsafe) {
      out +=
          "\nCAUTIOUS with unsafe flag! It may break the guarantees given by the consensus "
          "protocol!\n";
    }
  }
  out +=
      "\nFlags marked \"No effect\" are accepted so that etcd command lines keep working; the\n"
      "server logs them as \"accepted; it has no effect in Capstan\".\n";
  return out;
}

}  // namespace capstan::server
