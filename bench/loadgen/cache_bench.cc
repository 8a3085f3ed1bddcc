// capstan-cache-bench: the watch cache against real etcd at Kubernetes scale.
//
//   capstan-cache-bench list  [--pods 150000] [--nodes 10000] [--reps 5]
//   capstan-cache-bench watch [--pods 150000] [--watchers 10000] [--rate 1000] [--seconds 10]
//
// list: starts a real etcd (every commit fsynced, its defaults), loads pods
// of 2-8 KiB (Kubernetes protobuf) spread over the nodes, starts a
// `capstan cache-proxy` (in process) fed by that etcd, and times the full
// pod list both ways over loopback gRPC, the client receiving raw bytes
// (no decoding on either side):
//   - etcd: Range of /registry/pods/ (linearizable, as kube-apiserver reads);
//   - cache: capstan.v1.Cache List of /registry/pods/ with resourceVersion
//     "0" (any state; what reflectors list with) and "" (consistent: the
//     proxy reads etcd's revision and waits for a progress notification).
// Then both paginated as kube-apiserver pages (limit 500: etcd's pages at
// the first page's revision from the last key + "\0", the cache's by its
// continue token), every page decoded by the client. Medians of --reps runs
// of wall time and of the CPU time both processes spent, and the ratios.
//
// watch: an in-process ResourceCache holding the pods, one watcher per node
// (spec.nodeName=node-i, as each kubelet watches), a feeder applying pod
// updates at --rate per second (10% move the pod to another node, which
// reaches two watchers: DELETED and ADDED), and two consumer threads woken
// by the watchers' notify functions. Delivery latency is from the moment
// the feeder hands the update to the cache to the moment a consumer has
// popped the event; p50/p99/max over every event delivered.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/compare.h"
#include "bench/loadgen/proc_stats.h"
#include "bench/loadgen/server_process.h"
#include "capstan/v1/cache.pb.h"
#include "cmd/cache_proxy.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "watchcache/k8s_test_objects.h"
#include "watchcache/resource_cache.h"

