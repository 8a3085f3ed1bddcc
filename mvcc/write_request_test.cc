#include "mvcc/write_request.h"

#include "gtest/gtest.h"

namespace capstan::mvcc {
namespace {

TEST(WriteRequestTest, ClientWritesBecomeTheirInternalRaftRequestField) {
  etcdserverpb::PutRequest put;
  put.set_key("k");
  put.set_value("v");
  put.set_lease(7);
  etcdserverpb::PutResponse put_resp;
  etcdserverpb::InternalRaftRequest entry;
  ASSERT_TRUE(ToInternalRaftRequest(PutOp{&put, &put_resp}, &entry));
  ASSERT_TRUE(entry.has_put());
  EXPECT_EQ(entry.put().SerializeAsString(), put.SerializeAsString());
  EXPECT_FALSE(entry.has_txn());

  etcdserverpb::TxnRequest txn;
  txn.add_success()->mutable_request_delete_range()->set_key("d");
  etcdserverpb::TxnResponse txn_resp;
  etcdserverpb::InternalRaftRequest txn_entry;
  ASSERT_TRUE(ToInternalRaftRequest(TxnOp{&txn, &txn_resp}, &txn_entry));
  EXPECT_EQ(txn_entry.txn().success(0).request_delete_range().key(), "d");

  etcdserverpb::CompactionRequest compact;
  compact.set_revision(5);
  compact.set_physical(true);
  etcdserverpb::CompactionResponse compact_resp;
  etcdserverpb::InternalRaftRequest compact_entry;
  ASSERT_TRUE(ToInternalRaftRequest(CompactOp{&compact, &compact_resp}, &compact_entry));
  EXPECT_EQ(compact_entry.compaction().revision(), 5);
  EXPECT_TRUE(compact_entry.compaction().physical());

  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(30);
  etcdserverpb::LeaseGrantResponse grant_resp;
  etcdserverpb::InternalRaftRequest grant_entry;
  ASSERT_TRUE(ToInternalRaftRequest(LeaseGrantOp{&grant, &grant_resp}, &grant_entry));
  EXPECT_EQ(grant_entry.lease_grant().ttl(), 30);

  // The entry round-trips through its wire form, as it will through a log.
  etcdserverpb::InternalRaftRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(entry.SerializeAsString()));
  EXPECT_EQ(parsed.put().value(), "v");
}

TEST(WriteRequestTest, TheStoresOwnStepsNeverLeaveTheMember) {
  etcdserverpb::InternalRaftRequest entry;
  entry.mutable_put()->set_key("untouched");
  EXPECT_FALSE(ToInternalRaftRequest(InternalOp{[] {}}, &entry));
  EXPECT_FALSE(ToInternalRaftRequest(
      CustomOp{[](storage::WriteBatch*) { return absl::OkStatus(); }}, &entry));
  EXPECT_EQ(entry.put().key(), "untouched");
  EXPECT_EQ(RequestBytes(InternalOp{[] {}}), 0u);
}

TEST(WriteRequestTest, RequestBytesIsTheEncodedRequest) {
  etcdserverpb::PutRequest put;
  put.set_key("key");
  put.set_value(std::string(1000, 'x'));
  etcdserverpb::PutResponse resp;
  EXPECT_EQ(RequestBytes(PutOp{&put, &resp}), put.ByteSizeLong());
  etcdserverpb::AlarmRequest alarm;
  alarm.set_action(etcdserverpb::AlarmRequest::GET);
  etcdserverpb::AlarmResponse alarm_resp;
  EXPECT_EQ(RequestBytes(AlarmOp{&alarm, &alarm_resp}), alarm.ByteSizeLong());
}

}  // namespace
}  // namespace capstan::mvcc
