// Selector: Kubernetes label and field selectors over a CachedObject.
//
// Label selectors follow k8s.io/apimachinery/pkg/labels: comma-separated
// requirements `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`,
// `!k`. Field selectors follow pkg/fields: `f=v`, `f==v`, `f!=v`, where f is
// a field of the resource's ResourceSpec (others are refused with
// Kubernetes' "field label not supported" error). An unset field reads as
// "" (so `spec.nodeName=` selects unscheduled pods). Objects whose value
// could not be decoded match only the empty selector.
//
// Thread safety: immutable after Parse.

#ifndef CAPSTAN_WATCHCACHE_SELECTOR_H_
#define CAPSTAN_WATCHCACHE_SELECTOR_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "watchcache/cached_object.h"
#include "watchcache/index_extractor.h"

namespace capstan::watchcache {

struct LabelRequirement {
  enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kDoesNotExist };
  std::string key;
  Op op = Op::kExists;
  std::vector<std::string> values;  // sorted, unique; one for kEquals/kNotEquals

  bool Matches(const CachedObject& o) const;
};

struct FieldRequirement {
  int field = -1;     // index into the ResourceSpec's fields
  std::string name;
  bool equals = true;  // false: !=
  std::string value;

  bool Matches(const CachedObject& o) const { return (o.field(field) == value) == equals; }
};

class Selector {
 public:
  Selector() = default;  // selects everything

  // InvalidRequest (CacheError::kInvalidRequest) when either does not parse
  // or names a field the extractor does not know.
  static absl::StatusOr<Selector> Parse(std::string_view label_selector,
                                        std::string_view field_selector,
                                        const IndexExtractor& extractor);

  bool empty() const { return labels_.empty() && fields_.empty(); }
  bool Matches(const CachedObject& o) const;
  // Matches, for an object that may be null (absent): false.
  bool MatchesOrNull(const CachedObject* o) const { return o != nullptr && Matches(*o); }

  const std::vector<LabelRequirement>& labels() const { return labels_; }
  const std::vector<FieldRequirement>& fields() const { return fields_; }

  // The selector in canonical form (for logs and tests).
  std::string ToString() const;

 private:
  std::vector<LabelRequirement> labels_;
  std::vector<FieldRequirement> fields_;
};

// The label index value of label (key, value): "key=value".
std::string LabelIndexValue(std::string_view key, std::string_view value);

}  // namespace capstan::watchcache

#endif  // CAPSTAN_WATCHCACHE_SELECTOR_H_
