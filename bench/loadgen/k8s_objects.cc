#include "bench/loadgen/k8s_objects.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace capstan::bench::k8s {

namespace {

void AppendVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

std::string Uid(std::mt19937_64& rng) {
  const uint64_t a = rng(), b = rng();
  return absl::StrFormat("%08x-%04x-%04x-%04x-%012x", a >> 32, (a >> 16) & 0xffff,
                         0x4000 | (a & 0x0fff), 0x8000 | (b >> 50), b & 0xffffffffffffULL);
}

std::string Ip(std::mt19937_64& rng, int first) {
  const uint64_t r = rng();
  return absl::StrFormat("%d.%d.%d.%d", first, (r >> 8) & 0xff, (r >> 16) & 0xff, 1 + (r & 0xfd));
}

// A managedFields entry (metav1.ManagedFieldsEntry): manager(1), operation(2),
// apiVersion(3), time(4), fieldsType(6), fieldsV1(7){raw(1)}.
ProtoWriter ManagedFields(std::string_view manager, std::string_view operation, int64_t unix,
                          std::string_view fields_json, std::string_view subresource = "") {
  ProtoWriter fields_v1;
  fields_v1.Bytes(1, fields_json);
  ProtoWriter m;
  m.Bytes(1, manager).Bytes(2, operation).Bytes(3, "v1").Time(4, unix).Bytes(6, "FieldsV1");
  m.Message(7, fields_v1);
  if (!subresource.empty()) m.Bytes(8, subresource);
  return m;
}

// A FieldsV1 JSON document of about n bytes, shaped like the real ones.
std::string FieldsJson(size_t n, std::mt19937_64& rng) {
  std::string s = R"({"f:metadata":{"f:generateName":{},"f:labels":{".":{},"f:app":{},)"
                  R"("f:pod-template-hash":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\")";
  s += Uid(rng);
  s += R"(\"}":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"app\"}":{".":{},"f:env":{)";
  int i = 0;
  while (s.size() + 64 < n) {
    absl::StrAppendFormat(&s, R"("k:{\"name\":\"ENV_%03d\"}":{".":{},"f:name":{},"f:value":{}},)",
                          i++);
  }
  s += R"("z":{}}}}})";
  return s;
}

}  // namespace

ProtoWriter& ProtoWriter::Varint(int field, uint64_t v) {
  AppendVarint(static_cast<uint64_t>(field) << 3, &data_);
  AppendVarint(v, &data_);
  return *this;
}

ProtoWriter& ProtoWriter::Bytes(int field, std::string_view s) {
  AppendVarint((static_cast<uint64_t>(field) << 3) | 2, &data_);
  AppendVarint(s.size(), &data_);
  data_.append(s);
  return *this;
}

ProtoWriter& ProtoWriter::MapEntry(int field, std::string_view key, std::string_view value) {
  ProtoWriter e;
  e.Bytes(1, key).Bytes(2, value);
  return Message(field, e);
}

ProtoWriter& ProtoWriter::Time(int field, int64_t unix_seconds, int32_t nanos) {
  ProtoWriter t;
  t.Varint(1, static_cast<uint64_t>(unix_seconds));
  if (nanos != 0) t.Varint(2, static_cast<uint64_t>(nanos));
  return Message(field, t);
}

std::string Envelope(std::string_view api_version, std::string_view kind, std::string_view raw) {
  ProtoWriter type_meta;
  type_meta.Bytes(1, api_version).Bytes(2, kind);
  ProtoWriter unknown;
  // gogo-protobuf writes the empty contentEncoding and contentType too.
  unknown.Message(1, type_meta).Bytes(2, raw).Bytes(3, "").Bytes(4, "");
  std::string out("k8s\0", 4);
  out += unknown.data();
  return out;
}

std::string EncodePod(const PodSpec& p) {
  std::mt19937_64 rng(p.seed);
  const std::string uid = Uid(rng);
  const std::string owner_uid = Uid(rng);
  const std::string hash = absl::StrFormat("%010x", rng() & 0xffffffffffULL);
  const std::string rs_name = absl::StrCat(p.app, "-", hash);
  const int64_t t = p.created_unix;
  const int64_t status_t = t + p.generation;

  auto build = [&](size_t fields_json_size) {
    ProtoWriter owner;  // OwnerReference: kind(1), name(3), uid(4), apiVersion(5), controller(6), blockOwnerDeletion(7)
    owner.Bytes(1, "ReplicaSet").Bytes(3, rs_name).Bytes(4, owner_uid).Bytes(5, "apps/v1");
    owner.Bool(6, true).Bool(7, true);
    ProtoWriter meta;  // ObjectMeta
    meta.Bytes(1, p.name).Bytes(2, rs_name + "-").Bytes(3, p.ns).Bytes(5, uid).Time(8, t);
    meta.MapEntry(11, "app", p.app).MapEntry(11, "pod-template-hash", hash);
    meta.MapEntry(11, "tier", "backend");
    meta.Message(13, owner);
    meta.Message(17, ManagedFields("kube-controller-manager", "Update", t,
                                   FieldsJson(fields_json_size, rng)));
    meta.Message(17, ManagedFields("kubelet", "Update", status_t,
                                   R"({"f:status":{"f:conditions":{},"f:containerStatuses":{},)"
                                   R"("f:hostIP":{},"f:phase":{},"f:podIP":{},"f:startTime":{}}})",
                                   "status"));

    ProtoWriter port;  // ContainerPort: containerPort(3), protocol(4)
    port.Varint(3, 8080).Bytes(4, "TCP");
    ProtoWriter quantity_cpu, quantity_mem;
    quantity_cpu.Bytes(1, "100m");
    quantity_mem.Bytes(1, "128Mi");
    ProtoWriter requests_cpu, requests_mem;  // map<string, Quantity> entries
    requests_cpu.Bytes(1, "cpu").Message(2, quantity_cpu);
    requests_mem.Bytes(1, "memory").Message(2, quantity_mem);
    ProtoWriter resources;  // ResourceRequirements: limits(1), requests(2)
    resources.Message(1, requests_mem).Message(2, requests_cpu).Message(2, requests_mem);
    ProtoWriter mount;  // VolumeMount: name(1), readOnly(2), mountPath(3)
    mount.Bytes(1, "kube-api-access").Bool(2, true);
    mount.Bytes(3, "/var/run/secrets/kubernetes.io/serviceaccount");
    ProtoWriter container;  // Container
    container.Bytes(1, "app").Bytes(2, absl::StrCat("registry.k8s.io/", p.app, ":1.2.3"));
    container.Message(6, port);
    for (int i = 0; i < 4; ++i) {
      ProtoWriter env;
      env.Bytes(1, absl::StrFormat("ENV_%03d", i)).Bytes(2, absl::StrCat("value-", i));
      container.Message(7, env);
    }
    container.Message(8, resources).Message(9, mount);
    container.Bytes(13, "/dev/termination-log").Bytes(14, "IfNotPresent").Bytes(20, "File");
    ProtoWriter volume;  // Volume: name(1) (its projected source left out)
    volume.Bytes(1, "kube-api-access");
    ProtoWriter toleration;  // Toleration: key(1), operator(2), effect(4), tolerationSeconds(5)
    toleration.Bytes(1, "node.kubernetes.io/not-ready").Bytes(2, "Exists");
    toleration.Bytes(4, "NoExecute").Varint(5, 300);
    ProtoWriter spec;  // PodSpec
    spec.Message(1, volume).Message(2, container).Bytes(3, "Always").Varint(4, 30);
    spec.Bytes(6, "ClusterFirst").Bytes(8, "default");
    if (!p.node.empty()) spec.Bytes(10, p.node);
    spec.Bytes(19, "default-scheduler").Message(22, toleration).Varint(25, 0).Bool(30, true);
    spec.Bytes(31, "PreemptLowerPriority");

    ProtoWriter status;  // PodStatus
    status.Bytes(1, p.phase);
    for (const char* type : {"Initialized", "Ready", "ContainersReady", "PodScheduled"}) {
      ProtoWriter cond;  // PodCondition: type(1), status(2), lastTransitionTime(4)
      cond.Bytes(1, type).Bytes(2, p.phase == "Running" ? "True" : "False").Time(4, status_t);
      status.Message(2, cond);
    }
    if (!p.node.empty()) {
      status.Bytes(5, Ip(rng, 10)).Bytes(6, Ip(rng, 172)).Time(7, t + 1);
      ProtoWriter running, state, cs;  // ContainerStatus
      running.Time(1, status_t);
      state.Message(2, running);
      cs.Bytes(1, "app").Message(2, state).Bool(4, p.phase == "Running").Varint(5, 0);
      cs.Bytes(6, absl::StrCat("registry.k8s.io/", p.app, ":1.2.3"));
      cs.Bytes(7, absl::StrCat("registry.k8s.io/", p.app, "@sha256:", absl::StrFormat("%016x%016x", rng(), rng())));
      cs.Bytes(8, absl::StrFormat("containerd://%016x%016x", rng(), rng())).Bool(9, true);
      status.Message(8, cs);
    }
    status.Bytes(9, "Burstable");
    ProtoWriter pod;
    pod.Message(1, meta).Message(2, spec).Message(3, status);
    return Envelope("v1", "Pod", pod.data());
  };
  // Size the managedFields document so the stored object lands near target_size.
  const std::mt19937_64 rng_state = rng;
  const size_t min_json = FieldsJson(0, rng).size();
  rng = rng_state;
  const std::string base = build(0);
  rng = rng_state;
  const size_t pad = p.target_size > base.size() ? p.target_size - base.size() : 0;
  return build(min_json + pad);
}

std::string EncodeNode(const NodeSpec& n) {
  std::mt19937_64 rng(n.seed);
  const int64_t t = 1700000000;
  ProtoWriter meta;
  meta.Bytes(1, n.name).Bytes(5, Uid(rng)).Time(8, t);
  meta.MapEntry(11, "beta.kubernetes.io/arch", "amd64").MapEntry(11, "beta.kubernetes.io/os", "linux");
  meta.MapEntry(11, "kubernetes.io/arch", "amd64").MapEntry(11, "kubernetes.io/hostname", n.name);
  meta.MapEntry(11, "kubernetes.io/os", "linux");
  meta.MapEntry(11, "topology.kubernetes.io/zone", absl::StrCat("zone-", n.seed % 3));
  meta.MapEntry(12, "node.alpha.kubernetes.io/ttl", "0");
  meta.MapEntry(12, "volumes.kubernetes.io/controller-managed-attach-detach", "true");
  meta.Message(17, ManagedFields("kubelet", "Update", n.heartbeat_unix,
                                 R"({"f:status":{"f:conditions":{"k:{\"type\":\"Ready\"}":)"
                                 R"({"f:lastHeartbeatTime":{},"f:status":{}}}}})",
                                 "status"));
  ProtoWriter spec;  // NodeSpec: podCIDR(1), providerID(3), podCIDRs(7)
  const std::string cidr = absl::StrFormat("10.%d.%d.0/24", (n.seed >> 8) & 0xff, n.seed & 0xff);
  spec.Bytes(1, cidr).Bytes(3, absl::StrCat("kind://docker/cluster/", n.name)).Bytes(7, cidr);
  ProtoWriter status;  // NodeStatus
  for (int field : {1, 2}) {  // capacity, allocatable: map<string, Quantity>
    for (auto [k, v] : std::initializer_list<std::pair<const char*, const char*>>{
             {"cpu", "16"}, {"ephemeral-storage", "102626232Ki"}, {"hugepages-2Mi", "0"},
             {"memory", "65843412Ki"}, {"pods", "110"}}) {
      ProtoWriter q, e;
      q.Bytes(1, v);
      e.Bytes(1, k).Message(2, q);
      status.Message(field, e);
    }
  }
  for (auto [type, st, reason] : std::initializer_list<std::tuple<const char*, const char*, const char*>>{
           {"MemoryPressure", "False", "KubeletHasSufficientMemory"},
           {"DiskPressure", "False", "KubeletHasNoDiskPressure"},
           {"PIDPressure", "False", "KubeletHasSufficientPID"},
           {"Ready", "True", "KubeletReady"}}) {
    ProtoWriter c;  // NodeCondition: type(1), status(2), lastHeartbeatTime(3), lastTransitionTime(4), reason(5), message(6)
    c.Bytes(1, type).Bytes(2, st).Time(3, n.heartbeat_unix).Time(4, t).Bytes(5, reason);
    c.Bytes(6, absl::StrCat("kubelet condition ", reason));
    status.Message(4, c);
  }
  ProtoWriter addr1, addr2;  // NodeAddress: type(1), address(2)
  addr1.Bytes(1, "InternalIP").Bytes(2, Ip(rng, 10));
  addr2.Bytes(1, "Hostname").Bytes(2, n.name);
  status.Message(5, addr1).Message(5, addr2);
  ProtoWriter port, endpoints;  // NodeDaemonEndpoints{kubeletEndpoint(1){Port(1)}}
  port.Varint(1, 10250);
  endpoints.Message(1, port);
  status.Message(6, endpoints);
  ProtoWriter info;  // NodeSystemInfo
  info.Bytes(1, absl::StrFormat("%016x%016x", rng(), rng())).Bytes(2, Uid(rng)).Bytes(3, Uid(rng));
  info.Bytes(4, "6.1.0-18-amd64").Bytes(5, "Debian GNU/Linux 12 (bookworm)");
  info.Bytes(6, "containerd://1.7.13").Bytes(7, "v1.29.2").Bytes(8, "v1.29.2");
  info.Bytes(9, "linux").Bytes(10, "amd64");
  status.Message(7, info);
  for (int i = 0; i < n.images; ++i) {
    ProtoWriter img;  // ContainerImage: names(1), sizeBytes(2)
    img.Bytes(1, absl::StrFormat("registry.k8s.io/image-%02d@sha256:%016x%016x%016x%016x", i, rng(),
                                 rng(), rng(), rng()));
    img.Bytes(1, absl::StrFormat("registry.k8s.io/image-%02d:v1.%d.0", i, i));
    img.Varint(2, 10000000 + rng() % 500000000);
    status.Message(8, img);
  }
  ProtoWriter node;
  node.Message(1, meta).Message(2, spec).Message(3, status);
  return Envelope("v1", "Node", node.data());
}

std::string EncodeNodeLease(std::string_view node, int64_t renew_unix, int32_t renew_nanos,
                            uint64_t seed) {
  std::mt19937_64 rng(seed);
  ProtoWriter owner;
  owner.Bytes(1, "Node").Bytes(3, node).Bytes(4, Uid(rng)).Bytes(5, "v1");
  ProtoWriter meta;
  meta.Bytes(1, node).Bytes(3, "kube-node-lease").Bytes(5, Uid(rng)).Time(8, 1700000000);
  meta.Message(13, owner);
  meta.Message(17, ManagedFields("kubelet", "Update", renew_unix,
                                 R"({"f:metadata":{"f:ownerReferences":{}},"f:spec":{)"
                                 R"("f:holderIdentity":{},"f:leaseDurationSeconds":{},"f:renewTime":{}}})"));
  ProtoWriter spec;  // LeaseSpec: holderIdentity(1), leaseDurationSeconds(2), renewTime(4)
  spec.Bytes(1, node).Varint(2, 40).Time(4, renew_unix, renew_nanos);
  ProtoWriter lease;
  lease.Message(1, meta).Message(2, spec);
  return Envelope("coordination.k8s.io/v1", "Lease", lease.data());
}

std::string EncodeEvent(const EventSpec& e) {
  std::mt19937_64 rng(e.seed);
  ProtoWriter meta;
  meta.Bytes(1, e.name).Bytes(3, e.ns).Bytes(5, Uid(rng)).Time(8, e.unix);
  ProtoWriter involved;  // ObjectReference: kind(1), namespace(2), name(3), uid(4), apiVersion(5), fieldPath(7)
  involved.Bytes(1, "Pod").Bytes(2, e.ns).Bytes(3, e.pod).Bytes(4, Uid(rng)).Bytes(5, "v1");
  involved.Bytes(7, "spec.containers{app}");
  ProtoWriter source;  // EventSource: component(1), host(2)
  source.Bytes(1, "kubelet").Bytes(2, e.node);
  ProtoWriter ev;
  ev.Message(1, meta).Message(2, involved).Bytes(3, e.reason);
  ev.Bytes(4, absl::StrCat("Successfully pulled image \"registry.k8s.io/app:1.2.3\" in 1.2s (",
                           e.reason, ")"));
  ev.Message(5, source).Time(6, e.unix).Time(7, e.unix).Varint(8, 1).Bytes(9, "Normal");
  ev.Bytes(14, "kubelet").Bytes(15, e.node);
  return Envelope("v1", "Event", ev.data());
}

bool ForEachField(std::string_view msg,
                  const std::function<void(int, int, uint64_t, std::string_view)>& fn) {
  size_t i = 0;
  auto varint = [&](uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (i >= msg.size()) return false;
      const uint8_t b = static_cast<uint8_t>(msg[i++]);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (b < 0x80) return true;
    }
    return false;
  };
  while (i < msg.size()) {
    uint64_t tag;
    if (!varint(&tag)) return false;
    const int field = static_cast<int>(tag >> 3), type = static_cast<int>(tag & 7);
    if (type == 0) {
      uint64_t v;
      if (!varint(&v)) return false;
      fn(field, type, v, {});
    } else if (type == 2) {
      uint64_t len;
      if (!varint(&len) || len > msg.size() - i) return false;
      fn(field, type, 0, msg.substr(i, len));
      i += len;
    } else {
      return false;
    }
  }
  return true;
}

