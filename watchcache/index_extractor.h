// IndexExtractor: the values selectors and indexes need, read from a stored
// Kubernetes object without a Kubernetes dependency.
//
// Two storage formats are understood:
//  - Kubernetes protobuf: the 4 bytes "k8s\0", then a runtime.Unknown
//    {typeMeta=1 {apiVersion=1, kind=2}, raw=2, contentEncoding=3,
//    contentType=4}; raw is the object (e.g. v1.Pod {metadata=1, spec=2,
//    status=3}). Fields are addressed by field-number path inside raw, e.g.
//    spec.nodeName is {2, 10} and metadata.labels (a map<string,string>,
//    entries {key=1, value=2}) is {1, 11}.
//  - JSON: fields are addressed by name path ("spec.nodeName").
// Anything else (e.g. values encrypted at rest, a non-empty contentEncoding)
// is "not decoded": the object is still cached, just without fields.
//
// Thread safety: an IndexExtractor is immutable after construction; Extract
// may run on any number of threads at once.

#ifndef CAPSTAN_WATCHCACHE_INDEX_EXTRACTOR_H_
#define CAPSTAN_WATCHCACHE_INDEX_EXTRACTOR_H_

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace capstan::watchcache {

// One field a resource's field selectors may name.
struct FieldSpec {
  std::string name;             // field selector name, e.g. "spec.nodeName"; also the JSON path
  std::vector<int> proto_path;  // field numbers inside the object (raw of the runtime.Unknown)
  bool indexed = false;         // keep a List index value -> objects
};

// One cached resource: its key prefix and what is extracted from its objects.
struct ResourceSpec {
  std::string prefix;  // e.g. "/registry/pods/"
  std::vector<FieldSpec> fields;
  // Extract metadata.labels ({1, 11} / "metadata.labels") and keep a List
  // index "key=value" -> objects.
  bool labels = true;
  bool index_labels = true;
};

// Kubernetes registry defaults: pods (metadata.name, metadata.namespace,
// spec.nodeName, status.phase; labels), nodes ("minions"), leases.
ResourceSpec PodResource(std::string prefix = "/registry/pods/");
ResourceSpec NodeResource(std::string prefix = "/registry/minions/");
ResourceSpec LeaseResource(std::string prefix = "/registry/leases/");
std::vector<ResourceSpec> DefaultResources();
// The spec for a configured prefix: Kubernetes' registry layout decides the
// built-in indexes (".../pods/", ".../minions/", ".../leases/"); any other
// prefix is cached without indexes.
ResourceSpec ResourceForPrefix(const std::string& prefix);

// What Extract found. Views point into the value passed to Extract or into
// `owned` (strings that needed unescaping); valid while both are.
struct Extracted {
  bool decoded = false;
  std::vector<std::optional<std::string_view>> fields;  // per ResourceSpec field
  std::vector<std::pair<std::string_view, std::string_view>> labels;  // sorted, unique keys
  std::deque<std::string> owned;

  void Clear() {
    decoded = false;
    fields.clear();
    labels.clear();
    owned.clear();
  }
};

class IndexExtractor {
 public:
  explicit IndexExtractor(const ResourceSpec& spec);
  ~IndexExtractor();
  IndexExtractor(const IndexExtractor&) = delete;
  IndexExtractor& operator=(const IndexExtractor&) = delete;

  // Fills *out from a stored value. Returns out->decoded: false when the
  // value is in neither format or is malformed (then out has no fields).
  bool Extract(std::string_view value, Extracted* out) const;

  // The index of the field named `name` in the spec, or -1.
  int FieldIndex(std::string_view name) const;
  const ResourceSpec& spec() const { return spec_; }

  struct PathNode;  // one level of the field-path trie (index_extractor.cc)

 private:
  bool ExtractProto(std::string_view value, Extracted* out) const;
  bool ExtractJson(std::string_view value, Extracted* out) const;

  const ResourceSpec spec_;
  std::unique_ptr<PathNode> proto_root_;
  std::unique_ptr<PathNode> json_root_;
};

// Builds a Kubernetes protobuf envelope ("k8s\0" + runtime.Unknown) around
// an encoded object; for tests and benchmarks.
std::string K8sProtobufEnvelope(std::string_view api_version, std::string_view kind,
                                std::string_view raw);

}  // namespace capstan::watchcache

#endif  // CAPSTAN_WATCHCACHE_INDEX_EXTRACTOR_H_
