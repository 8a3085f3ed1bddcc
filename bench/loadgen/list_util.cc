#include "bench/loadgen/list_util.h"

#include <chrono>

#include "bench/loadgen/async_call.h"
#include "bench/loadgen/keys.h"

namespace capstan::bench {

ListResult ListPrefix(etcdserverpb::KV::Stub& kv, const std::string& prefix, int64_t limit,
                      Histogram* page_latency,
                      const std::function<void(const mvccpb::KeyValue&)>& each_object) {
  ListResult out;
  const std::string end = PrefixEnd(prefix);
  std::string key = prefix;
  for (;;) {
    etcdserverpb::RangeRequest req;
    req.set_key(key);
    req.set_range_end(end);
    req.set_limit(limit);
    if (out.revision != 0) req.set_revision(out.revision);
    etcdserverpb::RangeResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    const auto start = std::chrono::steady_clock::now();
    out.status = kv.Range(&ctx, req, &resp);
    if (page_latency != nullptr && out.status.ok()) {
      page_latency->Record(static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
              .count()));
    }
    if (!out.status.ok()) return out;
    ++out.pages;
    if (out.revision == 0) out.revision = resp.header().revision();
    out.objects += resp.kvs_size();
    for (const auto& kvp : resp.kvs()) {
      out.bytes += kvp.value().size();
      if (each_object) each_object(kvp);
    }
    if (!resp.more() || resp.kvs_size() == 0 || limit == 0) return out;
    key = resp.kvs(resp.kvs_size() - 1).key();
    key.push_back('\0');
  }
}

}  // namespace capstan::bench
