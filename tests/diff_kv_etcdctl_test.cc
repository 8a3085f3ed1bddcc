// Differential tests of the KV operations through etcdctl (the installed
// 3.4 client): get/put/del/txn/compaction, JSON and simple output, errors.
// etcdctl's stdout, stderr (without its JSON retry logs) and exit status
// must be the same for both servers.

#include <string>
#include <vector>

#include "diff_kv.h"

namespace capstan::testing {
namespace {

class DiffEtcdctlTest : public DiffKvTest {
 protected:
  // Runs etcdctl on both, compares, and returns the pair.
  EtcdctlPair Ctl(const std::vector<std::string>& args, const std::string& stdin_data = "",
                  bool json = true) {
    EtcdctlPair p = Etcdctl(args, stdin_data, json);
    EXPECT_SAME_CTL(p);
    return p;
  }
  static bool Ok(const EtcdctlPair& p) {
    return p.etcd.raw.exit.exited && p.etcd.raw.exit.exit_code == 0;
  }
};

TEST_F(DiffEtcdctlTest, PutJson) {
  auto p = Ctl({"put", K("a"), "1"});
  EXPECT_TRUE(Ok(p)) << p.etcd.raw.err;
}

TEST_F(DiffEtcdctlTest, PutSimple) {
  auto p = Ctl({"put", K("a"), "1"}, "", /*json=*/false);
  EXPECT_EQ(p.etcd.out, "OK\n");
}

TEST_F(DiffEtcdctlTest, PutPrevKv) {
  PutBoth(K("a"), "old");
  Ctl({"put", K("a"), "new", "--prev-kv"});
  Ctl({"put", K("a"), "newer", "--prev-kv"}, "", false);
}

TEST_F(DiffEtcdctlTest, PutValueFromStdin) {
  Ctl({"put", K("a")}, "from stdin");
  Ctl({"get", K("a")});
}

TEST_F(DiffEtcdctlTest, PutUnknownLease) {
  auto p = Ctl({"put", K("a"), "1", "--lease=7e5d"});
  EXPECT_FALSE(Ok(p));
  EXPECT_EQ(p.etcd.err, "Error: etcdserver: requested lease not found\n");
}

TEST_F(DiffEtcdctlTest, PutIgnoreValueMissingKey) {
  auto p = Ctl({"put", K("a"), "--ignore-value"});
  EXPECT_FALSE(Ok(p));
}

TEST_F(DiffEtcdctlTest, PutIgnoreValueExisting) {
  PutBoth(K("a"), "kept");
  Ctl({"put", K("a"), "--ignore-value"});
  Ctl({"get", K("a")});
}

TEST_F(DiffEtcdctlTest, PutIgnoreLeaseMissingKey) {
  Ctl({"put", K("a"), "v", "--ignore-lease"});
}

TEST_F(DiffEtcdctlTest, GetSingle) {
  PutBoth(K("a"), "1");
  Ctl({"get", K("a")});
}

TEST_F(DiffEtcdctlTest, GetSimpleOutput) {
  Seed({{"a", "1"}, {"b", "2"}});
  Ctl({"get", K(""), "--prefix"}, "", false);
}

TEST_F(DiffEtcdctlTest, GetPrintValueOnly) {
  Seed({{"a", "1"}, {"b", "2"}});
  Ctl({"get", K(""), "--prefix", "--print-value-only"}, "", false);
}

TEST_F(DiffEtcdctlTest, GetMissing) {
  Ctl({"get", K("missing")});
  Ctl({"get", K("missing")}, "", false);
}

TEST_F(DiffEtcdctlTest, GetRange) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  Ctl({"get", K("a"), K("c")});
}

TEST_F(DiffEtcdctlTest, GetPrefix) {
  Seed({{"p/1", "1"}, {"p/2", "2"}, {"q", "3"}});
  Ctl({"get", K("p/"), "--prefix"});
}

TEST_F(DiffEtcdctlTest, GetFromKey) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  Ctl({"get", K("b"), "--from-key"});
}

