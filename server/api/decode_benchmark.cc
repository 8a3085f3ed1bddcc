// What decoding a request as etcd does costs (server/api/go_unmarshal.h): the
// gogo-style walk plus C++ protobuf's parse, against the parse alone, for
// a kube-apiserver-sized put and a txn of eight guarded puts.

#include <string>

#include "benchmark/benchmark.h"
#include "etcdserverpb/rpc.pb.h"
#include "server/api/go_unmarshal.h"

namespace {

std::string PutBytes() {
  etcdserverpb::PutRequest put;
  put.set_key("/registry/pods/default/pod-000123");
  put.set_value(std::string(256, 'v'));
  put.set_lease(0x1234);
  return put.SerializeAsString();
}

std::string TxnBytes() {
  etcdserverpb::TxnRequest txn;
  for (int i = 0; i < 8; ++i) {
    const std::string key = "/registry/pods/default/pod-" + std::to_string(i);
    auto* cmp = txn.add_compare();
    cmp->set_key(key);
    cmp->set_target(etcdserverpb::Compare::MOD);
    cmp->set_mod_revision(100 + i);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(std::string(256, 'v'));
    txn.add_failure()->mutable_request_range()->set_key(key);
  }
  return txn.SerializeAsString();
}

template <typename Request>
void Parse(benchmark::State& state, const std::string& bytes) {
  for (auto _ : state) {
    Request r;
    benchmark::DoNotOptimize(r.ParseFromString(bytes));
  }
}

template <typename Request>
void Decode(benchmark::State& state, const std::string& bytes) {
  for (auto _ : state) {
    Request r;
    benchmark::DoNotOptimize(capstan::server::DecodeAsEtcd(bytes, &r));
  }
}

void BM_ParsePut(benchmark::State& state) { Parse<etcdserverpb::PutRequest>(state, PutBytes()); }
void BM_DecodePut(benchmark::State& state) { Decode<etcdserverpb::PutRequest>(state, PutBytes()); }
void BM_ParseTxn8(benchmark::State& state) { Parse<etcdserverpb::TxnRequest>(state, TxnBytes()); }
void BM_DecodeTxn8(benchmark::State& state) {
  Decode<etcdserverpb::TxnRequest>(state, TxnBytes());
}

BENCHMARK(BM_ParsePut);
BENCHMARK(BM_DecodePut);
BENCHMARK(BM_ParseTxn8);
BENCHMARK(BM_DecodeTxn8);

}  // namespace

