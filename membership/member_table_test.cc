#include "membership/member_table.h"

#include <filesystem>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace capstan::membership {
namespace {

ClusterMember Member(uint64_t id, std::string url, bool learner = false) {
  ClusterMember m;
  m.id = id;
  m.peer_urls = {std::move(url)};
  m.is_learner = learner;
  return m;
}

MemberChange Add(uint64_t id, std::string url, bool learner = false) {
  MemberChange c;
  c.type = learner ? ChangeType::kAddLearnerNode : ChangeType::kAddNode;
  c.id = id;
  c.member = Member(id, std::move(url), learner);
  return c;
}

TEST(MemberTableTest, MemberJsonIsEtcds) {
  ClusterMember m = Member(0x8e9e05c52164694dULL, "http://localhost:2380");
  // etcd: json.Marshal(membership.Member), empty attributes left out.
  EXPECT_EQ(MemberJson(m), R"({"id":10276657743932975437,"peerURLs":["http://localhost:2380"]})");
  m.name = "default";
  m.client_urls = {"http://localhost:2379"};
  m.is_learner = true;
  const std::string json = MemberJson(m);
  EXPECT_EQ(json, R"({"id":10276657743932975437,"peerURLs":["http://localhost:2380"],)"
                  R"("isLearner":true,"name":"default","clientURLs":["http://localhost:2379"]})");
  auto back = ParseMemberJson(json);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->id, m.id);
  EXPECT_EQ(back->name, "default");
  EXPECT_EQ(back->client_urls, m.client_urls);
  EXPECT_TRUE(back->is_learner);
  // Go's escaping.
  m.name = "a<b>&\"c";
  EXPECT_TRUE(absl::StrContains(MemberJson(m), R"("name":"a\u003cb\u003e\u0026\"c")")) << MemberJson(m);
  EXPECT_EQ(ParseMemberJson(MemberJson(m))->name, m.name);
  EXPECT_FALSE(ParseMemberJson("{").ok());
  EXPECT_FALSE(ParseMemberJson(R"({"id":"x"})").ok());
}

TEST(MemberTableTest, PromotionContextRoundTrips) {
  MemberChange c;
  c.type = ChangeType::kAddNode;
  c.id = 7;
  c.member = Member(7, "http://a:2380");
  c.is_promote = true;
  const std::string ctx = ChangeContextJson(c);
  // etcd 3.5's promotion context carries the ID alone; an addition's is the
  // plain member record.
  EXPECT_EQ(ctx, R"({"id":7,"peerURLs":null,"isPromote":true})");
  auto back = ParseChange(0, 7, ctx);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->is_promote);
  EXPECT_TRUE(back->member.peer_urls.empty());
  c.is_promote = false;
  EXPECT_EQ(ChangeContextJson(c), R"({"id":7,"peerURLs":["http://a:2380"]})");
  auto added = ParseChange(0, 7, ChangeContextJson(c));
  ASSERT_TRUE(added.ok());
  EXPECT_FALSE(added->is_promote);
  EXPECT_EQ(added->member.peer_urls, c.member.peer_urls);
  // The node ID and the context's must agree.
  EXPECT_FALSE(ParseChange(0, 8, ctx).ok());
  EXPECT_FALSE(ParseChange(9, 7, ctx).ok());
  auto removal = ParseChange(1, 7, "");
  ASSERT_TRUE(removal.ok());
  EXPECT_EQ(removal->type, ChangeType::kRemoveNode);
}

TEST(MemberTableTest, ValidatesAsEtcd) {
  MemberTable t;
  ASSERT_TRUE(t.Validate(Add(1, "http://a"), 1).ok());
  t.Apply(Add(1, "http://a"));
  EXPECT_EQ(ErrorOf(t.Validate(Add(1, "http://b"), 1)), Error::kIdExists);
  EXPECT_EQ(ErrorOf(t.Validate(Add(2, "http://a"), 1)), Error::kPeerUrlExists);
  ASSERT_TRUE(t.Validate(Add(2, "http://b", true), 1).ok());
  t.Apply(Add(2, "http://b", true));
  EXPECT_EQ(t.LearnerCount(), 1u);
  EXPECT_EQ(ErrorOf(t.Validate(Add(3, "http://c", true), 1)), Error::kTooManyLearners);
  EXPECT_TRUE(t.Validate(Add(3, "http://c", true), 2).ok());

  MemberChange promote;
  promote.type = ChangeType::kAddNode;
  promote.is_promote = true;
  promote.id = 1;
  EXPECT_EQ(ErrorOf(t.Validate(promote, 1)), Error::kMemberNotLearner);
  promote.id = 9;
  EXPECT_EQ(ErrorOf(t.Validate(promote, 1)), Error::kIdNotFound);
  promote.id = 2;
  ASSERT_TRUE(t.Validate(promote, 1).ok());
  t.Apply(promote);
  EXPECT_FALSE(t.Find(2)->is_learner);
  EXPECT_EQ(t.VoterCount(), 2u);

  MemberChange update;
  update.type = ChangeType::kUpdateNode;
  update.id = 2;
  update.member = Member(2, "http://a");
  EXPECT_EQ(ErrorOf(t.Validate(update, 1)), Error::kPeerUrlExists);
  update.member = Member(2, "http://b2");
  ASSERT_TRUE(t.Validate(update, 1).ok());
  t.Apply(update);
  EXPECT_EQ(t.Find(2)->peer_urls, std::vector<std::string>{"http://b2"});

  MemberChange remove;
  remove.type = ChangeType::kRemoveNode;
  remove.id = 2;
  ASSERT_TRUE(t.Validate(remove, 1).ok());
  t.Apply(remove);
  EXPECT_EQ(t.Find(2), nullptr);
  EXPECT_TRUE(t.IsRemoved(2));
  EXPECT_EQ(ErrorOf(t.Validate(remove, 1)), Error::kIdRemoved);
  EXPECT_EQ(ErrorOf(t.Validate(Add(2, "http://z"), 1)), Error::kIdRemoved);
  remove.id = 5;
  EXPECT_EQ(ErrorOf(t.Validate(remove, 1)), Error::kIdNotFound);
  // The peer URL of a removed member is free again.
  EXPECT_TRUE(t.Validate(Add(6, "http://b2"), 1).ok());
}

TEST(MemberTableTest, RecordsRoundTripThroughTheStore) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("member_table_test." + std::to_string(getpid())))
          .string();
  std::filesystem::remove_all(dir);
  storage::BackendOptions o;
  o.dir = dir;
  auto backend = storage::Backend::Open(o);
  ASSERT_TRUE(backend.ok()) << backend.status();
  MemberTable t;
  t.Apply(Add(0xa1, "http://a"));
  t.Apply(Add(0xb2, "http://b", true));
  t.SetAttributes(0xa1, "m0", {"http://c:2379"});
  MemberChange remove;
  remove.type = ChangeType::kRemoveNode;
  remove.id = 0xb2;
  t.Apply(remove);
  storage::WriteBatch batch;
  t.WriteRecord(0xa1, &batch);
  t.WriteRecord(0xb2, &batch);
  MemberTable::WriteRejection(42, &batch);
  ASSERT_TRUE((*backend)->Write(&batch).ok());
  auto loaded = MemberTable::Load(backend->get());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->Members().size(), 1u);
  EXPECT_EQ(loaded->Find(0xa1)->name, "m0");
  EXPECT_EQ(loaded->Find(0xa1)->client_urls, std::vector<std::string>{"http://c:2379"});
  EXPECT_TRUE(loaded->IsRemoved(0xb2));
  EXPECT_FALSE(loaded->IsRemoved(0xa1));
  EXPECT_TRUE(loaded->WasRejected(42));
  EXPECT_FALSE(loaded->WasRejected(41));
  backend->reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace capstan::membership
