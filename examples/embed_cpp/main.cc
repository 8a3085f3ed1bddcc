// An apiserver-like process embedding Capstan: it opens a store, writes
// pods in Kubernetes' protobuf storage format, lists the pods of one node
// through the watch cache (an index lookup), and watches that node's pods
// while they are created, changed and moved away. Exits 1 on any mismatch.
//
//   embed_cpp [DATA_DIR]     (default: a fresh directory under /tmp)

#include <capstan/capstan.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

namespace {

// ---- A minimal encoder of v1.Pod in Kubernetes' storage format ----------
// "k8s\0" + runtime.Unknown{typeMeta=1{apiVersion=1, kind=2}, raw=2}, raw
// being v1.Pod{metadata=1{name=1, namespace=3, uid=5, labels=11{key=1,
// value=2}}, spec=2{nodeName=10}, status=3{phase=1}}.

void Varint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void Bytes(int field, const std::string& value, std::string* out) {
  Varint(static_cast<uint64_t>(field) << 3 | 2, out);
  Varint(value.size(), out);
  out->append(value);
}

std::string EncodePod(const std::string& ns, const std::string& name, const std::string& node,
                      const std::string& phase, const std::map<std::string, std::string>& labels) {
  std::string meta, spec, status, pod, type_meta, unknown("k8s\0", 4);
  Bytes(1, name, &meta);
  Bytes(3, ns, &meta);
  Bytes(5, "uid-" + ns + "-" + name, &meta);
  for (const auto& [k, v] : labels) {
    std::string entry;
    Bytes(1, k, &entry);
    Bytes(2, v, &entry);
    Bytes(11, entry, &meta);
  }
  Bytes(10, node, &spec);
  Bytes(1, phase, &status);
  Bytes(1, meta, &pod);
  Bytes(2, spec, &pod);
  Bytes(3, status, &pod);
  Bytes(1, "v1", &type_meta);
  Bytes(2, "Pod", &type_meta);
  Bytes(1, type_meta, &unknown);
  Bytes(2, pod, &unknown);
  return unknown;
}

// ---------------------------------------------------------------------------

int failures = 0;

void Check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

template <typename T>
T Must(capstan::Result<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, r.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*r);
}

const char* TypeName(capstan::CacheEvent::Type t) {
  switch (t) {
    case capstan::CacheEvent::Type::kAdded: return "ADDED";
    case capstan::CacheEvent::Type::kModified: return "MODIFIED";
    case capstan::CacheEvent::Type::kDeleted: return "DELETED";
    case capstan::CacheEvent::Type::kBookmark: return "BOOKMARK";
  }
  return "?";
}

std::string PodKey(const std::string& name) { return "/registry/pods/default/" + name; }

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  if (argc > 1) {
    dir = argv[1];
  } else {
    char tmpl[] = "/tmp/capstan-embed-cpp-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return 1;
    dir = tmpl;
  }
  std::printf("libcapstan %s (etcd API %s), data dir %s\n", capstan::Version(),
              capstan::EtcdApiVersion(), dir.c_str());

  capstan::Options options;
  options.data_dir = dir;
  auto store = Must(capstan::Store::Open(options), "open");

  // 12 pods on 3 nodes.
  const char* nodes[] = {"node-a", "node-b", "node-c"};
  std::vector<std::string> expected_on_b;
  for (int i = 0; i < 12; ++i) {
    const std::string name = "pod-" + std::to_string(10 + i);
    const std::string node = nodes[i % 3];
    Must(store->Put(PodKey(name), EncodePod("default", name, node, "Running",
                                            {{"app", i % 2 ? "web" : "db"}})),
         "put");
    if (node == "node-b") expected_on_b.push_back(PodKey(name));
  }
  std::printf("wrote 12 pods, store revision %lld\n", static_cast<long long>(store->Revision()));

  capstan::ListOptions list;
  list.prefix = "/registry/pods/";
  list.field_selector = "spec.nodeName=node-b";
  auto pods = Must(store->List(list), "list");
  std::vector<std::string> keys;
  for (const auto& o : pods.objects) keys.push_back(o.key);
  std::printf("pods on node-b at revision %lld:", static_cast<long long>(pods.revision));
  for (const auto& k : keys) std::printf(" %s", k.c_str());
  std::printf("\n");
  Check(keys == expected_on_b, "List(spec.nodeName=node-b) returns exactly node-b's 4 pods");
  Check(pods.revision == store->Revision(), "List is at the store's revision");

  list.label_selector = "app=web";
  auto web = Must(store->List(list), "list with labels");
  Check(web.objects.size() == 2, "List(spec.nodeName=node-b, app=web) returns 2 pods");

  // Watch node-b's pods from the listed revision on.
  capstan::CacheWatchOptions watch;
  watch.prefix = "/registry/pods/";
  watch.field_selector = "spec.nodeName=node-b";
  watch.resource_version = std::to_string(pods.revision);
  auto w = Must(store->CacheWatch(watch), "watch");

  Must(store->Put(PodKey("pod-new"), EncodePod("default", "pod-new", "node-b", "Pending", {})),
       "put");
  Must(store->Put(PodKey("pod-11"), EncodePod("default", "pod-11", "node-b", "Succeeded", {})),
       "put");
  Must(store->Put(PodKey("pod-14"), EncodePod("default", "pod-14", "node-c", "Running", {})),
       "put");  // moves off node-b
  Must(store->Put(PodKey("pod-x"), EncodePod("default", "pod-x", "node-a", "Running", {})),
       "put");  // never on node-b
  Must(store->DeleteRange(PodKey("pod-17")), "delete");

  std::vector<std::string> seen;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (seen.size() < 4 && std::chrono::steady_clock::now() < deadline) {
    std::vector<capstan::CacheEvent> events;
    capstan::Status s = w->Next(&events, std::chrono::milliseconds(200));
    if (!s.ok()) {
      std::fprintf(stderr, "watch ended: %s\n", s.ToString().c_str());
      return 1;
    }
    for (const auto& e : events) {
      std::printf("watch event %s %s at revision %lld\n", TypeName(e.type), e.object.key.c_str(),
                  static_cast<long long>(e.revision));
      seen.push_back(std::string(TypeName(e.type)) + " " + e.object.key);
    }
  }
  const std::vector<std::string> want = {
      "ADDED " + PodKey("pod-new"), "MODIFIED " + PodKey("pod-11"),
      "DELETED " + PodKey("pod-14"), "DELETED " + PodKey("pod-17")};
  Check(seen == want, "node-b's watcher sees ADDED, MODIFIED, DELETED (moved away), DELETED");

  w.reset();
  store.reset();
  if (argc <= 1) std::system(("rm -rf '" + dir + "'").c_str());
  std::printf("%s\n", failures == 0 ? "embed_cpp: all checks passed" : "embed_cpp: FAILED");
  return failures == 0 ? 0 : 1;
}
