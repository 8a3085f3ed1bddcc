// Fault injection below RocksDB: a KvStore on a backend whose file system
// fails writes, fsyncs or fills the disk, or loses the data it never synced.
//
// What must hold (docs/RELIABILITY.md):
//   - a failed write or fsync stops the store for good (fail-stop): the
//     failing write and every later one get an error, a log line says why,
//     /health turns unhealthy, reads keep serving the last durable state;
//   - a full disk (ENOSPC) answers writes with etcd's "database space
//     exceeded" and raises the NOSPACE alarm; reads keep working;
//   - a crash that drops every unsynced byte loses only writes that were
//     never acknowledged.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "mvcc/errors.h"
#include "mvcc/kv_store.h"
#include "server/api/errors.h"
#include "server/http/http_endpoints.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "storage/backend.h"
#include "storage/testing/fault_injection_fs.h"

namespace capstan {
namespace {

using storage::FaultInjectionFs;
using Fault = FaultInjectionFs::Fault;

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

class FaultInjectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("capstan_fault_", ::getpid(), "_", counter_++);
    std::filesystem::remove_all(dir_);
    fs_ = FaultInjectionFs::Create();
    log_ = std::make_shared<std::ostringstream>();
    spdlog::default_logger()->sinks().push_back(
        std::make_shared<spdlog::sinks::ostream_sink_mt>(*log_));
  }
  void TearDown() override {
    store_.reset();
    spdlog::default_logger()->sinks().pop_back();
    std::filesystem::remove_all(dir_);
  }

  void Open(bool sync = true) {
    storage::BackendOptions bo;
    bo.dir = dir_.string();
    bo.sync = sync;
    bo.file_system = fs_;
    bo.block_cache_bytes = 8 << 20;
    auto backend = storage::Backend::Open(bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    mvcc::KvStoreOptions ko;
    ko.member_id = 0x1234;
    auto store = mvcc::KvStore::Open(ko, std::move(*backend));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  // The crash: nothing more reaches the disk, the process goes away, and the
  // file system keeps only what was synced.
  void CrashAndReopen(bool sync = true) {
    fs_->SetFault(Fault::kInactive);
    store_.reset();
    ASSERT_TRUE(fs_->DropUnsyncedData().ok());
    fs_->SetFault(Fault::kNone);
    Open(sync);
  }

  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value) {
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value(value);
    auto resp = store_->Put(req);
    if (!resp.ok()) return resp.status();
    return resp->header().revision();
  }

  // key -> (mod revision, value) of every live key.
  std::map<std::string, std::pair<int64_t, std::string>> All() {
    etcdserverpb::RangeRequest req;
    req.set_key(std::string(1, '\0'));
    req.set_range_end(std::string(1, '\0'));
    mvcc::RangeResult result;
    auto s = store_->Range(req, &result);
    EXPECT_TRUE(s.ok()) << s;
    etcdserverpb::RangeResponse resp;
    EXPECT_TRUE(resp.ParseFromString(result.kvs_wire));
    std::map<std::string, std::pair<int64_t, std::string>> out;
    for (const auto& kv : resp.kvs()) out[kv.key()] = {kv.mod_revision(), kv.value()};
    return out;
  }

  // GET path from the endpoints the server would serve: {status, body}.
  std::pair<int, std::string> Get(const std::string& path) {
    membership::MemberInfo member;
    server::HttpEndpoints endpoints(store_.get(), &member, {"3.5.0", "3.5.0", "test"});
    const int port = FreePort();
    EXPECT_TRUE(endpoints.Listen("127.0.0.1", port).ok());
    httplib::Client client("127.0.0.1", port);
    for (int i = 0; i < 100; ++i) {
      if (auto res = client.Get(path)) return {res->status, res->body};
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return {0, ""};
  }
  std::pair<int, std::string> Health() { return Get("/health"); }

  static inline int counter_ = 0;
  std::filesystem::path dir_;
  std::shared_ptr<FaultInjectionFs> fs_;
  std::shared_ptr<std::ostringstream> log_;
  std::unique_ptr<mvcc::KvStore> store_;
};



class FailStopTest : public FaultInjectionTest,
                     public ::testing::WithParamInterface<Fault> {};

TEST_P(FailStopTest, FailingWriteAndEveryLaterWriteAreRefused) {
  Open();
  ASSERT_EQ(Put("a", "1").value_or(-1), 2);
  EXPECT_EQ(Health().first, 200);

  fs_->SetFault(GetParam());
  auto failed = Put("b", "2");
  ASSERT_FALSE(failed.ok());
  EXPECT_GT(fs_->InjectedFailures(), 0);
  const grpc::Status wire = server::ToGrpcStatus(failed.status());
  EXPECT_EQ(wire.error_code(), grpc::UNAVAILABLE);
  EXPECT_EQ(wire.error_message(), "etcdserver: storage failed; writes are no longer accepted");

  // The disk works again; the store does not trust it any more.
  fs_->SetFault(Fault::kNone);
  for (int i = 0; i < 3; ++i) {
    auto later = Put("c", "3");
    ASSERT_FALSE(later.ok());
    EXPECT_EQ(server::ToGrpcStatus(later.status()).error_code(), grpc::UNAVAILABLE);
  }
  etcdserverpb::DeleteRangeRequest del;
  del.set_key("a");
  EXPECT_FALSE(store_->DeleteRange(del).ok());
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(60);
  EXPECT_FALSE(store_->LeaseGrant(grant).ok());

  // Reads serve the last durable state: the failed write is not visible.
  auto all = All();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all["a"].second, "1");
  EXPECT_EQ(store_->Rev(), 2);
  EXPECT_FALSE(store_->StorageFailure().ok());

  auto [status, body] = Health();
  EXPECT_EQ(status, 503);
  EXPECT_EQ(body, "{\"health\":\"false\",\"reason\":\"STORAGE FAILED\"}\n");
  EXPECT_NE(log_->str().find("storage failure: a group commit failed"), std::string::npos)
      << log_->str();
  EXPECT_NE(log_->str().find("stops accepting writes"), std::string::npos);

  // After a crash only the acknowledged write is there; a restart recovers.
  CrashAndReopen();
  all = All();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all["a"], std::make_pair(int64_t{2}, std::string("1")));
  EXPECT_TRUE(store_->StorageFailure().ok());
  EXPECT_EQ(Put("d", "4").value_or(-1), 3);
  EXPECT_EQ(Health().first, 200);
}

