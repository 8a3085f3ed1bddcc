// Kubernetes objects as kube-apiserver stores them in etcd: the 4-byte magic
// "k8s\0" followed by a protobuf runtime.Unknown
//   { typeMeta(1) { apiVersion(1), kind(2) }, raw(2), contentEncoding(3), contentType(4) }
// whose raw is the object's own protobuf (k8s.io/api generated.proto field
// numbers: v1.Pod, v1.Node, v1.Event, coordination.k8s.io/v1 Lease). The
// objects are shaped like real ones (metadata with labels, owner references
// and managedFields; containers; status) so that their sizes and the fields a
// watch cache indexes (metadata.namespace, spec.nodeName, status.phase,
// labels) are where a real apiserver would put them.
//
// Thread-safe: plain functions of their arguments.

#ifndef CAPSTAN_BENCH_LOADGEN_K8S_OBJECTS_H_
#define CAPSTAN_BENCH_LOADGEN_K8S_OBJECTS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

namespace capstan::bench::k8s {

// Appends protobuf wire format to a string.
class ProtoWriter {
 public:
  ProtoWriter& Varint(int field, uint64_t v);
  ProtoWriter& Bool(int field, bool v) { return Varint(field, v ? 1 : 0); }
  ProtoWriter& Bytes(int field, std::string_view s);
  ProtoWriter& Message(int field, const ProtoWriter& m) { return Bytes(field, m.data_); }
  // One entry of a map<string, string> field.
  ProtoWriter& MapEntry(int field, std::string_view key, std::string_view value);
  // metav1.Time / MicroTime { seconds(1), nanos(2) }.
  ProtoWriter& Time(int field, int64_t unix_seconds, int32_t nanos = 0);

  const std::string& data() const { return data_; }
  size_t size() const { return data_.size(); }

 private:
  std::string data_;
};

// "k8s\0" + runtime.Unknown{typeMeta{apiVersion, kind}, raw, "", ""}.
std::string Envelope(std::string_view api_version, std::string_view kind, std::string_view raw);

struct PodSpec {
  std::string name;
  std::string ns;
  std::string node;            // spec.nodeName; empty: not scheduled
  std::string phase = "Running";
  std::string app;             // labels: app, pod-template-hash
  int64_t created_unix = 1700000000;
  int generation = 1;          // bumps status timestamps on update
  size_t target_size = 4096;   // stored bytes to aim for (managedFields pad it)
  uint64_t seed = 0;           // uid, IPs
};
std::string EncodePod(const PodSpec& pod);

struct NodeSpec {
  std::string name;
  int64_t heartbeat_unix = 1700000000;  // status.conditions[].lastHeartbeatTime
  int images = 12;
  uint64_t seed = 0;
};
std::string EncodeNode(const NodeSpec& node);

// coordination.k8s.io/v1 Lease in kube-node-lease, renewed by the kubelet.
std::string EncodeNodeLease(std::string_view node, int64_t renew_unix, int32_t renew_nanos,
                            uint64_t seed);

struct EventSpec {
  std::string name;       // <pod>.<hex>
  std::string ns;
  std::string pod;
  std::string node;
  std::string reason = "Pulled";
  int64_t unix = 1700000000;
  uint64_t seed = 0;
};
std::string EncodeEvent(const EventSpec& event);

// Calls fn(field, wire_type, varint, bytes) for each field of a protobuf
// message; varint is set for wire type 0, bytes for wire type 2. Returns false
// on malformed input or an unsupported wire type.
bool ForEachField(std::string_view msg,
                  const std::function<void(int, int, uint64_t, std::string_view)>& fn);

// The fields a watch cache indexes, read back from a stored pod.
struct PodFields {
  std::string api_version, kind, name, ns, node, phase;
  std::map<std::string, std::string> labels;
};
bool DecodePod(std::string_view stored, PodFields* out);

}  // namespace capstan::bench::k8s

#endif  // CAPSTAN_BENCH_LOADGEN_K8S_OBJECTS_H_
