// Seeded randomized differential tests: the same random sequence of requests
// to real etcd and to Capstan (DiffTest), every answer compared.
//
//   DiffRandomKvTest     Put, DeleteRange, Range, Txn (nested, duplicate
//                        keys), Compact, HashKV and the lease RPCs over a
//                        dozen keys, so that operations collide; now and
//                        then a restart of both servers, clean or a crash
//                        (see below).
//   DiffRandomCachedKvTest  the same on keys under /registry/pods/, where
//                        Capstan's watch cache answers Ranges it can.
//   DiffRandomAuthTest   the KV and lease steps, and watcher creation, as
//                        random identities (root, two users, no token, a
//                        bogus or dropped token) among random changes to
//                        users, roles, permissions and passwords, and auth
//                        turned off and on.
//   DiffRandomWatchTest  watchers with random ranges, start revisions,
//                        prev_kv and filters, created, canceled and asked for
//                        progress before and during a random write sequence;
//                        what each watcher sent is compared as one event
//                        sequence, and the canceled and progress responses
//                        as they are.
//
// Each seed is one test (Seeds/DiffRandomKvTest.Run/Seed3) with its own key
// prefix and lease IDs. Its requests depend only on the seed, on those names
// and on etcd's answers to its earlier requests. It starts with a put and a
// compaction at that put's revision, so that the revisions it picks are the
// same relative to its start whichever seeds ran before. On the first answer
// that differs, the test prints the seed, the step and the request, and stops
// that seed. To see the steps leading there, run that seed alone with
// CAPSTAN_DIFF_VERBOSE=1 (every request and etcd's answer), e.g. for seed 17:
//   CAPSTAN_RANDOM_SEEDS=17 CAPSTAN_DIFF_VERBOSE=1 diff_random_test
//       --gtest_filter='*DiffRandomKvTest.Run/Seed17'
//
// The fixture is in diff_random.h, the requests in diff_random_generator.h;
// the auth suite in diff_random_auth_test.cc, the watch suite in
// diff_random_watch_test.cc.
//
// Environment:
//   CAPSTAN_RANDOM_SEEDS  how many seeds (1..N; default 6)
//   CAPSTAN_RANDOM_STEPS  steps per seed (default 600; the watch test takes
//                         half as many)
//
// A restart (about one per thousand KV steps) stops both servers with
// SIGTERM or SIGKILL, starts them again on their data, and reads back the
// seed's keys, the compaction and the leases before the steps go on. etcd
// 3.4 applies some log entries again when it starts, and a request it refused
// may then succeed (see LeaveEtcdNothingToReapply): a put and a Hash before
// each restart leave it none to apply again.
//
// The watch test waits for each Created response before it writes again, so
// that a watcher from the current revision starts at the same revision on
// both servers. Before a compaction, a cancel, a progress request and at the
// end it writes two sentinel revisions (puts, then deletes, of every
// watcher's key) and reads until each watcher has reported them: then every
// watcher has sent all it will, no compaction races a watcher that is still
// catching up, and both servers answer a progress request at once (see
// RequestProgress).
//
// Never generated: a txn that deletes keys from a key on ("\0") and then puts
// one of them with ignore_value or ignore_lease crashes etcd (see TxnOp).
//
// Compared after a normalization, because two etcds differ there too:
//   - LeaseTimeToLive: TTL is the seconds left, truncated, read at two
//     moments: a difference of one is taken as equal. A lease that lived
//     through a restart starts again with its full TTL on each server when
//     that server comes back: each TTL has to fit that rule instead (see
//     FitsRestart). Keys come in Go map order: sorted.
//   - LeaseLeases: every lease of the server, in expiry order: only this
//     seed's, sorted by ID.

#include <string>

#include "absl/strings/str_format.h"
#include "diff_random.h"
#include "gtest/gtest.h"

namespace capstan::testing::diff_random {
namespace {

// ===========================================================================
// KV and leases

class DiffRandomKvTest : public DiffRandomTest {};

TEST_P(DiffRandomKvTest, Run) { RunKvSteps(); }

INSTANTIATE_TEST_SUITE_P(Seeds, DiffRandomKvTest, ::testing::ValuesIn(Seeds()), SeedName);

// The same steps on keys under /registry/pods/, a prefix Capstan's watch
// cache holds, so that Ranges inside it are answered by the cache where it
// can (server/api/cache_range.h) and the rest by the store. A suite of its own
// has servers of its own; seeds run in order, so a from-key range of one
// seed sees no other seed's keys.
class DiffRandomCachedKvTest : public DiffRandomTest {
 protected:
  std::string Root() const override {
    return absl::StrFormat("/registry/pods/seed%04d/", seed());
  }
};

TEST_P(DiffRandomCachedKvTest, Run) { RunKvSteps(); }

INSTANTIATE_TEST_SUITE_P(Seeds, DiffRandomCachedKvTest, ::testing::ValuesIn(Seeds()), SeedName);

}  // namespace
}  // namespace capstan::testing::diff_random
