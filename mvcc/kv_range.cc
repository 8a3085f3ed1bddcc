#include "mvcc/kv_range.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <limits>
#include <memory>
#include <mutex>

#include "absl/functional/function_ref.h"
#include "mvcc/errors.h"
#include "mvcc/kv_codec.h"
#include "util/go_sort.h"

namespace capstan::mvcc {

using etcdserverpb::RangeRequest;

namespace {
// Records are fetched from the backend in chunks so that a huge Range holds
// one chunk of copies besides the response it builds.
constexpr size_t kFetchChunk = 512;

// The records at revs, read into parts of parallel.part_records by this
// thread and any helper that comes. The shared state outlives the call for
// helpers that start after it.
absl::Status ReadInParts(std::vector<Revision> revs, const RecordVisitor& stream,
                         const ParallelRead& parallel, bool keys_only,
                         std::vector<std::unique_ptr<ByteSink>>* parts) {
  struct Shared {
    std::vector<Revision> revs;
    RecordVisitor stream;
    size_t part_records;
    bool keys_only;
    std::vector<std::unique_ptr<ByteSink>> sinks;
    std::vector<absl::Status> status;
    std::atomic<size_t> next{0};
    std::mutex mu;
    std::condition_variable cv;
    size_t done = 0;  // parts read (GUARDED_BY mu)
  };
  auto shared = std::make_shared<Shared>();
  shared->revs = std::move(revs);
  shared->stream = stream;
  shared->part_records = parallel.part_records;
  shared->keys_only = keys_only;
  const size_t total = shared->revs.size();
  const size_t count = (total + parallel.part_records - 1) / parallel.part_records;
  for (size_t p = 0; p < count; ++p) shared->sinks.push_back(parallel.new_sink());
  shared->status.resize(count);

  auto work = [shared, count] {
    for (;;) {
      const size_t p = shared->next.fetch_add(1);
      if (p >= count) return;
      const size_t begin = p * shared->part_records;
      const size_t end = std::min(shared->revs.size(), begin + shared->part_records);
      ByteSink* sink = shared->sinks[p].get();
      absl::Status s;
      for (size_t i = begin; i < end && s.ok(); i += kFetchChunk) {
        std::vector<Revision> chunk(shared->revs.begin() + i,
                                    shared->revs.begin() + std::min(end, i + kFetchChunk));
        s = shared->stream(chunk, [&](std::string_view record) {
          AppendRecordField(2, record, shared->keys_only, sink);
        });
      }
      std::lock_guard<std::mutex> l(shared->mu);
      shared->status[p] = std::move(s);
      if (++shared->done == count) shared->cv.notify_all();
    }
  };
  for (int h = 0; h < parallel.helpers; ++h) parallel.run(work);
  work();
  std::unique_lock<std::mutex> l(shared->mu);
  shared->cv.wait(l, [&] { return shared->done == count; });
  for (const auto& s : shared->status) {
    if (!s.ok()) return s;
  }
  *parts = std::move(shared->sinks);
  return absl::OkStatus();
}

}  // namespace

bool SortsBefore(RangeRequest::SortTarget target, const KeyValueView& x, const KeyValueView& y) {
  switch (target) {
    case RangeRequest::VERSION: return x.version < y.version;
    case RangeRequest::CREATE: return x.create_revision < y.create_revision;
    case RangeRequest::MOD: return x.mod_revision < y.mod_revision;
    case RangeRequest::VALUE: return x.value < y.value;
    default: return false;
  }
}

bool IsFromKey(const std::string& range_end) { return range_end.size() == 1 && range_end[0] == 0; }

absl::Status ValidateRange(const RangeRequest& req) {
  if (req.key().empty()) return MakeError(Error::kEmptyKey);
  if (!RangeRequest::SortOrder_IsValid(req.sort_order()) ||
      !RangeRequest::SortTarget_IsValid(req.sort_target())) {
    return MakeError(Error::kInvalidSortOption);
  }
  return absl::OkStatus();
}

absl::Status ResolveReadRevision(int64_t requested, int64_t current, int64_t compact_rev,
                                 int64_t* rev) {
  if (requested > current) return MakeError(Error::kFutureRev);
  *rev = requested <= 0 ? current : requested;
  if (*rev < compact_rev) return MakeError(Error::kCompacted);
  return absl::OkStatus();
}

namespace {

// What a Range must do, from the request alone.
struct RangePlan {
  // Min/max revision filters are set.
  bool filtered = false;
  // The order the response is sorted in; NONE when the index's key order is
  // the answer.
  RangeRequest::SortOrder order = RangeRequest::NONE;
  // Keys to take from the index, one more than the limit to tell whether
  // there are more; 0 for all.
  int64_t fetch = 0;
  // Filters and orders on what the index holds for each key (every sort
  // target but the value), so only the records returned are read.
  bool by_index = false;
  // keys_only, not sorted by value: the response is built from the index,
  // reading no record (but the few whose lease the index does not know).
  bool index_only = false;

