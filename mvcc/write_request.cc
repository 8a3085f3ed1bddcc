#include "mvcc/write_request.h"

#include <type_traits>

namespace capstan::mvcc {

namespace {

template <typename>
inline constexpr bool kIsClientOp = false;
template <typename Request, typename Response>
inline constexpr bool kIsClientOp<ClientOp<Request, Response>> = true;

}  // namespace

bool ToInternalRaftRequest(const WriteOp& op, etcdserverpb::InternalRaftRequest* out) {
  return std::visit(
      [out](const auto& o) {
        using T = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<T, PutOp>) {
          *out->mutable_put() = *o.request;
        } else if constexpr (std::is_same_v<T, DeleteRangeOp>) {
          *out->mutable_delete_range() = *o.request;
        } else if constexpr (std::is_same_v<T, TxnOp>) {
          *out->mutable_txn() = *o.request;
        } else if constexpr (std::is_same_v<T, CompactOp>) {
          *out->mutable_compaction() = *o.request;
        } else if constexpr (std::is_same_v<T, LeaseGrantOp>) {
          *out->mutable_lease_grant() = *o.request;
        } else if constexpr (std::is_same_v<T, LeaseRevokeOp>) {
          *out->mutable_lease_revoke() = *o.request;
        } else if constexpr (std::is_same_v<T, AlarmOp>) {
          *out->mutable_alarm() = *o.request;
        } else {
          static_assert(!kIsClientOp<T>, "every client write has its InternalRaftRequest field");
          return false;
        }
        return true;
      },
      op);
}

size_t RequestBytes(const WriteOp& op) {
  return std::visit(
      [](const auto& o) -> size_t {
        using T = std::decay_t<decltype(o)>;
        if constexpr (kIsClientOp<T>) {
          return o.request->ByteSizeLong();
        } else {
          return 0;
        }
      },
      op);
}

}  // namespace capstan::mvcc
