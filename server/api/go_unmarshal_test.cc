// GoUnmarshalError against the errors etcd's gogo-generated Unmarshal
// methods return (etcdserver/etcdserverpb/rpc.pb.go in etcd 3.4), worked
// out from that code. tests/bad_input_test.cc sends the same kinds of bytes
// to a real etcd.

#include "server/api/go_unmarshal.h"

#include <string>

#include "etcdserverpb/rpc.pb.h"
#include "gtest/gtest.h"

namespace capstan::server {
namespace {

using etcdserverpb::LeaseKeepAliveRequest;
using etcdserverpb::PutRequest;
using etcdserverpb::RangeRequest;
using etcdserverpb::TxnRequest;
using etcdserverpb::WatchRequest;

template <typename M>
std::string ErrorOf(const std::string& bytes) {
  return GoUnmarshalError(*M::descriptor(), bytes);
}

std::string B(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s.push_back(static_cast<char>(b));
  return s;
}

TEST(GoUnmarshalTest, WellFormedMessagesDecode) {
  RangeRequest range;
  range.set_key("a");
  range.set_range_end("b");
  range.set_limit(-1);
  range.set_revision(int64_t{1} << 62);
  range.set_sort_target(RangeRequest::VALUE);
  EXPECT_EQ(ErrorOf<RangeRequest>(range.SerializeAsString()), "");
  EXPECT_EQ(ErrorOf<RangeRequest>(""), "");
  TxnRequest txn;
  txn.add_compare()->set_key("k");
  txn.add_success()->mutable_request_txn()->add_failure()->mutable_request_put()->set_key("p");
  EXPECT_EQ(ErrorOf<TxnRequest>(txn.SerializeAsString()), "");
  WatchRequest watch;
  watch.mutable_create_request()->add_filters(etcdserverpb::WatchCreateRequest::NOPUT);
  watch.mutable_create_request()->add_filters(etcdserverpb::WatchCreateRequest::NODELETE);
  EXPECT_EQ(ErrorOf<WatchRequest>(watch.SerializeAsString()), "");  // packed
  // Filters one by one (not packed) decode too.
  EXPECT_EQ(ErrorOf<WatchRequest>(B({0x0a, 0x04, 0x28, 0x00, 0x28, 0x01})), "");
}

TEST(GoUnmarshalTest, TruncatedInput) {
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0xff, 0xff, 0xff})), "unexpected EOF");   // tag
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0x0a, 0x10, 0x61})), "unexpected EOF");   // key
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0x18, 0x80})), "unexpected EOF");         // limit
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0x0a})), "unexpected EOF");               // length
  // Unknown fixed64 field 100 with 3 of its 8 bytes.
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0xa1, 0x06, 1, 2, 3})), "unexpected EOF");
}

TEST(GoUnmarshalTest, Overflow) {
  std::string eleven(11, '\xff');
  EXPECT_EQ(ErrorOf<RangeRequest>(eleven), "proto: integer overflow");
  std::string limit = B({0x18});  // limit, 11 bytes
  limit.append(10, '\x80');
  limit.push_back('\x01');
  EXPECT_EQ(ErrorOf<RangeRequest>(limit), "proto: integer overflow");
}

TEST(GoUnmarshalTest, NegativeLength) {
  // Key with a length of 2^63 (a negative Go int).
  std::string bytes = B({0x0a}) + std::string(9, '\x80') + B({0x01});
  EXPECT_EQ(ErrorOf<RangeRequest>(bytes), "proto: negative length found during unmarshaling");
}

TEST(GoUnmarshalTest, TagsGogoRefuses) {
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0x00})), "proto: RangeRequest: illegal tag 0 (wire type 0)");
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0x02, 0x00})),
            "proto: RangeRequest: illegal tag 0 (wire type 2)");
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0x0c})),
            "proto: RangeRequest: wiretype end group for non-group");
  // An unknown field 100 of wire type 7.
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0xa7, 0x06})), "proto: illegal wireType 7");
}