// A member whose storage failed is neither ready nor live: its read checks
// fail with the storage error, so that a liveness probe restarts it (etcd's
// process exits on a failed backend commit); a restart recovers.
TEST_P(FailStopTest, FailedStorageFailsReadyzAndLivez) {
  Open();
  ASSERT_TRUE(Put("a", "1").ok());
  EXPECT_EQ(Get("/readyz"), std::make_pair(200, std::string("ok\n")));
  EXPECT_EQ(Get("/livez"), std::make_pair(200, std::string("ok\n")));

  fs_->SetFault(GetParam());
  ASSERT_FALSE(Put("b", "2").ok());
  fs_->SetFault(Fault::kNone);
  const std::string failed = "failed: etcdserver: storage failed; writes are no longer accepted\n";
  EXPECT_EQ(Get("/readyz"),
            std::make_pair(503, "[+]data_corruption ok\n[-]serializable_read " + failed +
                                    "[-]linearizable_read " + failed + "[+]non_learner ok\n\n"));
  EXPECT_EQ(Get("/livez"), std::make_pair(503, "[-]serializable_read " + failed + "\n"));
  EXPECT_EQ(Get("/readyz/linearizable_read"),
            std::make_pair(503, "[-]linearizable_read " + failed + "\n"));
  EXPECT_EQ(Get("/readyz?exclude=serializable_read&exclude=linearizable_read"),
            std::make_pair(200, std::string("ok\n")));
  EXPECT_NE(log_->str().find("Health check error"), std::string::npos) << log_->str();

  CrashAndReopen();
  EXPECT_EQ(Get("/readyz"), std::make_pair(200, std::string("ok\n")));
  EXPECT_EQ(Get("/livez"), std::make_pair(200, std::string("ok\n")));
}

INSTANTIATE_TEST_SUITE_P(Faults, FailStopTest,
                         ::testing::Values(Fault::kWriteError, Fault::kSyncError),
                         [](const auto& info) {
                           return info.param == Fault::kWriteError ? "WriteError" : "SyncError";
                         });

