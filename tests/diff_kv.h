// Request builders and the KV fixture shared by the differential KV tests
// (diff_kv_*.cc, one binary: diff_kv_test).

#ifndef CAPSTAN_TESTS_DIFF_KV_H_
#define CAPSTAN_TESTS_DIFF_KV_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "diff_fixture.h"

namespace capstan::testing {

using namespace etcdserverpb;  // NOLINT: the messages are the vocabulary here
using namespace std::string_literals;

inline RangeRequest Get(const std::string& key, const std::string& end = "") {
  RangeRequest r;
  r.set_key(key);
  r.set_range_end(end);
  return r;
}

inline PutRequest PutR(const std::string& key, const std::string& value, int64_t lease = 0) {
  PutRequest r;
  r.set_key(key);
  r.set_value(value);
  r.set_lease(lease);
  return r;
}

inline DeleteRangeRequest DelR(const std::string& key, const std::string& end = "") {
  DeleteRangeRequest r;
  r.set_key(key);
  r.set_range_end(end);
  return r;
}

inline RequestOp Op(const RangeRequest& r) {
  RequestOp op;
  *op.mutable_request_range() = r;
  return op;
}
inline RequestOp Op(const PutRequest& r) {
  RequestOp op;
  *op.mutable_request_put() = r;
  return op;
}
inline RequestOp Op(const DeleteRangeRequest& r) {
  RequestOp op;
  *op.mutable_request_delete_range() = r;
  return op;
}
inline RequestOp Op(const TxnRequest& r) {
  RequestOp op;
  *op.mutable_request_txn() = r;
  return op;
}

inline Compare Cmp(const std::string& key, Compare::CompareTarget target, Compare::CompareResult result,
            int64_t n) {
  Compare c;
  c.set_key(key);
  c.set_target(target);
  c.set_result(result);
  switch (target) {
    case Compare::VERSION:
      c.set_version(n);
      break;
    case Compare::CREATE:
      c.set_create_revision(n);
      break;
    case Compare::MOD:
      c.set_mod_revision(n);
      break;
    case Compare::LEASE:
      c.set_lease(n);
      break;
    default:
      break;
  }
  return c;
}

inline Compare CmpValue(const std::string& key, Compare::CompareResult result, const std::string& v) {
  Compare c;
  c.set_key(key);
  c.set_target(Compare::VALUE);
  c.set_result(result);
  c.set_value(v);
  return c;
}

inline TxnRequest Txn(std::vector<Compare> cmps, std::vector<RequestOp> then,
               std::vector<RequestOp> otherwise = {}) {
  TxnRequest t;
  for (auto& c : cmps) *t.add_compare() = std::move(c);
  for (auto& o : then) *t.add_success() = std::move(o);
  for (auto& o : otherwise) *t.add_failure() = std::move(o);
  return t;
}

inline const std::string kFromKey = "\0"s;  // range_end meaning "to the end of the keyspace"

class DiffKvTest : public DiffTest {
 protected:
  // Puts K(k) = v for each pair, in order, on both servers.
  void Seed(const std::vector<std::pair<std::string, std::string>>& kvs) {
    for (const auto& [k, v] : kvs) PutBoth(K(k), v);
  }
  // A lease ID for this test (explicit, so that both servers use the same).
  int64_t LeaseId() const {
    return static_cast<int64_t>(std::hash<std::string>()(prefix()) & 0x3fffffffffffULL) | 1;
  }
  // K("") .. end of this test's prefix.
  std::string End() const { return PrefixEnd(prefix()); }
  // All of this test's keys at revision `rev`.
  RangeRequest GetAll(int64_t rev) const {
    RangeRequest r = Get(K(""), End());
    r.set_revision(rev);
    return r;
  }
  // Sends `req` to Capstan only and expects etcd 3.6's answer `code`/`text`:
  // only for reads that the reference etcd 3.5 answers otherwise because 3.6
  // fixed it (see the file comment).
  template <typename Req>
  void ExpectCapstanAnswersAs36(const Req& req, grpc::StatusCode code, const std::string& text) {
    if (BothEtcd()) CAPSTAN_SKIP_IN_MODE("etcd 3.6 behaviour; the reference etcd 3.5 lacks it");
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
    grpc::Status s = CallCapstan(&ctx, req);
    EXPECT_EQ(s.error_code(), code) << "capstan: " << Describe(s);
    EXPECT_EQ(s.error_message(), text);
  }

 private:
  grpc::Status CallCapstan(grpc::ClientContext* ctx, const RangeRequest& r) {
    RangeResponse resp;
    return capstan_stubs().kv->Range(ctx, r, &resp);
  }
  grpc::Status CallCapstan(grpc::ClientContext* ctx, const TxnRequest& r) {
    TxnResponse resp;
    return capstan_stubs().kv->Txn(ctx, r, &resp);
  }
};

}  // namespace capstan::testing

#endif  // CAPSTAN_TESTS_DIFF_KV_H_