  bool sorted() const { return order != RangeRequest::NONE; }
};

RangePlan PlanRange(const RangeRequest& req) {
  RangePlan plan;
  plan.filtered = req.min_mod_revision() != 0 || req.max_mod_revision() != 0 ||
                  req.min_create_revision() != 0 || req.max_create_revision() != 0;
  plan.order = req.sort_order();
  if (req.sort_target() == RangeRequest::KEY) {
    // Keys come out of the index in ascending key order: ascending by key
    // is no sort at all (as etcd 3.5 skips it), and the walk may stop at
    // the limit.
    if (plan.order == RangeRequest::ASCEND) plan.order = RangeRequest::NONE;
  } else if (plan.order == RangeRequest::NONE) {
    // Any other target sorts ascending unless told otherwise (as etcd does).
    plan.order = RangeRequest::ASCEND;
  }
  // With filters or a sort order asked for, everything is fetched and cut
  // afterwards. As in etcd, a target other than the key with no order sorts
  // only the keys the limit fetched.
  const bool cut_after = plan.filtered || (plan.sorted() && req.sort_order() != RangeRequest::NONE);
  int64_t fetch = cut_after ? 0 : req.limit();
  if (fetch > 0 && fetch < std::numeric_limits<int64_t>::max()) fetch += 1;
  plan.fetch = std::max<int64_t>(fetch, 0);
  // Filters and every sort target but the value need only what the index
  // holds for each key (the key, its revisions and version): then only the
  // records returned are read, not every record in the range (a lock's
  // waiters ask for the oldest key under a prefix).
  plan.by_index = (plan.filtered || plan.sorted()) && req.sort_target() != RangeRequest::VALUE;
  // A keys_only KeyValue holds the key, its revisions, version and lease,
  // all in the index (as etcd 3.7 answers keys_only from its index, lease
  // included here, as etcd 3.5 returns it); only an order by value needs the
  // values.
  plan.index_only = req.keys_only() && !(plan.sorted() && req.sort_target() == RangeRequest::VALUE);
  return plan;
}

// The keys a Range selects at a revision, in key order.
struct RangeKeys {
  std::vector<Revision> revs;         // each key's record to read
  std::vector<index::RangeHit> hits;  // each key's index entry (by_index, index_only)
  // Each key (index_only), valid while the version of the index read lives.
  std::vector<std::string_view> keys;
  int64_t count = 0;                  // every key in the range, fetched or not
};

RangeKeys CollectKeys(const index::IndexView& index, const RangeRequest& req, int64_t rev,
                      const RangePlan& plan) {
  RangeKeys keys;
  const std::string_view end = req.range_end();
  // The revisions to fetch, then a count of the keys after them, which reads
  // no revision (a page of a paginated list counts every key after it).
  std::string rest;  // the first key not fetched, when the walk stopped early
  index.Range(req.key(), end, rev, [&](std::string_view key, const index::RangeHit& hit) {
    if (plan.fetch > 0 && static_cast<int64_t>(keys.revs.size()) == plan.fetch) {
      rest.assign(key);
      return false;
    }
    keys.revs.push_back(hit.modified);
    if (plan.by_index || plan.index_only) keys.hits.push_back(hit);
    if (plan.index_only) keys.keys.push_back(key);
    return true;
  });
  keys.count = static_cast<int64_t>(keys.revs.size());
  if (!rest.empty()) keys.count += index.Count(rest, end, rev);
  return keys;
}

// Writes a Range's kvs into its result: to the caller's sink if it gave
// one, else into kvs_wire, or in parts on the bulk threads.
class RangeOutput {
 public:
  RangeOutput(const RangeRequest& req, const RecordReader& read, const RecordVisitor* stream,
              RangeResult* result)
      : req_(req), read_(read), stream_(stream), result_(result) {}