TEST_F(DiffEtcdctlTest, GetLimit) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  Ctl({"get", K(""), "--prefix", "--limit=2"});
}

TEST_F(DiffEtcdctlTest, GetRev) {
  const int64_t rev = PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  Ctl({"get", K("a"), "--rev=" + std::to_string(rev)});
}

TEST_F(DiffEtcdctlTest, GetFutureRev) {
  const int64_t rev = PutBoth(K("a"), "1");
  auto p = Ctl({"get", K("a"), "--rev=" + std::to_string(rev + 5)});
  EXPECT_FALSE(Ok(p));
}

TEST_F(DiffEtcdctlTest, GetSortByModifyDescend) {
  Seed({{"b", "1"}, {"a", "2"}, {"c", "3"}, {"b", "4"}});
  Ctl({"get", K(""), "--prefix", "--sort-by=MODIFY", "--order=DESCEND"});
}

TEST_F(DiffEtcdctlTest, GetSortByValue) {
  Seed({{"b", "1"}, {"a", "3"}, {"c", "2"}});
  Ctl({"get", K(""), "--prefix", "--sort-by=VALUE"});
}

TEST_F(DiffEtcdctlTest, GetSortByCreateAscendLimit) {
  Seed({{"c", "1"}, {"a", "2"}, {"b", "3"}});
  Ctl({"get", K(""), "--prefix", "--sort-by=CREATE", "--order=ASCEND", "--limit=2"});
}

TEST_F(DiffEtcdctlTest, GetSortByVersion) {
  Seed({{"a", "1"}, {"a", "2"}, {"b", "1"}});
  Ctl({"get", K(""), "--prefix", "--sort-by=VERSION", "--order=DESCEND"});
}

TEST_F(DiffEtcdctlTest, GetKeysOnly) {
  Seed({{"a", "1"}, {"b", "2"}});
  Ctl({"get", K(""), "--prefix", "--keys-only"});
}

TEST_F(DiffEtcdctlTest, GetCountOnly) {
  Seed({{"a", "1"}, {"b", "2"}});
  Ctl({"get", K(""), "--prefix", "--count-only"});
}

TEST_F(DiffEtcdctlTest, GetSerializable) {
  Seed({{"a", "1"}});
  Ctl({"get", K("a"), "--consistency=s"});
}

TEST_F(DiffEtcdctlTest, GetModRevisionFilters) {
  const int64_t r1 = PutBoth(K("a"), "1");
  PutBoth(K("b"), "2");
  Ctl({"get", K(""), "--prefix", "--min-mod-revision=" + std::to_string(r1 + 1)});
  Ctl({"get", K(""), "--prefix", "--max-create-revision=" + std::to_string(r1)});
}

TEST_F(DiffEtcdctlTest, DelSingle) {
  PutBoth(K("a"), "1");
  auto p = Ctl({"del", K("a")});
  EXPECT_TRUE(Ok(p));
}

TEST_F(DiffEtcdctlTest, DelSimpleOutput) {
  Seed({{"a", "1"}, {"b", "2"}});
  Ctl({"del", K(""), "--prefix"}, "", false);
}

TEST_F(DiffEtcdctlTest, DelMissing) {
  Ctl({"del", K("missing")});
}

TEST_F(DiffEtcdctlTest, DelPrefixPrevKv) {
  Seed({{"p/1", "1"}, {"p/2", "2"}, {"q", "3"}});
  Ctl({"del", K("p/"), "--prefix", "--prev-kv"});
}

TEST_F(DiffEtcdctlTest, DelRange) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  Ctl({"del", K("a"), K("c")});
  Ctl({"get", K(""), "--prefix"});
}

TEST_F(DiffEtcdctlTest, DelFromKey) {
  Seed({{"a", "1"}, {"b", "2"}, {"c", "3"}});
  Ctl({"del", K("b"), "--from-key"});
}