TEST(GoUnmarshalTest, KnownFieldsWithAnotherWireType) {
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0x08, 0x01})), "proto: wrong wireType = 0 for field Key");
  EXPECT_EQ(ErrorOf<LeaseKeepAliveRequest>(B({0x0a, 0x10, 0x61})),
            "proto: wrong wireType = 2 for field ID");
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0x22, 0x00})),
            "proto: wrong wireType = 2 for field Revision");
  EXPECT_EQ(ErrorOf<PutRequest>(B({0x22, 0x00})), "proto: wrong wireType = 2 for field PrevKv");
  EXPECT_EQ(ErrorOf<PutRequest>(B({0x28, 0x01, 0x35, 0, 0, 0, 0})),
            "proto: wrong wireType = 5 for field IgnoreLease");
  // A RequestOp's oneof field, and an error inside a nested message.
  EXPECT_EQ(ErrorOf<TxnRequest>(B({0x12, 0x02, 0x10, 0x01})),
            "proto: wrong wireType = 0 for field RequestPut");
  EXPECT_EQ(ErrorOf<TxnRequest>(B({0x12, 0x04, 0x12, 0x02, 0x08, 0x01})),
            "proto: wrong wireType = 0 for field Key");
}

TEST(GoUnmarshalTest, UnknownFieldsAreSkippedGroupsIncluded) {
  // Field 100: varint, fixed32, bytes, and a group holding a varint and a
  // nested group.
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0xa0, 0x06, 0x05})), "");
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0xa5, 0x06, 1, 2, 3, 4})), "");
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0xa2, 0x06, 0x02, 'x', 'y'})), "");
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0xa3, 0x06, 0x08, 0x01, 0x13, 0x14, 0xa4, 0x06})), "");
  // A group that never ends.
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0xa3, 0x06, 0x08, 0x01})), "unexpected EOF");
  // Unknown bytes longer than the message.
  EXPECT_EQ(ErrorOf<RangeRequest>(B({0xa2, 0x06, 0x05, 'x'})), "unexpected EOF");
}

TEST(GoUnmarshalTest, DecodeAsEtcdRefusesWhatGogoRefuses) {
  RangeRequest range;
  EXPECT_EQ(DecodeAsEtcd(B({0x0a, 0x01, 'a'}), &range), "");
  EXPECT_EQ(range.key(), "a");
  EXPECT_EQ(DecodeAsEtcd(B({0x08, 0x01}), &range), "proto: wrong wireType = 0 for field Key");
}