  void Emit(std::string_view record) {
    if (result_->kvs_sink != nullptr) {
      AppendRecordField(2, record, req_.keys_only(), result_->kvs_sink);
    } else {
      AppendRecordField(2, record, req_.keys_only(), &result_->kvs_wire);
    }
  }

  // Emits the keys_only KeyValues of the first n keys of `keys` (in the order
  // of `order`, when given) from their index entries. A key whose lease the
  // index does not know (a historical read of a key whose lease changed
  // since) is emitted from its record, value stripped; no other record is
  // read.
  absl::Status EmitFromIndex(const RangeKeys& keys, const std::vector<size_t>* order, size_t n) {
    result_->num_kvs = static_cast<int>(n);
    ByteSink* const sink = result_->kvs_sink;
    std::string chunk_bytes;  // a chunk's bytes, for the sink
    std::string* const out = sink != nullptr ? &chunk_bytes : &result_->kvs_wire;
    std::vector<Revision> unknown;
    std::vector<std::string> records;
    for (size_t i = 0; i < n; i += kFetchChunk) {
      const size_t end = std::min(n, i + kFetchChunk);
      unknown.clear();
      for (size_t p = i; p < end; ++p) {
        const size_t k = order != nullptr ? (*order)[p] : p;
        if (!keys.hits[k].lease_known) unknown.push_back(keys.hits[k].modified);
      }
      records.clear();
      if (!unknown.empty()) {
        if (auto s = read_(unknown, &records); !s.ok()) return s;
      }
      if (i == 0 && sink == nullptr && !keys.keys.empty()) {
        // Size the response once rather than growing it again and again.
        out->reserve(out->size() + n * (keys.keys[0].size() + 24));
      }
      size_t next_record = 0;
      for (size_t p = i; p < end; ++p) {
        const size_t k = order != nullptr ? (*order)[p] : p;
        const index::RangeHit& hit = keys.hits[k];
        if (!hit.lease_known) {
          AppendRecordField(2, records[next_record++], /*strip_value=*/true, out);
          continue;
        }
        KeyValueView kv;
        kv.key = keys.keys[k];
        kv.create_revision = hit.created.main;
        kv.mod_revision = hit.modified.main;
        kv.version = hit.version;
        kv.lease = hit.lease;
        AppendKeysOnlyField(2, kv, out);
      }
      if (sink != nullptr) {
        sink->Append(chunk_bytes);
        chunk_bytes.clear();
      }
    }
    return absl::OkStatus();
  }

  // Reads and emits the records at the first n of `want`: in parts on the
  // bulk threads for a big range, else in chunks through the caller's
  // visitor or the reader.
  absl::Status EmitAt(std::vector<Revision> want, size_t n) {
    result_->num_kvs = static_cast<int>(n);
    const ParallelRead* parallel = result_->parallel;
    if (stream_ != nullptr && parallel != nullptr && parallel->part_records > 0 &&
        n > parallel->part_records) {
      want.resize(n);
      return ReadInParts(std::move(want), *stream_, *parallel, req_.keys_only(),
                         &result_->kvs_parts);
    }
    std::vector<std::string> records;
    for (size_t i = 0; i < n; i += kFetchChunk) {
      std::vector<Revision> chunk(want.begin() + i, want.begin() + std::min(n, i + kFetchChunk));
      if (stream_ != nullptr) {
        auto s = (*stream_)(chunk, [this](std::string_view record) { Emit(record); });
        if (!s.ok()) return s;
      } else {
        if (auto s = read_(chunk, &records); !s.ok()) return s;
        for (const auto& r : records) Emit(r);
      }
      if (i == 0 && n > chunk.size() && result_->kvs_sink == nullptr) {
        // Size the response once from the first chunk rather than growing
        // (and copying) it again and again on a huge range.
        result_->kvs_wire.reserve(result_->kvs_wire.size() / chunk.size() * n * 9 / 8);
      }
    }
    return absl::OkStatus();
  }

