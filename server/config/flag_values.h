// How each kind of flag reads its text, with the syntax and error reasons of
// Go's flag package and of etcd's pkg/flags value types. Each function
// returns the Value of one table entry (flags.h); a field pointer names the
// ServerConfig (or ParseState) field it sets.
//
// Internal to server/config. Thread safety: the Values are immutable and
// may be used from any thread, each on its own ParseState.

#ifndef CAPSTAN_SERVER_CONFIG_FLAG_VALUES_H_
#define CAPSTAN_SERVER_CONFIG_FLAG_VALUES_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/config/config.h"
#include "server/config/flags.h"

namespace capstan::server::config_internal {

// Go's flag.String, into a ServerConfig field or a ParseState one.
Value Str(std::string ServerConfig::*field);
Value StrIn(std::string ParseState::*field);
// Go's flag.Bool: strconv.ParseBool's spellings.
Value Bool(bool ServerConfig::*field);
// Go's flag.Uint / flag.Uint64 and flag.Int / flag.Int64 (64-bit; "0x10",
// "1_000"); errors "parse error" and "value out of range".
Value Uint(uint64_t ServerConfig::*field);
Value Int(int64_t ServerConfig::*field);
// etcd's flags.uint32Value, which reports strconv's own error text.
Value Uint32(uint32_t ServerConfig::*field);
// Go's flag.Duration ("100ms", "1h2m").
Value Dur(absl::Duration ServerConfig::*field);
Value DurIn(absl::Duration ParseState::*field);
// An experimental bool flag that etcd 3.6 maps to a feature gate: the value
// is kept in ParseState::gate_flags under the flag's name.
Value GateFlag(absl::string_view flag_name);
// --feature-gates: featuregate's Set into ServerConfig::feature_gates, which
// merges repeated flags; the error is featuregate's.
Value FeatureGatesValue();
// etcd's flags.UniqueURLs with the "" exception: an empty value leaves the
// list as it was (etcd keeps the default), any other value replaces it.
Value Urls(std::vector<Url> ServerConfig::*field);
// etcd's flags.UniqueStringsValue: split on ",", sorted, de-duplicated.
Value UniqueStrings(std::set<std::string> ServerConfig::*field);
// etcd's flags.SelectiveStringValue: one of valid, else "invalid value".
Value Choice(std::string ServerConfig::*field, std::vector<absl::string_view> valid);
Value ChoiceIn(std::string ParseState::*field, std::vector<absl::string_view> valid);
// Flags etcd still swallows for compatibility with etcd 0.4/2.x command
// lines (etcd's flags.IgnoredFlag: bool-like, any value).
Value Legacy();

// The flags whose value types are their own.
Value Cors();           // --cors: origins as URLs, or "*"
Value LogOutputs();     // --log-outputs: UniqueStringsValue into a sorted vector
Value CipherSuites();   // --cipher-suites: StringsValue, split on "," as given
Value V2Deprecation();  // --v2-deprecation: SelectiveStringsValue
Value Prefixes();       // --watch-cache-prefixes: in order, de-duplicated

}  // namespace capstan::server::config_internal

#endif  // CAPSTAN_SERVER_CONFIG_FLAG_VALUES_H_