namespace capstan::bench {
namespace {

constexpr int kNamespaces = 500;

struct Flags {
  int pods = 150000;
  int nodes = 10000;
  int reps = 5;
  int watchers = 10000;
  int rate = 1000;
  int seconds = 10;
};

std::string PodKey(int i) { return absl::StrCat("/registry/pods/ns-", i % kNamespaces, "/pod-", i); }

std::string PodValue(int i, int node, const char* phase, std::mt19937* rng) {
  watchcache::testing::PodFields p;
  p.name = absl::StrCat("pod-", i);
  p.ns = absl::StrCat("ns-", i % kNamespaces);
  p.node = absl::StrCat("node-", node);
  p.phase = phase;
  p.labels = {{"app", absl::StrCat("app-", i % 1000)}, {"tier", i % 3 ? "backend" : "frontend"}};
  p.padding = 1700 + (*rng)() % 6200;  // records of ~2-8 KiB
  return watchcache::testing::PodProtobuf(p);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// One unary call with raw request and response bytes. Returns seconds;
// *response (if not null) receives the response's bytes.
double RawCall(grpc::GenericStub& stub, const std::string& method, const std::string& request,
               size_t* response_bytes, std::string* response = nullptr) {
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1), resp;
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  const absl::Time start = absl::Now();
  auto call = stub.PrepareUnaryCall(&ctx, method, req, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&resp, &status, reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  cq.Next(&tag, &ok);
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  if (!status.ok()) {
    std::fprintf(stderr, "%s failed: %s\n", method.c_str(), status.error_message().c_str());
    std::exit(1);
  }
  *response_bytes = resp.Length();
  if (response != nullptr) {
    std::vector<grpc::Slice> slices;
    (void)resp.Dump(&slices);
    response->clear();
    for (const auto& sl : slices) response->append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  }
  return secs;
}

// A paginated list as kube-apiserver pages (limit 500), timed from the
// first request to the last response; each page is decoded (the client
// needs the last key or the continue token). Returns seconds; *objects
// gets the objects listed.
constexpr int kPageLimit = 500;

double PagedEtcdRange(grpc::GenericStub& stub, size_t* objects) {
  const absl::Time start = absl::Now();
  etcdserverpb::RangeRequest req;
  req.set_key("/registry/pods/");
  req.set_range_end("/registry/pods0");
  req.set_limit(kPageLimit);
  *objects = 0;
  std::string bytes;
  size_t n;
  for (;;) {
    RawCall(stub, "/etcdserverpb.KV/Range", req.SerializeAsString(), &n, &bytes);
    etcdserverpb::RangeResponse resp;
    if (!resp.ParseFromString(bytes)) {
      std::fprintf(stderr, "etcd page does not parse\n");
      std::exit(1);
    }
    *objects += resp.kvs_size();
    if (!resp.more() || resp.kvs_size() == 0) break;
    // The next page at the first page's revision, from the last key + "\0".
    if (req.revision() == 0) req.set_revision(resp.header().revision());
    req.set_key(resp.kvs(resp.kvs_size() - 1).key() + std::string(1, '\0'));
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

double PagedCacheList(grpc::GenericStub& stub, size_t* objects) {
  const absl::Time start = absl::Now();
  capstan::v1::ListRequest req;
  req.set_prefix("/registry/pods/");
  req.set_limit(kPageLimit);
  *objects = 0;
  std::string bytes;
  size_t n;
  for (;;) {
    RawCall(stub, "/capstan.v1.Cache/List", req.SerializeAsString(), &n, &bytes);
    capstan::v1::ListResponse resp;
    if (!resp.ParseFromString(bytes)) {
      std::fprintf(stderr, "cache page does not parse\n");
      std::exit(1);
    }
    *objects += resp.kvs_size();
    if (resp.continue_().empty()) break;
    req.set_continue_(resp.continue_());
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

int RunList(const Flags& f) {
  InstallServerCleanup();
  ServerOptions so;
  so.kind = ServerKind::kEtcd;
  so.binary = DefaultEtcdBinary();
  so.extra_flags = {"--quota-backend-bytes=8589934592", "--max-request-bytes=10485760"};
  auto etcd = ServerProcess::Start(so, absl::Seconds(30));
  if (!etcd.ok()) {
    std::fprintf(stderr, "etcd: %s\n", etcd.status().ToString().c_str());
    return 1;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  // A large receive window for both servers' responses (HTTP/2 flow control
  // would otherwise pace a response of hundreds of MiB).
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  auto channel = grpc::CreateCustomChannel((*etcd)->endpoint(), grpc::InsecureChannelCredentials(), args);
  auto kv = etcdserverpb::KV::NewStub(channel);

  // Load, 256 puts in flight.
  std::printf("loading %d pods on %d nodes into etcd %s ...\n", f.pods, f.nodes, (*etcd)->endpoint().c_str());
  std::fflush(stdout);
  const absl::Time load_start = absl::Now();
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0, failed = 0;
  uint64_t raw = 0;
  std::mt19937 rng(1);
  for (int i = 0; i < f.pods; ++i) {
    etcdserverpb::PutRequest req;
    req.set_key(PodKey(i));
    req.set_value(PodValue(i, static_cast<int>(rng() % f.nodes), "Running", &rng));
    raw += req.key().size() + req.value().size();
    {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return in_flight < 256; });
      ++in_flight;
    }
    AsyncPut(*kv, std::move(req), [&](const grpc::Status& s, const etcdserverpb::PutResponse&) {
      std::lock_guard<std::mutex> l(mu);
      if (!s.ok()) ++failed;
      --in_flight;
      cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return in_flight == 0; });
  }
  if (failed > 0) {
    std::fprintf(stderr, "%d puts failed\n", failed);
    return 1;
  }
  std::printf("loaded %.0f MiB of keys and values in %.1f s\n", raw / 1048576.0,
              absl::ToDoubleSeconds(absl::Now() - load_start));

  server::CacheProxyOptions po;
  po.upstream = (*etcd)->endpoint();
  po.listen_client_urls = {"http://127.0.0.1:0"};
  po.watch_cache_prefixes = {"/registry/pods/"};
  const absl::Time proxy_start = absl::Now();
  auto proxy = server::CacheProxy::Start(po);
  if (!proxy.ok() || !(*proxy)->cache()->WaitReady(absl::Minutes(10))) {
    std::fprintf(stderr, "cache proxy did not start\n");
    return 1;
  }
  std::printf("cache proxy listed the pods in %.1f s\n", absl::ToDoubleSeconds(absl::Now() - proxy_start));
  auto proxy_channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", (*proxy)->ports()[0]),
                                                 grpc::InsecureChannelCredentials(), args);
  grpc::GenericStub etcd_stub(channel), cache_stub(proxy_channel);

  etcdserverpb::RangeRequest range;
  range.set_key("/registry/pods/");
  range.set_range_end("/registry/pods0");
  capstan::v1::ListRequest list_any, list_consistent;
  list_any.set_prefix("/registry/pods/");
  list_any.set_resource_version("0");
  list_consistent.set_prefix("/registry/pods/");
  // Each read is followed by a 2 s pause that lets its aftermath (etcd's
  // garbage collection of a response of hundreds of MiB) finish, and is
  // charged the CPU both processes (etcd, and this one: client and proxy)
  // used from its start to the end of the pause: on a loaded machine wall
  // time mostly measures the other tenants, CPU time does not.
  const pid_t etcd_pid = (*etcd)->pid(), self = getpid();
  auto cpu = [&] {
    ProcSample a, b;
    ReadProcSample(etcd_pid, &a);
    ReadProcSample(self, &b);
    return a.cpu_seconds + b.cpu_seconds;
  };
  struct Reads {
    std::vector<double> wall, cpu;
    size_t bytes = 0;
  };
  auto measure = [&](grpc::GenericStub& stub, const char* method, const std::string& request, Reads* r) {
    const double c0 = cpu();
    r->wall.push_back(RawCall(stub, method, request, &r->bytes));
    absl::SleepFor(absl::Seconds(2));
    r->cpu.push_back(cpu() - c0);
  };
  // A paginated walk, checked to list every pod.
  auto measure_paged = [&](double (*walk)(grpc::GenericStub&, size_t*), grpc::GenericStub& stub,
                           Reads* r) {
    const double c0 = cpu();
    size_t objects = 0;
    r->wall.push_back(walk(stub, &objects));
    if (objects != static_cast<size_t>(f.pods)) {
      std::fprintf(stderr, "a paginated list returned %zu of %d pods\n", objects, f.pods);
      std::exit(1);
    }
    absl::SleepFor(absl::Seconds(2));
    r->cpu.push_back(cpu() - c0);
  };
  Reads etcd_r, any_r, consistent_r, etcd_paged, cache_paged;
  for (int r = 0; r < f.reps; ++r) {
    measure(etcd_stub, "/etcdserverpb.KV/Range", range.SerializeAsString(), &etcd_r);
    measure(cache_stub, "/capstan.v1.Cache/List", list_any.SerializeAsString(), &any_r);
    measure(cache_stub, "/capstan.v1.Cache/List", list_consistent.SerializeAsString(), &consistent_r);
    measure_paged(PagedEtcdRange, etcd_stub, &etcd_paged);
    measure_paged(PagedCacheList, cache_stub, &cache_paged);
    std::printf("run %d: etcd Range %.1f ms (%.2f CPU s), cache List rv=0 %.1f ms (%.2f CPU s), "
                "cache List rv=\"\" %.1f ms (%.2f CPU s); paginated (limit %d): etcd %.1f ms "
                "(%.2f CPU s), cache %.1f ms (%.2f CPU s)\n",
                r + 1, etcd_r.wall.back() * 1e3, etcd_r.cpu.back(), any_r.wall.back() * 1e3, any_r.cpu.back(),
                consistent_r.wall.back() * 1e3, consistent_r.cpu.back(), kPageLimit,
                etcd_paged.wall.back() * 1e3, etcd_paged.cpu.back(), cache_paged.wall.back() * 1e3,
                cache_paged.cpu.back());
    std::fflush(stdout);
  }
  const double e = Median(etcd_r.wall), a = Median(any_r.wall), c = Median(consistent_r.wall);
  const double ec = Median(etcd_r.cpu), ac = Median(any_r.cpu), cc = Median(consistent_r.cpu);
  std::printf("\nfull pod list, %d pods, response %.0f MiB (etcd) / %.0f MiB (cache), medians of %d:\n", f.pods,
              etcd_r.bytes / 1048576.0, any_r.bytes / 1048576.0, f.reps);
  std::printf("| read | wall ms | vs etcd | CPU s (server + client) | vs etcd |\n|---|---:|---:|---:|---:|\n");
  std::printf("| etcd Range /registry/pods/ | %.1f | 1.0x | %.2f | 1.0x |\n", e * 1e3, ec);
  std::printf("| cache List rv=\"0\" | %.1f | %.1fx | %.2f | %.1fx |\n", a * 1e3, e / a, ac, ec / ac);
  std::printf("| cache List rv=\"\" (consistent) | %.1f | %.1fx | %.2f | %.1fx |\n", c * 1e3, e / c, cc, ec / cc);
  const double ep = Median(etcd_paged.wall), cp = Median(cache_paged.wall);
  const double epc = Median(etcd_paged.cpu), cpc = Median(cache_paged.cpu);
  std::printf("| etcd Range, paginated (limit %d, one revision) | %.1f | 1.0x | %.2f | 1.0x |\n", kPageLimit,
              ep * 1e3, epc);
  std::printf("| cache List rv=\"\", paginated (limit %d, continue) | %.1f | %.1fx | %.2f | %.1fx |\n",
              kPageLimit, cp * 1e3, ep / cp, cpc, epc / cpc);
  (*proxy)->Shutdown();
  (void)(*etcd)->Stop();
  return 0;
}

int RunWatch(const Flags& f) {
  using namespace watchcache;
  auto alloc = NewSlabAllocator();
  CacheOptions options;
  options.ring_max_capacity = 100 * 1024;
  ResourceCache cache(PodResource(), options, alloc.get());
  std::mt19937 rng(1);
  std::vector<int> node_of(f.pods);
  {
    std::vector<ObjectRef> objs;
    for (int i = 0; i < f.pods; ++i) {
      node_of[i] = static_cast<int>(rng() % f.watchers);
      objs.push_back(cache.MakeObject(
          watchcache::testing::KvRecord(PodKey(i), PodValue(i, node_of[i], "Running", &rng), 1)));
    }
    cache.Reset(1, std::move(objs));
  }
  // Watchers, woken through a ready queue drained by two consumers.
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int> ready;
  bool done = false;
  std::vector<std::unique_ptr<CacheWatch>> watches;
  const int total = f.rate * f.seconds;
  std::vector<std::atomic<int64_t>> sent_ns(total + 2);
  int64_t applying = 1;              // the revision the feeder applies
  std::vector<int64_t> notify_ns;    // feeder thread only
  auto now_ns = [] { return absl::GetCurrentTimeNanos(); };
  for (int i = 0; i < f.watchers; ++i) {
    WatchOptions o;
    o.prefix = "/registry/pods/";
    o.field_selector = absl::StrCat("spec.nodeName=node-", i);
    o.resource_version = "1";
    auto w = cache.Watch(o);
    if (!w.ok()) {
      std::fprintf(stderr, "watch: %s\n", w.status().ToString().c_str());
      return 1;
    }
    (*w)->SetNotify([&, i] {
      // Runs on the feeder's thread right after the Apply that queued the
      // event: the dispatch part of the latency, without any wake-up.
      notify_ns.push_back(now_ns() - sent_ns[applying - 1].load(std::memory_order_relaxed));
      {
        std::lock_guard<std::mutex> l(mu);
        ready.push_back(i);
      }
      cv.notify_one();
    });
    std::vector<WatchEvent> none;
    (*w)->Pop(&none, 1);  // arms the notify function
    watches.push_back(std::move(*w));
  }
  std::vector<int64_t> latencies_ns;
  std::mutex lat_mu;
  std::atomic<int64_t> delivered{0};
  auto consumer = [&] {
    std::vector<WatchEvent> evs;
    std::vector<int64_t> local;
    for (;;) {
      int i;
      {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return done || !ready.empty(); });
        if (ready.empty()) break;
        i = ready.front();
        ready.pop_front();
      }
      evs.clear();
      while (watches[i]->Pop(&evs, 64) > 0) {
      }
      const int64_t t = now_ns();
      for (const auto& e : evs) {
        if (e.type == EventType::kBookmark) continue;
        local.push_back(t - sent_ns[e.revision - 1].load(std::memory_order_relaxed));
      }
    }
    delivered.fetch_add(static_cast<int64_t>(local.size()));
    std::lock_guard<std::mutex> l(lat_mu);
    latencies_ns.insert(latencies_ns.end(), local.begin(), local.end());
  };
  std::thread c1(consumer), c2(consumer);

  std::vector<std::string> values;  // prepared outside the paced loop
  for (int k = 0; k < 256; ++k) values.push_back(PodValue(k, 0, "Running", &rng));
  int expected = 0;
  const absl::Time start = absl::Now();
  for (int n = 0; n < total; ++n) {
    const absl::Time due = start + absl::Seconds(1) * n / f.rate;
    if (absl::Now() < due) absl::SleepFor(due - absl::Now());
    const int pod = static_cast<int>(rng() % f.pods);
    const int node = rng() % 10 == 0 ? static_cast<int>(rng() % f.watchers) : node_of[pod];
    expected += node == node_of[pod] ? 1 : 2;
    node_of[pod] = node;
    const int64_t rev = n + 2;
    std::vector<FeedChange> c(1);
    c[0].rev = rev;
    c[0].object = cache.MakeObject(watchcache::testing::KvRecord(
        PodKey(pod), PodValue(pod, node, n % 2 ? "Running" : "Pending", &rng), rev, 1, 2));
    sent_ns[rev - 1].store(now_ns(), std::memory_order_relaxed);
    applying = rev;
    cache.Apply(std::move(c), rev);
  }
  const double wall = absl::ToDoubleSeconds(absl::Now() - start);
  absl::SleepFor(absl::Milliseconds(200));
  {
    std::lock_guard<std::mutex> l(mu);
    done = true;
  }
  cv.notify_all();
  c1.join();
  c2.join();
  std::sort(latencies_ns.begin(), latencies_ns.end());
  std::sort(notify_ns.begin(), notify_ns.end());
  auto at = [](const std::vector<int64_t>& v, double p) {
    return v.empty() ? 0.0 : v[static_cast<size_t>(p * (v.size() - 1))] / 1e6;
  };
  auto pct = [&](double p) { return at(latencies_ns, p); };
  std::printf("%d watchers (one per node), %d pods, %d updates at %.0f/s: %lld events delivered (expected %d)\n",
              f.watchers, f.pods, total, total / wall, static_cast<long long>(delivered.load()), expected);
  std::printf("| delivery latency | ms |\n|---|---:|\n| p50 | %.3f |\n| p99 | %.3f |\n| p99.9 | %.3f |\n| max | %.3f |\n",
              pct(0.5), pct(0.99), pct(0.999), pct(1.0));
  std::printf("dispatch only (update handed to the cache -> watcher notified, %zu wake-ups): p50 %.3f ms, "
              "p99 %.3f ms, max %.3f ms\n",
              notify_ns.size(), at(notify_ns, 0.5), at(notify_ns, 0.99), at(notify_ns, 1.0));
  watches.clear();
  return delivered.load() == expected ? 0 : 1;
}

int Main(int argc, char** argv) {
  if (argc < 2 || (std::string(argv[1]) != "list" && std::string(argv[1]) != "watch")) {
    std::fprintf(stderr,
                 "usage: capstan-cache-bench list [--pods N] [--nodes N] [--reps N]\n"
                 "       capstan-cache-bench watch [--pods N] [--watchers N] [--rate N] [--seconds N]\n");
    return 2;
  }
  Flags f;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    int v = 0;
    if (!absl::SimpleAtoi(argv[i + 1], &v) || v <= 0) {
      std::fprintf(stderr, "bad value for %s\n", flag.c_str());
      return 2;
    }
    if (flag == "--pods") f.pods = v;
    else if (flag == "--nodes") f.nodes = v;
    else if (flag == "--reps") f.reps = v;
    else if (flag == "--watchers") f.watchers = v;
    else if (flag == "--rate") f.rate = v;
    else if (flag == "--seconds") f.seconds = v;
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  return std::string(argv[1]) == "list" ? RunList(f) : RunWatch(f);
}

}  // namespace
}  // namespace capstan::bench

int main(int argc, char** argv) { return capstan::bench::Main(argc, argv); }
