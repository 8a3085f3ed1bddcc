// Listing a prefix the way kube-apiserver's etcd3 storage does.

#ifndef CAPSTAN_BENCH_LOADGEN_LIST_UTIL_H_
#define CAPSTAN_BENCH_LOADGEN_LIST_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "bench/loadgen/histogram.h"
#include "bench/loadgen/timeline.h"
#include "etcdserverpb/rpc.grpc.pb.h"

namespace capstan::bench {

struct ListResult {
  grpc::Status status;
  uint64_t objects = 0;
  uint64_t bytes = 0;   // sum of value sizes
  int pages = 0;
  int64_t revision = 0;
};

// A paginated list of every key under prefix: pages of `limit` keys, the
// first at the current revision, the rest at that same revision continuing
// from the last key + "\0" (kube-apiserver's continue token). limit 0: one
// unpaginated Range. Each page's latency (ns) goes to page_latency if set;
// each listed object goes to each_object if set.
ListResult ListPrefix(etcdserverpb::KV::Stub& kv, const std::string& prefix, int64_t limit,
                      Histogram* page_latency,
                      const std::function<void(const mvccpb::KeyValue&)>& each_object = nullptr);

// The same list when only the counts are wanted: each page is read as a
// RangeResponseSummary (response_summary.h), whose values are skipped on
// the wire instead of being copied into a RangeResponse. Each page's latency
// also goes to page_timeline if set.
ListResult CountPrefix(const std::shared_ptr<grpc::Channel>& channel, const std::string& prefix,
                       int64_t limit, Histogram* page_latency, Timeline* page_timeline = nullptr);

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_LIST_UTIL_H_
