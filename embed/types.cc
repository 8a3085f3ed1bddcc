// The helpers of libcapstan's plain value types.

#include "absl/strings/str_cat.h"
#include "capstan/capstan.h"
#include "mvcc/key_range.h"
#include "server/server.h"

namespace capstan {
namespace {

const char* CodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kCancelled: return "CANCELLED";
    case StatusCode::kUnknown: return "UNKNOWN";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kOutOfRange: return "OUT_OF_RANGE";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

Compare MakeCompare(std::string key, Compare::Target target, Compare::Result r,
                    int64_t number = 0) {
  Compare c;
  c.key = std::move(key);
  c.target = target;
  c.result = r;
  c.number = number;
  return c;
}

}  // namespace

std::string Status::ToString() const {
  if (ok()) return "OK";
  return absl::StrCat(CodeName(code_), ": ", message_);
}

std::string PrefixEnd(std::string_view prefix) { return mvcc::PrefixEnd(prefix); }

Compare Compare::Value(std::string key, Result r, std::string value) {
  Compare c = MakeCompare(std::move(key), Target::kValue, r);
  c.value = std::move(value);
  return c;
}

Compare Compare::Version(std::string key, Result r, int64_t version) {
  return MakeCompare(std::move(key), Target::kVersion, r, version);
}

Compare Compare::CreateRevision(std::string key, Result r, int64_t rev) {
  return MakeCompare(std::move(key), Target::kCreate, r, rev);
}

Compare Compare::ModRevision(std::string key, Result r, int64_t rev) {
  return MakeCompare(std::move(key), Target::kMod, r, rev);
}

Compare Compare::Lease(std::string key, Result r, int64_t lease) {
  return MakeCompare(std::move(key), Target::kLease, r, lease);
}

Op Op::Range(std::string key, RangeOptions options) {
  Op op;
  op.type = Type::kRange;
  op.key = std::move(key);
  op.range = std::move(options);
  return op;
}

Op Op::Put(std::string key, std::string value, PutOptions options) {
  Op op;
  op.type = Type::kPut;
  op.key = std::move(key);
  op.value = std::move(value);
  op.put = options;
  return op;
}

Op Op::Delete(std::string key, DeleteOptions options) {
  Op op;
  op.type = Type::kDelete;
  op.key = std::move(key);
  op.del = std::move(options);
  return op;
}

Op Op::Txn(std::vector<Compare> compare, std::vector<Op> success, std::vector<Op> failure) {
  Op op;
  op.type = Type::kTxn;
  op.txn_compare = std::move(compare);
  op.txn_success = std::move(success);
  op.txn_failure = std::move(failure);
  return op;
}

const char* Version() { return server::kCapstanVersion; }
const char* EtcdApiVersion() { return server::kEtcdApiVersion; }

}  // namespace capstan
