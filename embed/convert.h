// Conversions between libcapstan's public types (include/capstan/capstan.h)
// and the etcd protocol messages and statuses the layers below speak.

#ifndef CAPSTAN_EMBED_CONVERT_H_
#define CAPSTAN_EMBED_CONVERT_H_

#include "absl/status/status.h"
#include "capstan/capstan.h"
#include "etcdserverpb/rpc.pb.h"
#include "mvccpb/kv.pb.h"

namespace capstan::embed {

// etcd's code and exact text for s (server/api/errors.h's table).
Status FromAbsl(const absl::Status& s);

KeyValue FromProto(const mvccpb::KeyValue& kv);
// Decodes an encoded mvccpb.KeyValue record.
KeyValue KeyValueFromRecord(std::string_view record);

etcdserverpb::RangeRequest ToRangeRequest(std::string_view key, const RangeOptions& o);
etcdserverpb::PutRequest ToPutRequest(std::string_view key, std::string_view value,
                                      const PutOptions& o);
etcdserverpb::DeleteRangeRequest ToDeleteRequest(std::string_view key, const DeleteOptions& o);
etcdserverpb::TxnRequest ToTxnRequest(const std::vector<Compare>& compare,
                                      const std::vector<Op>& success,
                                      const std::vector<Op>& failure);

RangeResult FromProto(const etcdserverpb::RangeResponse& r);
PutResult FromProto(const etcdserverpb::PutResponse& r);
DeleteResult FromProto(const etcdserverpb::DeleteRangeResponse& r);
TxnResult FromProto(const etcdserverpb::TxnResponse& r);

}  // namespace capstan::embed

#endif  // CAPSTAN_EMBED_CONVERT_H_
