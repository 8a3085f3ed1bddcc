#include "bench/loadgen/response_summary.h"

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "etcdserverpb/rpc.pb.h"

namespace capstan::bench {
namespace {

using etcdserverpb::WatchResponse;

bool ParseBytes(const std::string& bytes, WatchResponseSummary* out) {
  return out->Parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

// What the summary must hold for a response protobuf's own parser reads.
void ExpectSummaryOf(const WatchResponse& r, const WatchResponseSummary& s) {
  EXPECT_EQ(s.watch_id, r.watch_id());
  EXPECT_EQ(s.created, r.created());
  EXPECT_EQ(s.canceled, r.canceled());
  EXPECT_EQ(s.compact_revision, r.compact_revision());
  EXPECT_EQ(s.cancel_reason, r.cancel_reason());
  ASSERT_EQ(s.events.size(), static_cast<size_t>(r.events_size()));
  for (int i = 0; i < r.events_size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(s.events[i].type, r.events(i).type());
    EXPECT_EQ(s.events[i].mod_revision, r.events(i).kv().mod_revision());
    EXPECT_EQ(s.events[i].version, r.events(i).kv().version());
    EXPECT_EQ(s.events[i].has_prev_kv, r.events(i).has_prev_kv());
  }
}

TEST(WatchSummaryTest, ReadsWhatTheFullParserReads) {
  WatchResponse r;
  r.mutable_header()->set_revision(99);
  r.mutable_header()->set_cluster_id(7);
  r.set_watch_id(42);
  for (int i = 0; i < 5; ++i) {
    auto* ev = r.add_events();
    ev->set_type(i % 2 == 0 ? mvccpb::Event::PUT : mvccpb::Event::DELETE);
    ev->mutable_kv()->set_key("key" + std::to_string(i));
    ev->mutable_kv()->set_value(std::string(300, 'v'));
    ev->mutable_kv()->set_create_revision(10);
    ev->mutable_kv()->set_mod_revision(10 + i);
    ev->mutable_kv()->set_version(i + 1);
    ev->mutable_kv()->set_lease(1234567890123);
    if (i >= 3) ev->mutable_prev_kv()->set_mod_revision(9 + i);
  }
  WatchResponseSummary s;
  ASSERT_TRUE(ParseBytes(r.SerializeAsString(), &s));
  ExpectSummaryOf(r, s);
}

TEST(WatchSummaryTest, CreatedCanceledAndNegativeIds) {
  WatchResponse r;
  r.set_watch_id(-1);
  r.set_created(true);
  r.set_canceled(true);
  r.set_compact_revision(17);
  r.set_cancel_reason("etcdserver: mvcc: required revision has been compacted");
  WatchResponseSummary s;
  s.events.emplace_back();  // a reused summary is cleared first
  ASSERT_TRUE(ParseBytes(r.SerializeAsString(), &s));
  ExpectSummaryOf(r, s);
}

TEST(WatchSummaryTest, RepeatedKeyValueMergesAsProtobufDoes) {
  // Two kv fields in one event: protobuf merges the second into the first.
  mvccpb::KeyValue first, second;
  first.set_mod_revision(5);
  first.set_version(3);
  second.set_mod_revision(6);
  std::string event;
  for (const auto* kv : {&first, &second}) {
    const std::string b = kv->SerializeAsString();
    event += static_cast<char>((2 << 3) | 2);
    event += static_cast<char>(b.size());
    event += b;
  }
  std::string response;
  response += static_cast<char>((11 << 3) | 2);
  response += static_cast<char>(event.size());
  response += event;

  WatchResponse full;
  ASSERT_TRUE(full.ParseFromString(response));
  WatchResponseSummary s;
  ASSERT_TRUE(ParseBytes(response, &s));
  ExpectSummaryOf(full, s);
  EXPECT_EQ(s.events[0].mod_revision, 6);
  EXPECT_EQ(s.events[0].version, 3);
}

TEST(WatchSummaryTest, RefusesWhatIsNotAWatchResponse) {
  WatchResponse r;
  r.set_watch_id(1);
  r.add_events()->mutable_kv()->set_mod_revision(3);
  const std::string bytes = r.SerializeAsString();
  WatchResponseSummary s;
  // Cut inside the event.
  EXPECT_FALSE(ParseBytes(bytes.substr(0, bytes.size() - 1), &s));
  // A length running past the end.
  EXPECT_FALSE(ParseBytes(std::string("\x5a\x7f\x10\x01", 4), &s));
  // An end-group tag with no group.
  EXPECT_FALSE(ParseBytes(std::string("\x0c", 1), &s));
  // Field number 0.
  EXPECT_FALSE(ParseBytes(std::string("\x00\x01", 2), &s));
}

etcdserverpb::RangeResponse SomeRange() {
  etcdserverpb::RangeResponse r;
  r.mutable_header()->set_revision(1234);
  r.mutable_header()->set_member_id(99);
  for (int i = 0; i < 4; ++i) {
    auto* kv = r.add_kvs();
    kv->set_key("/registry/pods/ns/p" + std::to_string(i));
    kv->set_value(std::string(100 * (i + 1), 'x'));
    kv->set_mod_revision(1000 + i);
  }
  r.set_more(true);
  r.set_count(40);
  return r;
}

TEST(RangeSummaryTest, CountsKeyValuesAndKeepsTheLastKey) {
  const etcdserverpb::RangeResponse r = SomeRange();
  RangeResponseSummary s;
  s.last_key = "stale";
  const std::string bytes = r.SerializeAsString();
  ASSERT_TRUE(s.Parse(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  EXPECT_EQ(s.revision, 1234);
  EXPECT_TRUE(s.more);
  EXPECT_EQ(s.count, 40);
  EXPECT_EQ(s.kvs, 4u);
  EXPECT_EQ(s.value_bytes, 100u + 200u + 300u + 400u);
  EXPECT_EQ(s.last_key, "/registry/pods/ns/p3");

  etcdserverpb::RangeResponse empty;
  const std::string none = empty.SerializeAsString();
  ASSERT_TRUE(s.Parse(reinterpret_cast<const uint8_t*>(none.data()), none.size()));
  EXPECT_EQ(s.kvs, 0u);
  EXPECT_EQ(s.last_key, "");
  EXPECT_FALSE(s.more);
}

// gRPC hands a message over in slices; the summary reads them in place.
grpc::ByteBuffer InSlices(const std::string& bytes, size_t slice) {
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i < bytes.size(); i += slice) {
    slices.emplace_back(bytes.data() + i, std::min(slice, bytes.size() - i));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST(RangeSummaryTest, DeserializesAcrossSlices) {
  const std::string bytes = SomeRange().SerializeAsString();
  for (size_t slice : {size_t{1}, size_t{7}, size_t{64}, bytes.size()}) {
    SCOPED_TRACE(slice);
    grpc::ByteBuffer buffer = InSlices(bytes, slice);
    RangeResponseSummary s;
    ASSERT_TRUE(grpc::SerializationTraits<RangeResponseSummary>::Deserialize(&buffer, &s).ok());
    EXPECT_EQ(s.kvs, 4u);
    EXPECT_EQ(s.value_bytes, 1000u);
    EXPECT_EQ(s.last_key, "/registry/pods/ns/p3");
  }
  // Cut short: a nested length runs past the message's end.
  grpc::ByteBuffer cut = InSlices(bytes.substr(0, bytes.size() - 5), 16);
  RangeResponseSummary s;
  EXPECT_EQ(grpc::SerializationTraits<RangeResponseSummary>::Deserialize(&cut, &s).error_code(),
            grpc::StatusCode::INTERNAL);
}

TEST(WatchSummaryTest, DeserializesAcrossSlices) {
  WatchResponse r;
  r.set_watch_id(3);
  for (int i = 0; i < 3; ++i) r.add_events()->mutable_kv()->set_mod_revision(50 + i);
  const std::string bytes = r.SerializeAsString();
  grpc::ByteBuffer buffer = InSlices(bytes, 5);
  WatchResponseSummary s;
  ASSERT_TRUE(grpc::SerializationTraits<WatchResponseSummary>::Deserialize(&buffer, &s).ok());
  ExpectSummaryOf(r, s);
  grpc::ByteBuffer cut = InSlices(bytes.substr(0, bytes.size() - 1), 5);
  EXPECT_FALSE(grpc::SerializationTraits<WatchResponseSummary>::Deserialize(&cut, &s).ok());
}

}  // namespace
}  // namespace capstan::bench