bool DecodePod(std::string_view stored, PodFields* out) {
  if (stored.substr(0, 4) != std::string_view("k8s\0", 4)) return false;
  std::string_view raw;
  bool ok = ForEachField(stored.substr(4), [&](int f, int, uint64_t, std::string_view b) {
    if (f == 1) {
      ForEachField(b, [&](int tf, int, uint64_t, std::string_view tb) {
        if (tf == 1) out->api_version = tb;
        if (tf == 2) out->kind = tb;
      });
    }
    if (f == 2) raw = b;
  });
  if (!ok) return false;
  return ForEachField(raw, [&](int f, int, uint64_t, std::string_view b) {
    if (f == 1) {
      ForEachField(b, [&](int mf, int, uint64_t, std::string_view mb) {
        if (mf == 1) out->name = mb;
        if (mf == 3) out->ns = mb;
        if (mf == 11) {
          std::string k, v;
          ForEachField(mb, [&](int ef, int, uint64_t, std::string_view eb) {
            (ef == 1 ? k : v) = eb;
          });
          out->labels[k] = v;
        }
      });
    } else if (f == 2) {
      ForEachField(b, [&](int sf, int, uint64_t, std::string_view sb) {
        if (sf == 10) out->node = sb;
      });
    } else if (f == 3) {
      ForEachField(b, [&](int sf, int, uint64_t, std::string_view sb) {
        if (sf == 1) out->phase = sb;
      });
    }
  });
}

}  // namespace capstan::bench::k8s