TEST_F(DiffEtcdctlTest, TxnThen) {
  PutBoth(K("a"), "1");
  const std::string script = "value(\"" + K("a") + "\") = \"1\"\n\n" +  //
                             "put " + K("a") + " 2\nget " + K("a") + "\n\n" +  //
                             "put " + K("b") + " else\n\n";
  auto p = Ctl({"txn", "--interactive=false"}, script);
  EXPECT_TRUE(Ok(p)) << p.etcd.raw.err;
}

TEST_F(DiffEtcdctlTest, TxnElse) {
  const std::string script = "mod(\"" + K("a") + "\") > \"0\"\n\n" +  //
                             "put " + K("a") + " then\n\n" +            //
                             "put " + K("b") + " else\ndel " + K("a") + "\n\n";
  Ctl({"txn", "--interactive=false"}, script);
  Ctl({"txn", "--interactive=false"}, script, false);
}

TEST_F(DiffEtcdctlTest, TxnCompares) {
  Seed({{"a", "1"}, {"a", "2"}});
  const std::string script = "version(\"" + K("a") + "\") = \"2\"\n" +  //
                             "create(\"" + K("a") + "\") > \"0\"\n" +   //
                             "value(\"" + K("a") + "\") != \"x\"\n\n" +  //
                             "get " + K("a") + " --prefix\n\n\n";
  Ctl({"txn", "--interactive=false"}, script);
}

TEST_F(DiffEtcdctlTest, TxnDuplicateKey) {
  const std::string script = "\nput " + K("a") + " 1\nput " + K("a") + " 2\n\n\n";
  auto p = Ctl({"txn", "--interactive=false"}, script);
  EXPECT_FALSE(Ok(p));
}

TEST_F(DiffEtcdctlTest, TxnSimpleOutput) {
  Seed({{"a", "1"}});
  const std::string script = "\nget " + K("a") + "\nput " + K("b") + " 2\ndel " + K("c") + "\n\n";
  Ctl({"txn", "--interactive=false"}, script, false);
}

class DiffEtcdctlCompactTest : public DiffEtcdctlTest {};

TEST_F(DiffEtcdctlCompactTest, Compaction) {
  PutBoth(K("a"), "1");
  const int64_t rev = PutBoth(K("a"), "2");
  auto p = Ctl({"compaction", std::to_string(rev)});
  EXPECT_TRUE(Ok(p)) << p.etcd.raw.err;
  EXPECT_EQ(p.etcd.out, "compacted revision " + std::to_string(rev) + "\n");
}

TEST_F(DiffEtcdctlCompactTest, CompactionPhysical) {
  const int64_t rev = PutBoth(K("a"), "1");
  Ctl({"compaction", "--physical", std::to_string(rev)}, "", false);
}

TEST_F(DiffEtcdctlCompactTest, CompactionTwice) {
  const int64_t rev = PutBoth(K("a"), "1");
  Ctl({"compaction", std::to_string(rev)}, "", false);
  auto p = Ctl({"compaction", std::to_string(rev)}, "", false);
  EXPECT_FALSE(Ok(p));
}

TEST_F(DiffEtcdctlCompactTest, CompactionFuture) {
  const int64_t rev = PutBoth(K("a"), "1");
  auto p = Ctl({"compaction", std::to_string(rev + 100)}, "", false);
  EXPECT_FALSE(Ok(p));
}

TEST_F(DiffEtcdctlCompactTest, GetCompactedRevision) {
  const int64_t r1 = PutBoth(K("a"), "1");
  const int64_t r2 = PutBoth(K("a"), "2");
  Ctl({"compaction", std::to_string(r2)}, "", false);
  auto p = Ctl({"get", K("a"), "--rev=" + std::to_string(r1)});
  EXPECT_FALSE(Ok(p));
  Ctl({"get", K("a"), "--rev=" + std::to_string(r2)});
}

}  // namespace
}  // namespace capstan::testing
