// What /version and /metrics report of the cluster version: etcd 3.6's
// "not_decided" and "unknown" (and no etcd_cluster_version series) while a
// Raft group's log has decided no version, the log's version once it has,
// and the build's version on a member without Raft.

#include "server/http/http_endpoints.h"

#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "membership/member.h"
#include "mvcc/kv_store.h"
#include "server/config/version.h"
#include "server/observability/metrics.h"
#include "storage/backend.h"

namespace capstan::server {
namespace {

// A Raft group's view whose cluster version the test sets.
class VersionView final : public membership::RaftView {
 public:
  std::string version;
  uint64_t Leader() const override { return 1; }
  uint64_t Term() const override { return 2; }
  uint64_t CommittedIndex() const override { return 4; }
  uint64_t AppliedIndex() const override { return 4; }
  std::vector<membership::ClusterMember> Members() const override { return {}; }
  std::string ClusterVersion() const override { return version; }
  void TransferLeadership(uint64_t, absl::Time, absl::AnyInvocable<void(absl::Status)> done) override {
    done(absl::UnimplementedError("test view"));
  }
  void ChangeMembership(const membership::MemberChange&, absl::Time, MembersDone done) override {
    done(absl::UnimplementedError("test view"));
  }
};

class HttpEndpointsVersionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("capstan_http_endpoints_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    storage::BackendOptions bo;
    bo.dir = dir_.string();
    bo.sync = false;
    auto backend = storage::Backend::Open(bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    mvcc::KvStoreOptions ko;
    ko.member_id = 1;
    auto store = mvcc::KvStore::Open(ko, std::move(*backend));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    member_.member_id = 1;
    member_.cluster_id = 2;
    member_.raft_term = 2;
  }
  void TearDown() override {
    endpoints_.reset();
    metrics_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Make() {
    metrics_ = std::make_unique<Metrics>(store_.get(), &member_, kEtcdApiVersion);
    endpoints_ = std::make_unique<HttpEndpoints>(
        store_.get(), &member_, Versions{kEtcdApiVersion, kEtcdClusterVersion, kCapstanVersion},
        metrics_.get());
  }
  std::string Version() const {
    auto answer = endpoints_->Answer("GET", "/version", {});
    EXPECT_TRUE(answer.has_value());
    return answer ? answer->body : "";
  }

  std::filesystem::path dir_;
  std::unique_ptr<mvcc::KvStore> store_;
  membership::MemberInfo member_;
  VersionView view_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<HttpEndpoints> endpoints_;
};

TEST_F(HttpEndpointsVersionTest, AGroupWithoutAClusterVersionSaysNotDecided) {
  member_.raft = &view_;
  Make();
  EXPECT_EQ(Version(), absl::StrCat(R"({"etcdserver":")", kEtcdApiVersion,
                                    R"(","etcdcluster":"not_decided","storage":"unknown"})"));
  EXPECT_FALSE(absl::StrContains(endpoints_->RenderMetrics(), "etcd_cluster_version{"));

  view_.version = "3.6.0";
  EXPECT_EQ(Version(), absl::StrCat(R"({"etcdserver":")", kEtcdApiVersion,
                                    R"(","etcdcluster":"3.6.0","storage":")", kEtcdStorageVersion,
                                    R"("})"));
  EXPECT_TRUE(absl::StrContains(endpoints_->RenderMetrics(),
                                "\netcd_cluster_version{cluster_version=\"3.6\"} 1\n"))
      << endpoints_->RenderMetrics();
}

TEST_F(HttpEndpointsVersionTest, AMemberWithoutRaftReportsTheBuildsVersion) {
  Make();
  EXPECT_EQ(Version(), absl::StrCat(R"({"etcdserver":")", kEtcdApiVersion, R"(","etcdcluster":")",
                                    kEtcdClusterVersion, R"(","storage":")", kEtcdStorageVersion,
                                    R"("})"));
  EXPECT_TRUE(absl::StrContains(endpoints_->RenderMetrics(), "\netcd_cluster_version{"));
}

}  // namespace
}  // namespace capstan::server
