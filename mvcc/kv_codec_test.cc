#include "mvcc/kv_codec.h"

#include "etcdserverpb/rpc.pb.h"
#include "gtest/gtest.h"
#include "mvcc/revision_key.h"
#include "mvccpb/kv.pb.h"

namespace capstan::mvcc {
namespace {

TEST(KvCodecTest, EncodingMatchesProtobuf) {
  const std::string value(200, 'v');
  KeyValueView kv;
  kv.key = "foo";
  kv.create_revision = 5;
  kv.mod_revision = 300;
  kv.version = 2;
  kv.value = value;
  kv.lease = 0x694d77aa9e38260fLL;
  mvccpb::KeyValue pb;
  pb.set_key("foo");
  pb.set_create_revision(5);
  pb.set_mod_revision(300);
  pb.set_version(2);
  pb.set_value(std::string(200, 'v'));
  pb.set_lease(0x694d77aa9e38260fLL);
  EXPECT_EQ(EncodeKeyValue(kv), pb.SerializeAsString());

  KeyValueView back;
  const std::string encoded = EncodeKeyValue(kv);
  ASSERT_TRUE(DecodeKeyValue(encoded, &back));
  EXPECT_EQ(back.key, "foo");
  EXPECT_EQ(back.create_revision, 5);
  EXPECT_EQ(back.mod_revision, 300);
  EXPECT_EQ(back.version, 2);
  EXPECT_EQ(back.value, std::string(200, 'v'));
  EXPECT_EQ(back.lease, 0x694d77aa9e38260fLL);
}

TEST(KvCodecTest, ZeroFieldsAreOmitted) {
  KeyValueView kv;
  kv.key = "k";
  mvccpb::KeyValue pb;
  pb.set_key("k");
  EXPECT_EQ(EncodeKeyValue(kv), pb.SerializeAsString());
}

TEST(KvCodecTest, RecordFieldsFormARangeResponse) {
  std::string wire;
  KeyValueView a{"a", 1, 2, 1, "va", 0};
  KeyValueView b{"b", 3, 3, 1, "vb", 7};
  AppendRecordField(2, EncodeKeyValue(a), false, &wire);
  AppendRecordField(2, EncodeKeyValue(b), /*strip_value=*/true, &wire);
  etcdserverpb::RangeResponse resp;
  ASSERT_TRUE(resp.ParseFromString(wire));
  ASSERT_EQ(resp.kvs_size(), 2);
  EXPECT_EQ(resp.kvs(0).key(), "a");
  EXPECT_EQ(resp.kvs(0).value(), "va");
  EXPECT_EQ(resp.kvs(1).key(), "b");
  EXPECT_EQ(resp.kvs(1).value(), "");
  EXPECT_EQ(resp.kvs(1).lease(), 7);
}

TEST(KvCodecTest, MalformedRecordsAreRejected) {
  KeyValueView kv;
  EXPECT_FALSE(DecodeKeyValue(std::string("\x0a\x05" "ab", 4), &kv));
  EXPECT_FALSE(DecodeKeyValue(std::string("\x10", 1), &kv));
  EXPECT_FALSE(DecodeKeyValue(std::string("\x0f", 1), &kv));
}

TEST(RevisionKeyTest, RoundTripAndOrder) {
  std::string a = RevisionKey({5, 0});
  std::string b = RevisionKey({5, 1});
  std::string c = RevisionKey({256, 0}, /*tombstone=*/true);
  EXPECT_EQ(a.size(), kRevisionKeySize);
  EXPECT_EQ(c.size(), kRevisionKeySize + 1);
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  Revision r;
  bool tomb;
  ASSERT_TRUE(ParseRevisionKey(c, &r, &tomb));
  EXPECT_EQ(r.main, 256);
  EXPECT_EQ(r.sub, 0);
  EXPECT_TRUE(tomb);
  EXPECT_FALSE(ParseRevisionKey("short", &r, &tomb));
}

}  // namespace
}  // namespace capstan::mvcc
