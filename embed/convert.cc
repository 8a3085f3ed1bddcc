#include "embed/convert.h"

#include "server/api/errors.h"

namespace capstan::embed {

Status FromAbsl(const absl::Status& s) {
  if (s.ok()) return Status();
  grpc::Status g = server::ToGrpcStatus(s);
  return Status(static_cast<StatusCode>(g.error_code()), g.error_message());
}

KeyValue FromProto(const mvccpb::KeyValue& kv) {
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

KeyValue KeyValueFromRecord(std::string_view record) {
  mvccpb::KeyValue kv;
  kv.ParseFromArray(record.data(), static_cast<int>(record.size()));
  return FromProto(kv);
}

namespace {

void FillCompare(const Compare& c, etcdserverpb::Compare* out) {
  out->set_key(c.key);
  out->set_range_end(c.range_end);
  out->set_result(static_cast<etcdserverpb::Compare_CompareResult>(c.result));
  out->set_target(static_cast<etcdserverpb::Compare_CompareTarget>(c.target));
  switch (c.target) {
    case Compare::Target::kVersion: out->set_version(c.number); break;
    case Compare::Target::kCreate: out->set_create_revision(c.number); break;
    case Compare::Target::kMod: out->set_mod_revision(c.number); break;
    case Compare::Target::kValue: out->set_value(c.value); break;
    case Compare::Target::kLease: out->set_lease(c.number); break;
  }
}

void FillTxn(const std::vector<Compare>& compare, const std::vector<Op>& success,
             const std::vector<Op>& failure, etcdserverpb::TxnRequest* out);

void FillOp(const Op& op, etcdserverpb::RequestOp* out) {
  switch (op.type) {
    case Op::Type::kRange: *out->mutable_request_range() = ToRangeRequest(op.key, op.range); break;
    case Op::Type::kPut: *out->mutable_request_put() = ToPutRequest(op.key, op.value, op.put); break;
    case Op::Type::kDelete:
      *out->mutable_request_delete_range() = ToDeleteRequest(op.key, op.del);
      break;
    case Op::Type::kTxn:
      FillTxn(op.txn_compare, op.txn_success, op.txn_failure, out->mutable_request_txn());
      break;
  }
}

void FillTxn(const std::vector<Compare>& compare, const std::vector<Op>& success,
             const std::vector<Op>& failure, etcdserverpb::TxnRequest* out) {
  for (const auto& c : compare) FillCompare(c, out->add_compare());
  for (const auto& op : success) FillOp(op, out->add_success());
  for (const auto& op : failure) FillOp(op, out->add_failure());
}

OpResult FromResponseOp(const etcdserverpb::ResponseOp& r) {
  OpResult out;
  switch (r.response_case()) {
    case etcdserverpb::ResponseOp::kResponseRange:
      out.type = Op::Type::kRange;
      out.range = FromProto(r.response_range());
      break;
    case etcdserverpb::ResponseOp::kResponsePut:
      out.type = Op::Type::kPut;
      out.put = FromProto(r.response_put());
      break;
    case etcdserverpb::ResponseOp::kResponseDeleteRange:
      out.type = Op::Type::kDelete;
      out.del = FromProto(r.response_delete_range());
      break;
    case etcdserverpb::ResponseOp::kResponseTxn: {
      out.type = Op::Type::kTxn;
      TxnResult t = FromProto(r.response_txn());
      out.txn_succeeded = t.succeeded;
      out.txn_results = std::move(t.results);
      break;
    }
    case etcdserverpb::ResponseOp::RESPONSE_NOT_SET: break;
  }
  return out;
}

}  // namespace

etcdserverpb::RangeRequest ToRangeRequest(std::string_view key, const RangeOptions& o) {
  etcdserverpb::RangeRequest req;
  req.set_key(std::string(key));
  req.set_range_end(o.range_end);
  req.set_limit(o.limit);
  req.set_revision(o.revision);
  req.set_sort_order(static_cast<etcdserverpb::RangeRequest_SortOrder>(o.sort_order));
  req.set_sort_target(static_cast<etcdserverpb::RangeRequest_SortTarget>(o.sort_target));
  req.set_serializable(o.serializable);
  req.set_keys_only(o.keys_only);
  req.set_count_only(o.count_only);
  req.set_min_mod_revision(o.min_mod_revision);
  req.set_max_mod_revision(o.max_mod_revision);
  req.set_min_create_revision(o.min_create_revision);
  req.set_max_create_revision(o.max_create_revision);
  return req;
}

etcdserverpb::PutRequest ToPutRequest(std::string_view key, std::string_view value,
                                      const PutOptions& o) {
  etcdserverpb::PutRequest req;
  req.set_key(std::string(key));
  req.set_value(std::string(value));
  req.set_lease(o.lease);
  req.set_prev_kv(o.prev_kv);
  req.set_ignore_value(o.ignore_value);
  req.set_ignore_lease(o.ignore_lease);
  return req;
}

etcdserverpb::DeleteRangeRequest ToDeleteRequest(std::string_view key, const DeleteOptions& o) {
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(std::string(key));
  req.set_range_end(o.range_end);
  req.set_prev_kv(o.prev_kv);
  return req;
}

etcdserverpb::TxnRequest ToTxnRequest(const std::vector<Compare>& compare,
                                      const std::vector<Op>& success,
                                      const std::vector<Op>& failure) {
  etcdserverpb::TxnRequest req;
  FillTxn(compare, success, failure, &req);
  return req;
}

RangeResult FromProto(const etcdserverpb::RangeResponse& r) {
  RangeResult out;
  out.revision = r.header().revision();
  out.kvs.reserve(r.kvs_size());
  for (const auto& kv : r.kvs()) out.kvs.push_back(FromProto(kv));
  out.more = r.more();
  out.count = r.count();
  return out;
}

PutResult FromProto(const etcdserverpb::PutResponse& r) {
  PutResult out;
  out.revision = r.header().revision();
  if (r.has_prev_kv()) out.prev_kv = FromProto(r.prev_kv());
  return out;
}

DeleteResult FromProto(const etcdserverpb::DeleteRangeResponse& r) {
  DeleteResult out;
  out.revision = r.header().revision();
  out.deleted = r.deleted();
  for (const auto& kv : r.prev_kvs()) out.prev_kvs.push_back(FromProto(kv));
  return out;
}

TxnResult FromProto(const etcdserverpb::TxnResponse& r) {
  TxnResult out;
  out.revision = r.header().revision();
  out.succeeded = r.succeeded();
  for (const auto& op : r.responses()) out.results.push_back(FromResponseOp(op));
  return out;
}

}  // namespace capstan::embed
