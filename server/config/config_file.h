// etcd's --config-file: a YAML file whose keys are etcd's flag names
// (`name:`, `data-dir:`, `listen-client-urls:`, `quota-backend-bytes:`, ...)
// with TLS settings nested under `client-transport-security:` and
// `peer-transport-security:`.
//
// The file is read with a parser for the subset of YAML that etcd
// configuration files use (the dependencies of this project are fixed, and
// this subset is small): `key: value` mappings, plain, 'single' and "double"
// quoted scalars, `# comments`, empty values (null), one level of nested
// mapping, and lists either in flow form `[a, b]` or as `- item` lines.
// Anchors, tags, multi-line and block scalars are refused with the line.
//
// Thread safety: pure functions.

#ifndef CAPSTAN_SERVER_CONFIG_CONFIG_FILE_H_
#define CAPSTAN_SERVER_CONFIG_CONFIG_FILE_H_

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace capstan::server {

// One value of the subset.
struct YamlNode {
  // Declared here and defined in the .cc, where YamlNode is complete: a
  // member pair holding YamlNode itself must not have its traits worked out
  // while the class is still being defined (clang refuses that).
  YamlNode();
  ~YamlNode();
  YamlNode(const YamlNode&);
  YamlNode(YamlNode&&) noexcept;
  YamlNode& operator=(const YamlNode&);
  YamlNode& operator=(YamlNode&&) noexcept;

  enum class Kind { kNull, kScalar, kList, kMap };
  Kind kind = Kind::kNull;
  std::string scalar;  // kScalar: the text, quotes removed and escapes applied
  bool quoted = false;  // kScalar: it was written in quotes (always a string)
  std::vector<std::string> list;                           // kList
  std::vector<std::pair<std::string, YamlNode>> entries;  // kMap, in file order
  int line = 0;  // 1-based line of the key
};

// Parses a document whose top level is a mapping. Errors read
// "yaml: line N: <what>", as the YAML library of etcd prefixes them.
absl::StatusOr<YamlNode> ParseYamlSubset(std::string_view text);

// A configuration file turned into (flag name, flag text) pairs, in file
// order, as the flag parser takes them: nested security settings become
// their flags (client-transport-security.cert-file -> cert-file,
// peer-transport-security.cert-file -> peer-cert-file), lists are joined
// with ',', YAML 1.1 booleans (yes/no/on/off) become true/false, and an
// integer for a duration key is read as nanoseconds, as Go's
// encoding/json reads a time.Duration. Keys with a null value are left
// out (they leave the default, as in etcd). Unknown keys are returned too:
// the caller ignores those that name no flag, as etcd ignores them.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ConfigFileSettings(
    std::string_view text);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_CONFIG_CONFIG_FILE_H_
