// etcd's --config-file (server/config_file): any text parses or is refused
// with an error naming its line, without crashing; a parsed document is a
// mapping whose keys carry lines inside the text; settings are derived only
// from a document that parses.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/config/config_file.h"

namespace {

void CheckLines(const capstan::server::YamlNode& node, int max_line) {
  for (const auto& [key, child] : node.entries) {
    if (child.line < 1 || child.line > max_line) std::abort();
    CheckLines(child, max_line);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const int lines = 1 + static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  auto doc = capstan::server::ParseYamlSubset(text);
  if (doc.ok()) {
    if (doc->kind != capstan::server::YamlNode::Kind::kMap &&
        doc->kind != capstan::server::YamlNode::Kind::kNull) {
      std::abort();
    }
    CheckLines(*doc, lines);
  } else if (doc.status().message().substr(0, 11) != "yaml: line ") {
    std::abort();
  }
  // Settings come from the same parse: they exist exactly when it
  // succeeded (keys that name no flag, even an empty one, are returned for
  // the caller to ignore, as etcd ignores them).
  auto settings = capstan::server::ConfigFileSettings(text);
  if (settings.ok() && !doc.ok()) std::abort();
  return 0;
}
