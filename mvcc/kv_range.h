// Range evaluation shared by the read path and by reads inside a txn.
// Internal to mvcc/.

#ifndef CAPSTAN_MVCC_KV_RANGE_H_
#define CAPSTAN_MVCC_KV_RANGE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "etcdserverpb/rpc.pb.h"
#include "index/tree_index.h"
#include "mvcc/kv_codec.h"
#include "mvcc/kv_store.h"

namespace capstan::mvcc {

// Reads the stored records at the given revisions, in order.
using RecordReader =
    std::function<absl::Status(const std::vector<Revision>& revs, std::vector<std::string>* out)>;

// Hands the stored records at the given revisions to visit, in order,
// without copying each (visit must copy what it keeps).
using RecordVisitor = std::function<absl::Status(
    const std::vector<Revision>& revs, absl::FunctionRef<void(std::string_view record)> visit)>;

// Checks what etcd checks before a Range: a key, and known sort enums.
absl::Status ValidateRange(const etcdserverpb::RangeRequest& req);

// Resolves the revision a Range reads at (0 or negative: current) against
// the current and compacted revisions.
absl::Status ResolveReadRevision(int64_t requested, int64_t current, int64_t compact_rev,
                                 int64_t* rev);

// Evaluates req over `index` at revision `rev` with etcd's rules for limit,
// count, more, min/max revision filters, sorting, keys_only and count_only.
// result->rev is set to header_rev. When `stream` is set, a range that
// neither sorts nor filters reads through it instead of `read`, appending each
// record to the response as it comes. count_only and keys_only (unless sorted
// by value) are answered from the index: no record is read, but for a
// keys_only key whose lease the index does not know at `rev` (a historical
// read of a key whose lease changed since), read through `read`.
absl::Status RangeAt(const index::IndexView& index, const etcdserverpb::RangeRequest& req,
                     int64_t rev, int64_t header_rev, const RecordReader& read,
                     RangeResult* result, const RecordVisitor* stream = nullptr);

// The order etcd sorts a Range by `target` in (its kvSortBy... Less), for
// every target but KEY (keys are unique and already in order): x before y.
bool SortsBefore(etcdserverpb::RangeRequest::SortTarget target, const KeyValueView& x,
                 const KeyValueView& y);

// etcd's mkGteRange: a range_end of "\0" means "every key >= key".
bool IsFromKey(const std::string& range_end);

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_KV_RANGE_H_