TEST(GoUnmarshalTest, DecodeAsEtcdTakesWhatGogoTakes) {
  // An unknown group 133 closed by the end tag of field 582: gogo does not
  // compare the two, C++ protobuf does. Then keys = true.
  etcdserverpb::LeaseTimeToLiveRequest ttl;
  EXPECT_EQ(DecodeAsEtcd(B({0x08, 0x07, 0xab, 0x08, 0xb4, 0x24, 0x10, 0x01}), &ttl), "");
  EXPECT_EQ(ttl.id(), 7);
  EXPECT_TRUE(ttl.keys());
  // The same inside a nested message: a txn's put keeps its key and value.
  TxnRequest txn;
  std::string put = B({0x0a, 0x01, 'k', 0xab, 0x08, 0xb4, 0x24, 0x12, 0x01, 'v'});
  std::string op = B({0x12, static_cast<int>(put.size())}) + put;
  EXPECT_EQ(DecodeAsEtcd(B({0x12, static_cast<int>(op.size())}) + op, &txn), "");
  ASSERT_EQ(txn.success_size(), 1);
  EXPECT_EQ(txn.success(0).request_put().key(), "k");
  EXPECT_EQ(txn.success(0).request_put().value(), "v");
  // A tag Go reads as field 1 (its field number keeps the low 32 bits).
  RangeRequest range;
  EXPECT_EQ(DecodeAsEtcd(B({0x8a, 0x80, 0x80, 0x80, 0x80, 0x01, 0x01, 'z'}), &range), "");
  EXPECT_EQ(range.key(), "z");
  // Names and passwords that are not UTF-8, with the other fields as sent.
  etcdserverpb::AuthUserAddRequest user;
  EXPECT_EQ(DecodeAsEtcd(B({0x0a, 0x04, 'b', 0xe9, 'l', 'a', 0x12, 0x01, 0xe9, 0x1a, 0x02, 0x08,
                            0x01, 0x22, 0x01, 'h'}),
                         &user),
            "");
  EXPECT_EQ(user.name(), "b\xe9la");
  EXPECT_EQ(user.password(), "\xe9");
  EXPECT_TRUE(user.options().no_password());
  EXPECT_EQ(user.hashedpassword(), "h");
  // Scalars of several kinds, packed ones included, decoded as C++ protobuf
  // decodes them (the group makes C++ protobuf refuse the whole message).
  WatchRequest watch;
  auto* create = watch.mutable_create_request();
  create->set_key("\xff");
  create->set_start_revision(-5);
  create->set_progress_notify(true);
  create->add_filters(etcdserverpb::WatchCreateRequest::NODELETE);
  create->add_filters(static_cast<etcdserverpb::WatchCreateRequest::FilterType>(-3));
  create->set_watch_id(int64_t{1} << 40);
  const std::string bytes = watch.SerializeAsString();
  WatchRequest decoded;
  EXPECT_FALSE(decoded.ParseFromString(bytes + B({0xab, 0x08, 0xb4, 0x24})));
  EXPECT_EQ(DecodeAsEtcd(bytes + B({0xab, 0x08, 0xb4, 0x24}), &decoded), "");
  EXPECT_EQ(decoded.SerializeAsString(), bytes);
}

// A message that C++ protobuf refuses is decoded by the walker alone; the
// result matches C++ protobuf's own decoding of the same fields.
TEST(GoUnmarshalTest, WalkerDecodesLikeCppProtobuf) {
  etcdserverpb::AuthRoleGrantPermissionRequest grant;
  grant.set_name("r\xe9");
  grant.mutable_perm()->set_permtype(authpb::Permission::READWRITE);
  grant.mutable_perm()->set_key("/a/");
  grant.mutable_perm()->set_range_end("/a0");
  const std::string bytes = grant.SerializeAsString();
  etcdserverpb::AuthRoleGrantPermissionRequest decoded;
  EXPECT_FALSE(decoded.ParseFromString(bytes));  // not UTF-8
  EXPECT_EQ(DecodeAsEtcd(bytes, &decoded), "");
  EXPECT_EQ(decoded.name(), "r\xe9");
  EXPECT_EQ(decoded.perm().permtype(), authpb::Permission::READWRITE);
  EXPECT_EQ(decoded.perm().key(), "/a/");
  EXPECT_EQ(decoded.perm().range_end(), "/a0");
}

// C++ protobuf's nesting limit (100 messages) is the one difference left
// in what decodes: a txn in a txn is two levels (TxnRequest, RequestOp).
TEST(GoUnmarshalTest, NestingBeyondCppsLimitIsRefused) {
  auto nested = [](int depth) {
    TxnRequest txn;
    TxnRequest* inner = &txn;
    for (int i = 0; i < depth; ++i) inner = inner->add_success()->mutable_request_txn();
    return txn.SerializeAsString();
  };
  TxnRequest txn;
  EXPECT_EQ(GoUnmarshalError(*TxnRequest::descriptor(), nested(60)), "");
  EXPECT_EQ(DecodeAsEtcd(nested(49), &txn), "");
  EXPECT_EQ(DecodeAsEtcd(nested(60), &txn), "proto: cannot parse invalid wire-format data");
}

}  // namespace
}  // namespace capstan::server
