// FeatureGates (feature_gates.h): the gate table and featuregate's syntax,
// merging and errors. The expected texts are etcd's, from
// pkg/featuregate/feature_gate.go (v3.6.x) and server/features/etcd_features.go.

#include "server/config/feature_gates.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace capstan::server {
namespace {

using ::testing::ElementsAre;

TEST(FeatureGatesTest, TableHoldsEtcdsGatesWithDefaultsAndStages) {
  std::map<std::string, std::pair<std::string, bool>> got;
  std::string previous;
  for (const FeatureGateSpec& g : KnownFeatureGates()) {
    EXPECT_LT(previous, std::string(g.name)) << "table sorted by name";
    previous = std::string(g.name);
    got[std::string(g.name)] = {std::string(FeatureStageName(g.stage)), g.default_enabled};
    EXPECT_FALSE(g.locked) << g.name;
    EXPECT_FALSE(g.capstan_note.empty()) << g.name;
  }
  const std::map<std::string, std::pair<std::string, bool>> want = {
      {"AllAlpha", {"ALPHA", false}},
      {"AllBeta", {"BETA", false}},
      // etcd 3.6
      {"CompactHashCheck", {"ALPHA", false}},
      {"InitialCorruptCheck", {"ALPHA", false}},
      {"LeaseCheckpoint", {"ALPHA", false}},
      {"LeaseCheckpointPersist", {"ALPHA", false}},
      {"SetMemberLocalAddr", {"ALPHA", false}},
      {"StopGRPCServiceOnDefrag", {"ALPHA", false}},
      {"TxnModeWriteWithSharedBuffer", {"BETA", true}},
      // etcd 3.7
      {"FastLeaseKeepAlive", {"BETA", true}},
      {"PriorityRequest", {"ALPHA", false}},
  };
  EXPECT_EQ(got, want);
}

TEST(FeatureGatesTest, DefaultsUntilSet) {
  FeatureGates g;
  EXPECT_FALSE(g.Enabled(kInitialCorruptCheckGate));
  EXPECT_TRUE(g.Enabled(kTxnModeWriteWithSharedBufferGate));
  EXPECT_EQ(g.String(), "");
  ASSERT_TRUE(g.Set("InitialCorruptCheck=true").ok());
  EXPECT_TRUE(g.Enabled(kInitialCorruptCheckGate));
  EXPECT_EQ(g.String(), "InitialCorruptCheck=true");
  int enabled = 0;
  for (const FeatureGates::Resolved& r : g.All()) enabled += r.enabled ? 1 : 0;
  EXPECT_EQ(enabled, 3);  // InitialCorruptCheck, TxnModeWriteWithSharedBuffer, FastLeaseKeepAlive
  EXPECT_EQ(g.All().size(), KnownFeatureGates().size());
}

TEST(FeatureGatesTest, SyntaxAsFeaturegate) {
  FeatureGates g;
  // Spaces trimmed, empty items skipped, strconv.ParseBool's spellings, the
  // last value of a repeated name wins.
  ASSERT_TRUE(g.Set(" CompactHashCheck = T ,,LeaseCheckpoint=1,TxnModeWriteWithSharedBuffer=False,"
                    "LeaseCheckpoint=0")
                  .ok());
  EXPECT_TRUE(g.Enabled(kCompactHashCheckGate));
  EXPECT_FALSE(g.Enabled(kLeaseCheckpointGate));
  EXPECT_FALSE(g.Enabled(kTxnModeWriteWithSharedBufferGate));
  EXPECT_EQ(g.String(), "CompactHashCheck=true,LeaseCheckpoint=false,TxnModeWriteWithSharedBuffer=false");
  // An empty value sets nothing.
  ASSERT_TRUE(g.Set("").ok());
  // A second Set merges into the first (a repeated --feature-gates).
  ASSERT_TRUE(g.Set("StopGRPCServiceOnDefrag=true").ok());
  EXPECT_TRUE(g.Enabled(kCompactHashCheckGate));
  EXPECT_TRUE(g.Enabled(kStopGrpcServiceOnDefragGate));
}

TEST(FeatureGatesTest, ErrorsAsFeaturegateWordsThem) {
  FeatureGates g;
  EXPECT_EQ(g.Set("InitialCorruptCheck").message(), "missing bool value for InitialCorruptCheck");
  EXPECT_EQ(g.Set(" A ").message(), "missing bool value for A");
  EXPECT_EQ(g.Set("InitialCorruptCheck=yes").message(),
            "invalid value of InitialCorruptCheck=yes, err: strconv.ParseBool: parsing \"yes\": "
            "invalid syntax");
  EXPECT_EQ(g.Set("InitialCorruptCheck=").message(),
            "invalid value of InitialCorruptCheck=, err: strconv.ParseBool: parsing \"\": invalid "
            "syntax");
  EXPECT_EQ(g.Set("NoSuchGate=true").message(), "unrecognized feature gate: NoSuchGate");
  // Case matters.
  EXPECT_EQ(g.Set("initialcorruptcheck=true").message(),
            "unrecognized feature gate: initialcorruptcheck");
  // All or nothing: the known gate beside the unknown one is not set.
  EXPECT_FALSE(g.Set("InitialCorruptCheck=true,Bogus=true").ok());
  EXPECT_FALSE(g.Enabled(kInitialCorruptCheckGate));
  EXPECT_EQ(g.String(), "");
}

TEST(FeatureGatesTest, LockedAndGaAndDeprecatedGates) {
  static constexpr FeatureGateSpec kTable[] = {
      {"Deprecated", FeatureStage::kDeprecated, false, false, "3.6", "-"},
      {"Done", FeatureStage::kGA, true, true, "3.6", "-"},
      {"Graduated", FeatureStage::kGA, true, false, "3.6", "-"},
      {"New", FeatureStage::kAlpha, false, false, "3.6", "-"},
  };
  FeatureGates g(kTable);
  EXPECT_EQ(g.Set("Done=false").message(),
            "cannot set feature gate Done to false, feature is locked to true");
  ASSERT_TRUE(g.Set("Done=true").ok());  // its own default is allowed
  ASSERT_TRUE(g.Set("Graduated=true,Deprecated=true").ok());
  EXPECT_THAT(g.warnings(),
              ElementsAre("Setting GA feature gate Done=true. It will be removed in a future "
                          "release.",
                          "Setting deprecated feature gate Deprecated=true. It will be removed in a "
                          "future release.",
                          "Setting GA feature gate Graduated=true. It will be removed in a future "
                          "release."));
  // --help lists neither GA nor Deprecated gates.
  EXPECT_THAT(g.KnownFeaturesHelp(), ElementsAre("New=true|false (ALPHA - default=false)"));
}

TEST(FeatureGatesTest, AllAlphaAndAllBetaSetTheUnsetGatesOfTheirStage) {
  FeatureGates g;
  // An explicit value wins over AllAlpha whatever the order.
  ASSERT_TRUE(g.Set("InitialCorruptCheck=false,AllAlpha=true").ok());
  EXPECT_FALSE(g.Enabled(kInitialCorruptCheckGate));
  EXPECT_TRUE(g.Enabled(kCompactHashCheckGate));
  EXPECT_TRUE(g.Enabled(kPriorityRequestGate));
  EXPECT_TRUE(g.Enabled(kTxnModeWriteWithSharedBufferGate));  // Beta: its default
  // A later AllAlpha leaves what is already set.
  ASSERT_TRUE(g.Set("AllAlpha=false").ok());
  EXPECT_TRUE(g.Enabled(kCompactHashCheckGate));
  ASSERT_TRUE(g.Set("AllBeta=false").ok());
  EXPECT_FALSE(g.Enabled(kTxnModeWriteWithSharedBufferGate));
  EXPECT_FALSE(g.Enabled(kFastLeaseKeepAliveGate));
}

TEST(FeatureGatesTest, HelpListsGatesAsEtcd) {
  // etcd 3.6's --help: "Name=true|false (STAGE - default=x)", sorted.
  EXPECT_THAT(FeatureGates().KnownFeaturesHelp(),
              ElementsAre("AllAlpha=true|false (ALPHA - default=false)",
                          "AllBeta=true|false (BETA - default=false)",
                          "CompactHashCheck=true|false (ALPHA - default=false)",
                          "FastLeaseKeepAlive=true|false (BETA - default=true)",
                          "InitialCorruptCheck=true|false (ALPHA - default=false)",
                          "LeaseCheckpoint=true|false (ALPHA - default=false)",
                          "LeaseCheckpointPersist=true|false (ALPHA - default=false)",
                          "PriorityRequest=true|false (ALPHA - default=false)",
                          "SetMemberLocalAddr=true|false (ALPHA - default=false)",
                          "StopGRPCServiceOnDefrag=true|false (ALPHA - default=false)",
                          "TxnModeWriteWithSharedBuffer=true|false (BETA - default=true)"));
}

}  // namespace
}  // namespace capstan::server
