// Kubernetes-shaped objects for tests and benchmarks: v1.Pod values in the
// Kubernetes protobuf storage format ("k8s\0" + runtime.Unknown) and in
// JSON, built by hand (no Kubernetes dependency).

#ifndef CAPSTAN_WATCHCACHE_K8S_TEST_OBJECTS_H_
#define CAPSTAN_WATCHCACHE_K8S_TEST_OBJECTS_H_

#include <map>
#include <string>

#include "mvcc/kv_codec.h"
#include "watchcache/index_extractor.h"

namespace capstan::watchcache::testing {

struct PodFields {
  std::string name, ns, node, phase;
  std::map<std::string, std::string> labels;
  size_t padding = 0;  // bytes of annotation filler, to reach realistic sizes
};

// A v1.Pod {metadata=1 {name=1, namespace=3, uid=5, labels=11,
// annotations=12}, spec=2 {containers=2 {name=1, image=2}, nodeName=10},
// status=3 {phase=1}} in the protobuf storage format.
inline std::string PodProtobuf(const PodFields& p) {
  using util::AppendBytesField;
  std::string meta;
  util::AppendBytesField(1, p.name, &meta);
  util::AppendBytesField(3, p.ns, &meta);
  util::AppendBytesField(5, "uid-" + p.ns + "-" + p.name, &meta);
  for (const auto& [k, v] : p.labels) {
    std::string entry;
    util::AppendBytesField(1, k, &entry);
    util::AppendBytesField(2, v, &entry);
    util::AppendBytesField(11, entry, &meta);
  }
  if (p.padding > 0) {
    std::string entry;
    util::AppendBytesField(1, "kubectl.kubernetes.io/last-applied-configuration", &entry);
    std::string filler(p.padding, 'x');
    for (size_t i = 0; i < filler.size(); ++i) filler[i] = static_cast<char>('a' + (i * 7 + p.name.size()) % 26);
    util::AppendBytesField(2, filler, &entry);
    util::AppendBytesField(12, entry, &meta);
  }
  std::string container;
  util::AppendBytesField(1, "main", &container);
  util::AppendBytesField(2, "registry.k8s.io/pause:3.9", &container);
  std::string spec;
  util::AppendBytesField(2, container, &spec);
  if (!p.node.empty()) util::AppendBytesField(10, p.node, &spec);
  std::string status;
  if (!p.phase.empty()) util::AppendBytesField(1, p.phase, &status);
  std::string pod;
  util::AppendBytesField(1, meta, &pod);
  util::AppendBytesField(2, spec, &pod);
  util::AppendBytesField(3, status, &pod);
  return K8sProtobufEnvelope("v1", "Pod", pod);
}

inline std::string PodJson(const PodFields& p) {
  std::string labels;
  for (const auto& [k, v] : p.labels) {
    if (!labels.empty()) labels += ",";
    labels += "\"" + k + "\":\"" + v + "\"";
  }
  std::string s = "{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":\"" + p.name +
                  "\",\"namespace\":\"" + p.ns + "\",\"labels\":{" + labels +
                  "},\"annotations\":{\"a\":\"" + std::string(p.padding, 'x') +
                  "\"}},\"spec\":{\"containers\":[{\"name\":\"main\",\"image\":\"pause\"}]";
  if (!p.node.empty()) s += ",\"nodeName\":\"" + p.node + "\"";
  s += "},\"status\":{";
  if (!p.phase.empty()) s += "\"phase\":\"" + p.phase + "\"";
  s += "}}";
  return s;
}

// An encoded mvccpb.KeyValue record.
inline std::string KvRecord(const std::string& key, const std::string& value, int64_t mod_rev,
                            int64_t create_rev = 0, int64_t version = 1) {
  mvcc::KeyValueView kv;
  kv.key = key;
  kv.value = value;
  kv.mod_revision = mod_rev;
  kv.create_revision = create_rev ? create_rev : mod_rev;
  kv.version = version;
  return mvcc::EncodeKeyValue(kv);
}

}  // namespace capstan::watchcache::testing

#endif  // CAPSTAN_WATCHCACHE_K8S_TEST_OBJECTS_H_