TEST_F(FaultInjectionTest, FullDiskRaisesNoSpaceAndReadsGoOn) {
  Open();
  ASSERT_TRUE(Put("a", "1").ok());
  fs_->SetFault(Fault::kNoSpace);
  auto failed = Put("b", std::string(1000, 'x'));
  ASSERT_FALSE(failed.ok());
  grpc::Status wire = server::ToGrpcStatus(failed.status());
  EXPECT_EQ(wire.error_code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_EQ(wire.error_message(), "etcdserver: mvcc: database space exceeded");

  // Space comes back; writes still answer NOSPACE until a restart.
  fs_->SetFault(Fault::kNone);
  wire = server::ToGrpcStatus(Put("c", "3").status());
  EXPECT_EQ(wire.error_message(), "etcdserver: mvcc: database space exceeded");

  ASSERT_EQ(store_->Alarms().size(), 1u);
  EXPECT_EQ(store_->Alarms()[0].alarm(), etcdserverpb::NOSPACE);
  EXPECT_EQ(store_->Alarms()[0].memberid(), 0x1234u);
  EXPECT_TRUE(store_->NoSpace());
  // Alarm list still answers through the committer.
  etcdserverpb::AlarmRequest list;
  list.set_action(etcdserverpb::AlarmRequest::GET);
  etcdserverpb::AlarmResponse listed;
  std::promise<absl::Status> done;
  store_->Submit({mvcc::AlarmOp{&list, &listed},
                  [&done](absl::Status s) { done.set_value(s); }});
  ASSERT_TRUE(done.get_future().get().ok());
  ASSERT_EQ(listed.alarms_size(), 1);
  EXPECT_EQ(listed.alarms(0).alarm(), etcdserverpb::NOSPACE);

  EXPECT_EQ(All().size(), 1u);
  auto [status, body] = Health();
  EXPECT_EQ(status, 503);
  EXPECT_EQ(body, "{\"health\":\"false\",\"reason\":\"ALARM NOSPACE\"}\n");
  EXPECT_NE(log_->str().find("NOSPACE"), std::string::npos) << log_->str();
}

// Writers race a crash that drops every unsynced byte. Afterwards the store
// holds exactly the acknowledged writes, at their revisions.
TEST_F(FaultInjectionTest, CrashDropsOnlyUnacknowledgedWrites) {
  Open();
  std::map<std::string, int64_t> acked;  // key -> revision
  std::mt19937 rng(42);
  for (int round = 0; round < 5; ++round) {
    constexpr int kWriters = 4;
    std::vector<std::map<std::string, int64_t>> mine(kWriters);
    std::vector<std::thread> writers;
    for (int w = 0; w < kWriters; ++w) {
      writers.emplace_back([&, w] {
        for (int i = 0;; ++i) {
          const std::string key = absl::StrCat("r", round, "/w", w, "/", i);
          auto rev = Put(key, key);
          if (!rev.ok()) break;  // the crash
          mine[w][key] = *rev;
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50 + rng() % 100));
    fs_->SetFault(Fault::kInactive);
    // Writers run into the crash and stop at their first error.
    for (auto& t : writers) t.join();
    for (const auto& m : mine) acked.insert(m.begin(), m.end());
    EXPECT_GT(fs_->InjectedFailures(), 0);
    CrashAndReopen();

    auto all = All();
    int64_t max_rev = 1;
    for (const auto& [key, rev] : acked) {
      auto it = all.find(key);
      ASSERT_NE(it, all.end()) << "acknowledged " << key << " at " << rev << " lost";
      EXPECT_EQ(it->second.first, rev) << key;
      max_rev = std::max(max_rev, rev);
    }
    // Nothing unacknowledged survived, and revisions continue from the last
    // acknowledged one.
    EXPECT_EQ(all.size(), acked.size());
    EXPECT_EQ(store_->Rev(), max_rev);
  }
  EXPECT_GT(acked.size(), 20u);
}

// The check above can fail: without fsync (--unsafe-no-fsync) the same crash
// loses acknowledged writes.
TEST_F(FaultInjectionTest, CrashWithoutFsyncLosesAcknowledgedWrites) {
  Open(/*sync=*/false);
  std::vector<std::string> acked;
  for (int i = 0; i < 50; ++i) {
    const std::string key = absl::StrCat("k", i);
    ASSERT_TRUE(Put(key, key).ok());
    acked.push_back(key);
  }
  EXPECT_GT(fs_->UnsyncedBytes(), 0);
  CrashAndReopen(/*sync=*/false);
  EXPECT_LT(All().size(), acked.size());
}

}  // namespace
}  // namespace capstan
