// A record of the operations clients made against a cluster, for the checker
// (checker.h): what was asked, when (invoke and completion times on one
// monotonic clock), and what came back.
//
//   History history;
//   Operation op = Operation::Put(client, "k1", "c3-17");
//   const int64_t id = history.Invoke(op);          // just before the RPC
//   ... the RPC ...
//   history.CompleteOk(id, response_fields);         // or CompleteFailed / CompleteUnknown
//
// Outcomes:
//   ok       the server answered: the response fields are valid.
//   failed   a definite error: the operation did not happen (the client
//            knows it never reached a server, or the server refused it
//            before it could take effect).
//   unknown  a timeout, a lost connection, an error after the request may
//            have been proposed: it may or may not have happened, at any time
//            after its invocation. Writes with unknown outcomes are why every
//            written value must be unique (the checker identifies writes by
//            value).
// An operation never completed (the recorder dropped, a client thread stuck)
// counts as unknown.
//
// Thread safety: History is thread-safe; Invoke and the Complete calls may
// come from any number of threads. Operations() returns a copy.

#ifndef CAPSTAN_TESTS_CLUSTER_HISTORY_H_
#define CAPSTAN_TESTS_CLUSTER_HISTORY_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "util/mutex.h"

namespace capstan::testing::cluster {

enum class OpKind {
  kPut,     // Put(key, value), optionally with prev_kv
  kGet,     // Range of one key (linearizable, or serializable when recorded so)
  kDelete,  // DeleteRange of one key, optionally with prev_kv
  kCas,     // Txn: compare value(key) == expected (or create_revision == 0 when
            // expect_absent; or, with compare_mod_revision, mod_revision(key) ==
            // expected_mod_revision, as the Kubernetes apiserver compares) then
            // Put(key, value) else Range(key)
  kList,    // Range [key, range_end) with a limit, at list_revision (0: the
            // current revision): one page of a paginated list
};

enum class Outcome { kPending, kOk, kFailed, kUnknown };

const char* OpKindName(OpKind k);
const char* OutcomeName(Outcome o);

// The answer of an ok operation.
struct Response {
  // Header revision: for a write that changed the key, the revision it made;
  // otherwise the store's revision when the request was served.
  int64_t revision = 0;
  // kGet, and kCas when the compare failed (its else-branch Range): whether
  // the key was found, its value and mod_revision.
  bool found = false;
  std::string value;
  int64_t mod_revision = 0;
  // kCas: whether the compare held (the put happened).
  bool succeeded = false;
  // kDelete: how many keys were deleted (0 or 1).
  int64_t deleted = 0;
  // kList: the page's keys in key order, and whether more keys follow.
  struct Kv {
    std::string key;
    std::string value;
    int64_t mod_revision = 0;
  };
  std::vector<Kv> kvs;
  bool more = false;
  // kPut / kDelete with prev_kv: the key's previous value, when there was one.
  bool has_prev = false;
  std::string prev_value;
};

struct Operation {
  int64_t id = -1;  // assigned by History::Invoke
  int client = 0;
  OpKind kind = OpKind::kGet;
  std::string key;
  // kPut, kCas: the value written (unique in the history).
  std::string value;
  // kCas: the compared value, or expect_absent, or (compare_mod_revision)
  // the compared mod_revision, 0 for an absent key.
  std::string expected;
  bool expect_absent = false;
  bool compare_mod_revision = false;
  int64_t expected_mod_revision = 0;
  // kList: the range's end (key is its start), the page size (0: no limit)
  // and the revision read (0: the current one, which the answer's header
  // revision tells).
  std::string range_end;
  int64_t limit = 0;
  int64_t list_revision = 0;
  // kPut / kDelete: asked for prev_kv.
  bool prev_kv = false;
  // kGet: a serializable read (a member's local state; the checker holds it
  // to the same rules, so that stale serializable reads show up).
  bool serializable = false;
  // Which member (index) or endpoint the request went to, for reports.
  std::string endpoint;

  // Nanoseconds on the steady clock. complete_ns is 0 while pending.
  int64_t invoke_ns = 0;
  int64_t complete_ns = 0;
  Outcome outcome = Outcome::kPending;
  Response response;  // valid when outcome == kOk
  std::string error;  // kFailed / kUnknown: the error text

  // True for the kinds that may change the key (put, delete, cas).
  bool IsWrite() const { return kind != OpKind::kGet && kind != OpKind::kList; }
  // True when this ok operation changed the store (made a revision): a put,
  // a delete that deleted, a cas whose compare held.
  bool MadeRevision() const;
  // One line: "#12 c3 put k1=c3-17 [1.234s..1.240s] ok rev=88 @127.0.0.1:2379".
  std::string ToString() const;

  static Operation Put(int client, std::string key, std::string value, bool prev_kv = false);
  static Operation Get(int client, std::string key, bool serializable = false);
  static Operation Delete(int client, std::string key, bool prev_kv = false);
  static Operation Cas(int client, std::string key, std::string expected, bool expect_absent,
                       std::string value);
  static Operation CasModRevision(int client, std::string key, int64_t expected_mod_revision,
                                  std::string value);
  static Operation List(int client, std::string key, std::string range_end, int64_t limit,
                        int64_t list_revision);
};

// Nanoseconds since an arbitrary epoch on std::chrono::steady_clock.
int64_t NowNs();

class History {
 public:
  History();
  History(const History&) = delete;
  History& operator=(const History&) = delete;

  // Records `op` as invoked now and returns its id. `op.id`, the times and the
  // outcome are set here.
  int64_t Invoke(Operation op);
  // Completes operation `id` now. REQUIRES: `id` came from Invoke and was not
  // completed yet (a second completion dies).
  void CompleteOk(int64_t id, const Response& response);
  void CompleteFailed(int64_t id, std::string error);
  void CompleteUnknown(int64_t id, std::string error);

  // Adds an operation recorded elsewhere (tests build synthetic histories so),
  // with its times and outcome as given; its id is assigned. Returns the id.
  int64_t Add(Operation op);

  // Every operation, by id; pending ones as they are (the checker treats them
  // as unknown).
  std::vector<Operation> Operations() const;
  // A copy of operation `id`. REQUIRES: `id` came from Invoke or Add.
  Operation At(int64_t id) const;
  size_t size() const;
  // How many have completed ok (a progress counter for workload drivers).
  int64_t ok_count() const;

 private:
  void Complete(int64_t id, Outcome outcome, const Response* response, std::string error);

  mutable util::Mutex mu_;
  std::vector<Operation> ops_ ABSL_GUARDED_BY(mu_);
  int64_t ok_count_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace capstan::testing::cluster

#endif  // CAPSTAN_TESTS_CLUSTER_HISTORY_H_