 private:
  const RangeRequest& req_;
  const RecordReader& read_;
  const RecordVisitor* const stream_;
  RangeResult* const result_;
};

// The positions in keys.revs that pass req's filters, in the order req
// sorts them. fields(i) gives the fields of the key at revs[i].
std::vector<size_t> FilterAndSort(const RangeRequest& req, const RangePlan& plan, size_t keys,
                                  absl::FunctionRef<KeyValueView(size_t)> fields) {
  std::vector<size_t> items;
  items.reserve(keys);
  for (size_t i = 0; i < keys; ++i) {
    const KeyValueView kv = fields(i);
    if (req.max_mod_revision() != 0 && kv.mod_revision > req.max_mod_revision()) continue;
    if (req.min_mod_revision() != 0 && kv.mod_revision < req.min_mod_revision()) continue;
    if (req.max_create_revision() != 0 && kv.create_revision > req.max_create_revision()) continue;
    if (req.min_create_revision() != 0 && kv.create_revision < req.min_create_revision()) continue;
    items.push_back(i);
  }
  if (!plan.sorted()) return items;
  // etcd sorts with Go's sort.Sort, which is not stable: GoSort leaves equal
  // elements in the same order it does (the items are the same, in the same
  // order, whether their fields come from the index or records).
  auto less = [&fields, target = req.sort_target()](size_t a, size_t b) {
    // Positions are in key order, and keys are unique.
    if (target == RangeRequest::KEY) return a < b;
    return SortsBefore(target, fields(a), fields(b));
  };
  auto swap = [&items](int i, int j) { std::swap(items[i], items[j]); };
  const int n = static_cast<int>(items.size());
  if (plan.order == RangeRequest::ASCEND) {
    util::GoSort(n, [&](int i, int j) { return less(items[i], items[j]); }, swap);
  } else {
    util::GoSort(n, [&](int i, int j) { return less(items[j], items[i]); }, swap);
  }
  return items;
}

// How many of n results a Range returns under its limit; sets more.
size_t ApplyLimit(int64_t limit, size_t n, RangeResult* result) {
  if (limit > 0 && static_cast<int64_t>(n) > limit) {
    result->more = true;
    return static_cast<size_t>(limit);
  }
  return n;
}

}  // namespace

absl::Status RangeAt(const index::IndexView& index, const RangeRequest& req, int64_t rev,
                     int64_t header_rev, const RecordReader& read, RangeResult* result,
                     const RecordVisitor* stream) {
  ByteSink* const sink = result->kvs_sink;
  const ParallelRead* const parallel = result->parallel;
  *result = RangeResult();
  result->kvs_sink = sink;
  result->parallel = parallel;
  result->rev = header_rev;
  if (req.count_only()) {
    result->count = index.Count(req.key(), req.range_end(), rev);
    return absl::OkStatus();
  }

  const RangePlan plan = PlanRange(req);
  RangeKeys keys = CollectKeys(index, req, rev, plan);
  result->count = keys.count;
  RangeOutput output(req, read, stream, result);
  if (!plan.filtered && !plan.sorted()) {
    const size_t n = ApplyLimit(req.limit(), keys.revs.size(), result);
    if (plan.index_only) return output.EmitFromIndex(keys, nullptr, n);
    return output.EmitAt(std::move(keys.revs), n);
  }

  if (plan.by_index) {
    // Filter and order on the index's fields, then read only the records
    // returned, as an unsorted range reads its.
    std::vector<size_t> items =
        FilterAndSort(req, plan, keys.revs.size(), [&keys](size_t i) {
          KeyValueView kv;
          kv.create_revision = keys.hits[i].created.main;
          kv.mod_revision = keys.hits[i].modified.main;
          kv.version = keys.hits[i].version;
          return kv;
        });
    const size_t n = ApplyLimit(req.limit(), items.size(), result);
    if (plan.index_only) return output.EmitFromIndex(keys, &items, n);
    std::vector<Revision> chosen(n);
    for (size_t i = 0; i < n; ++i) chosen[i] = keys.revs[items[i]];
    return output.EmitAt(std::move(chosen), n);
  }

  // Sorted by value: every record is read and decoded to order them.
  std::vector<std::string> records;
  if (auto s = read(keys.revs, &records); !s.ok()) return s;
  std::vector<KeyValueView> decoded(records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    if (!DecodeKeyValue(records[i], &decoded[i])) {
      return absl::DataLossError("stored record is not a KeyValue");
    }
  }
  std::vector<size_t> items =
      FilterAndSort(req, plan, decoded.size(), [&decoded](size_t i) { return decoded[i]; });
  const size_t n = ApplyLimit(req.limit(), items.size(), result);
  result->num_kvs = static_cast<int>(n);
  for (size_t i = 0; i < n; ++i) output.Emit(records[items[i]]);
  return absl::OkStatus();
}

}  // namespace capstan::mvcc
