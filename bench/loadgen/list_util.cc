#include "bench/loadgen/list_util.h"

#include <chrono>
#include <future>

#include "bench/loadgen/async_call.h"
#include "bench/loadgen/keys.h"

namespace capstan::bench {

namespace {

// What a page contributes to a list.
struct Page {
  int64_t revision = 0;
  uint64_t objects = 0;
  uint64_t bytes = 0;
  bool more = false;
  std::string last_key;
};

// The pagination loop; fetch(request, &page) makes the Range call.
template <typename Fetch>
ListResult Paginate(const std::string& prefix, int64_t limit, Histogram* page_latency,
                    Timeline* page_timeline, Fetch fetch) {
  ListResult out;
  const std::string end = PrefixEnd(prefix);
  std::string key = prefix;
  for (;;) {
    etcdserverpb::RangeRequest req;
    req.set_key(key);
    req.set_range_end(end);
    req.set_limit(limit);
    if (out.revision != 0) req.set_revision(out.revision);
    Page page;
    const auto start = std::chrono::steady_clock::now();
    out.status = fetch(req, &page);
    if (out.status.ok()) {
      const auto now = std::chrono::steady_clock::now();
      const auto ns = static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - start).count());
      if (page_latency != nullptr) page_latency->Record(ns);
      if (page_timeline != nullptr) page_timeline->Record(now, ns);
    }
    if (!out.status.ok()) return out;
    ++out.pages;
    if (out.revision == 0) out.revision = page.revision;
    out.objects += page.objects;
    out.bytes += page.bytes;
    if (!page.more || page.objects == 0 || limit == 0) return out;
    key = std::move(page.last_key);
    key.push_back('\0');
  }
}

}  // namespace

ListResult ListPrefix(etcdserverpb::KV::Stub& kv, const std::string& prefix, int64_t limit,
                      Histogram* page_latency,
                      const std::function<void(const mvccpb::KeyValue&)>& each_object) {
  return Paginate(prefix, limit, page_latency, nullptr,
                  [&](const etcdserverpb::RangeRequest& req, Page* page) {
    etcdserverpb::RangeResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    grpc::Status s = kv.Range(&ctx, req, &resp);
    if (!s.ok()) return s;
    page->revision = resp.header().revision();
    page->objects = resp.kvs_size();
    page->more = resp.more();
    for (const auto& kvp : resp.kvs()) {
      page->bytes += kvp.value().size();
      if (each_object) each_object(kvp);
    }
    if (resp.kvs_size() > 0) page->last_key = resp.kvs(resp.kvs_size() - 1).key();
    return s;
  });
}

ListResult CountPrefix(const std::shared_ptr<grpc::Channel>& channel, const std::string& prefix,
                       int64_t limit, Histogram* page_latency, Timeline* page_timeline) {
  return Paginate(prefix, limit, page_latency, page_timeline,
                  [&](const etcdserverpb::RangeRequest& req, Page* page) {
    std::promise<grpc::Status> done;
    AsyncRangeSummary(channel, req, [&](const grpc::Status& s, RangeResponseSummary& resp) {
      page->revision = resp.revision;
      page->objects = resp.kvs;
      page->bytes = resp.value_bytes;
      page->more = resp.more;
      page->last_key = std::move(resp.last_key);
      done.set_value(s);
    });
    return done.get_future().get();
  });
}

}  // namespace capstan::bench
