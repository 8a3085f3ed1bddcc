// capstan-robustness: fault campaigns (campaign.h) against a cluster of
// Capstan or etcd members, each seed one campaign; prints each campaign's
// report and the totals, and exits 1 if any campaign found a violation.
//
//   capstan-robustness --flavor=capstan --seeds=1-10 --duration=60s
//   capstan-robustness --flavor=etcd --members=5 --seed=3 --faults=isolate-leader,kill-leader

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cluster/campaign.h"

namespace capstan::testing::cluster {
namespace {

const char kUsage[] =
    "usage: capstan-robustness [flags]\n"
    "  --flavor=capstan|etcd   the members' server (default capstan): $CAPSTAN_BINARY, else\n"
    "                          this build's; $CAPSTAN_ETCD_BINARY, else the extracted etcd 3.5\n"
    "  --members=N             3 or 5 (default 3)\n"
    "  --seed=S                one campaign with seed S (default 1)\n"
    "  --seeds=A-B             one campaign per seed from A to B\n"
    "  --duration=Ns           traffic and faults per campaign (default 20s)\n"
    "  --faults=a,b,...        the faults to draw from (default: all):\n"
    "                          %s\n"
    "  --hold=MIN-MAXms        how long each fault is held (default 1500-3500ms)\n"
    "  --compaction-interval=Nms  the apiserver-style compactor's interval (default\n"
    "                          3000ms; 0: no compaction)\n"
    "  --no-proxy              members talk directly (only kill and pause faults then)\n"
    "  --peer-tls              peer URLs over TLS with client certificates, as kubeadm\n"
    "                          sets them up\n"
    "  --quiet                 no line per fault while it runs\n";

void Usage() {
  std::vector<std::string> names;
  for (Fault f : AllFaults()) names.push_back(FaultName(f));
  std::fprintf(stderr, kUsage, absl::StrJoin(names, ", ").c_str());
}

bool ParseRange(absl::string_view v, int64_t* lo, int64_t* hi) {
  std::vector<absl::string_view> p = absl::StrSplit(v, '-');
  if (p.size() == 1) return absl::SimpleAtoi(p[0], lo) && absl::SimpleAtoi(p[0], hi);
  return p.size() == 2 && absl::SimpleAtoi(p[0], lo) && absl::SimpleAtoi(p[1], hi) && *lo <= *hi;
}

int Main(int argc, char** argv) {
  CampaignOptions o;
  o.verbose = true;
  int64_t seed_lo = 1, seed_hi = 1;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    int64_t lo = 0, hi = 0;
    bool good = true;
    if (name == "--flavor") {
      good = value == "capstan" || value == "etcd";
      o.flavor = value == "etcd" ? ServerFlavor::kEtcd : ServerFlavor::kCapstan;
    } else if (name == "--members") {
      good = absl::SimpleAtoi(value, &o.members) && (o.members == 3 || o.members == 5);
    } else if (name == "--seed" || name == "--seeds") {
      good = ParseRange(value, &seed_lo, &seed_hi);
    } else if (name == "--duration") {
      std::string v = value;
      if (absl::EndsWith(v, "s")) v.pop_back();
      good = absl::SimpleAtoi(v, &lo) && lo > 0;
      o.duration = std::chrono::seconds(lo);
    } else if (name == "--hold") {
      std::string v = value;
      if (absl::EndsWith(v, "ms")) v.resize(v.size() - 2);
      good = ParseRange(v, &lo, &hi) && lo > 0;
      o.hold_min = std::chrono::milliseconds(lo);
      o.hold_max = std::chrono::milliseconds(hi);
    } else if (name == "--compaction-interval") {
      std::string v = value;
      if (absl::EndsWith(v, "ms")) v.resize(v.size() - 2);
      good = absl::SimpleAtoi(v, &lo) && lo >= 0;
      o.compaction_interval = std::chrono::milliseconds(lo);
    } else if (name == "--faults") {
      for (absl::string_view f : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        Fault parsed;
        good = good && ParseFault(std::string(f), &parsed);
        o.faults.push_back(parsed);
      }
    } else if (name == "--no-proxy") {
      o.proxy = false;
    } else if (name == "--peer-tls") {
      o.peer_tls = true;
    } else if (name == "--quiet") {
      o.verbose = false;
    } else if (name == "--help" || name == "-h") {
      Usage();
      return 0;
    } else {
      good = false;
    }
    if (!good) {
      std::fprintf(stderr, "capstan-robustness: bad flag '%s'\n", arg.c_str());
      Usage();
      return 2;
    }
  }

  int64_t operations = 0, faults = 0, violations = 0, events = 0, failed = 0, excused = 0;
  for (int64_t seed = seed_lo; seed <= seed_hi; ++seed) {
    o.seed = static_cast<uint64_t>(seed);
    CampaignResult r = RunCampaign(o);
    std::printf("%s", r.Report().c_str());
    std::fflush(stdout);
    operations += r.operations;
    faults += static_cast<int64_t>(r.faults.size());
    violations += static_cast<int64_t>(r.violations.size()) + (r.error.empty() ? 0 : 1);
    events += r.watch_events;
    excused += r.leases_revoked_early_excused;
    if (!r.passed()) ++failed;
  }
  std::printf("TOTAL %s, %d members%s: %lld campaigns, %lld operations, %lld watch events, "
              "%lld faults injected, %lld violations, %lld campaigns failed, %lld early lease "
              "revocations excused (etcd's resumed leader)\n",
              o.flavor == ServerFlavor::kEtcd ? "etcd" : "capstan", o.members,
              o.peer_tls ? " over peer TLS" : "",
              static_cast<long long>(seed_hi - seed_lo + 1), static_cast<long long>(operations),
              static_cast<long long>(events), static_cast<long long>(faults),
              static_cast<long long>(violations), static_cast<long long>(failed),
              static_cast<long long>(excused));
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace capstan::testing::cluster

int main(int argc, char** argv) { return capstan::testing::cluster::Main(argc, argv); }
