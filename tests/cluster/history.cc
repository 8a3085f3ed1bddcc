#include "cluster/history.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace capstan::testing::cluster {

const char* OpKindName(OpKind k) {
  switch (k) {
    case OpKind::kPut: return "put";
    case OpKind::kGet: return "get";
    case OpKind::kDelete: return "delete";
    case OpKind::kCas: return "cas";
    case OpKind::kList: return "list";
  }
  return "?";
}

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kPending: return "pending";
    case Outcome::kOk: return "ok";
    case Outcome::kFailed: return "failed";
    case Outcome::kUnknown: return "unknown";
  }
  return "?";
}

bool Operation::MadeRevision() const {
  if (outcome != Outcome::kOk) return false;
  switch (kind) {
    case OpKind::kPut: return true;
    case OpKind::kGet: return false;
    case OpKind::kDelete: return response.deleted > 0;
    case OpKind::kCas: return response.succeeded;
    case OpKind::kList: return false;
  }
  return false;
}

std::string Operation::ToString() const {
  std::string s = absl::StrCat("#", id, " c", client, " ", OpKindName(kind), " ", key);
  switch (kind) {
    case OpKind::kPut: absl::StrAppend(&s, "=", value); break;
    case OpKind::kGet: if (serializable) absl::StrAppend(&s, " (serializable)"); break;
    case OpKind::kDelete: break;
    case OpKind::kCas:
      if (compare_mod_revision) {
        absl::StrAppend(&s, " if mod_rev==", expected_mod_revision);
      } else {
        absl::StrAppend(&s, expect_absent ? " if absent" : absl::StrCat(" if ==", expected));
      }
      absl::StrAppend(&s, " then =", value);
      break;
    case OpKind::kList:
      absl::StrAppend(&s, "..", range_end, " limit ", limit);
      if (list_revision != 0) absl::StrAppend(&s, " at rev ", list_revision);
      break;
  }
  absl::StrAppend(&s, absl::StrFormat(" [%.6fs..", invoke_ns / 1e9));
  if (outcome == Outcome::kPending) {
    absl::StrAppend(&s, "?] pending");
  } else {
    absl::StrAppend(&s, absl::StrFormat("%.6fs] %s", complete_ns / 1e9, OutcomeName(outcome)));
  }
  if (outcome == Outcome::kOk) {
    absl::StrAppend(&s, " rev=", response.revision);
    if (kind == OpKind::kGet || (kind == OpKind::kCas && !response.succeeded)) {
      if (response.found) {
        absl::StrAppend(&s, " value=", response.value, " mod_rev=", response.mod_revision);
      } else {
        absl::StrAppend(&s, " (absent)");
      }
    }
    if (kind == OpKind::kCas) absl::StrAppend(&s, response.succeeded ? " succeeded" : " failed");
    if (kind == OpKind::kList) {
      absl::StrAppend(&s, " [");
      for (size_t i = 0; i < response.kvs.size(); ++i) {
        const Response::Kv& kv = response.kvs[i];
        absl::StrAppend(&s, i == 0 ? "" : " ", kv.key, "=", kv.value, "@", kv.mod_revision);
      }
      absl::StrAppend(&s, "]", response.more ? " more" : "");
    }
    if (kind == OpKind::kDelete) absl::StrAppend(&s, " deleted=", response.deleted);
    if (response.has_prev) absl::StrAppend(&s, " prev=", response.prev_value);
  } else if (!error.empty()) {
    absl::StrAppend(&s, " (", error, ")");
  }
  if (!endpoint.empty()) absl::StrAppend(&s, " @", endpoint);
  return s;
}

Operation Operation::Put(int client, std::string key, std::string value, bool prev_kv) {
  Operation op;
  op.client = client;
  op.kind = OpKind::kPut;
  op.key = std::move(key);
  op.value = std::move(value);
  op.prev_kv = prev_kv;
  return op;
}

Operation Operation::Get(int client, std::string key, bool serializable) {
  Operation op;
  op.client = client;
  op.kind = OpKind::kGet;
  op.key = std::move(key);
  op.serializable = serializable;
  return op;
}

Operation Operation::Delete(int client, std::string key, bool prev_kv) {
  Operation op;
  op.client = client;
  op.kind = OpKind::kDelete;
  op.key = std::move(key);
  op.prev_kv = prev_kv;
  return op;
}

Operation Operation::Cas(int client, std::string key, std::string expected, bool expect_absent,
                         std::string value) {
  Operation op;
  op.client = client;
  op.kind = OpKind::kCas;
  op.key = std::move(key);
  op.expected = std::move(expected);
  op.expect_absent = expect_absent;
  op.value = std::move(value);
  return op;
}

Operation Operation::CasModRevision(int client, std::string key, int64_t expected_mod_revision,
                                    std::string value) {
  Operation op;
  op.client = client;
  op.kind = OpKind::kCas;
  op.key = std::move(key);
  op.compare_mod_revision = true;
  op.expected_mod_revision = expected_mod_revision;
  op.value = std::move(value);
  return op;
}

Operation Operation::List(int client, std::string key, std::string range_end, int64_t limit,
                          int64_t list_revision) {
  Operation op;
  op.client = client;
  op.kind = OpKind::kList;
  op.key = std::move(key);
  op.range_end = std::move(range_end);
  op.limit = limit;
  op.list_revision = list_revision;
  return op;
}

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

History::History() = default;

int64_t History::Invoke(Operation op) {
  op.invoke_ns = NowNs();
  op.complete_ns = 0;
  op.outcome = Outcome::kPending;
  op.response = Response{};
  op.error.clear();
  util::MutexLock l(&mu_);
  op.id = static_cast<int64_t>(ops_.size());
  ops_.push_back(std::move(op));
  return ops_.back().id;
}

void History::Complete(int64_t id, Outcome outcome, const Response* response,
                       std::string error) {
  const int64_t now = NowNs();
  util::MutexLock l(&mu_);
  if (id < 0 || id >= static_cast<int64_t>(ops_.size()) ||
      ops_[id].outcome != Outcome::kPending) {
    std::fprintf(stderr, "History: operation %lld completed twice or never invoked\n",
                 static_cast<long long>(id));
    std::abort();
  }
  Operation& op = ops_[id];
  op.complete_ns = now;
  op.outcome = outcome;
  if (response != nullptr) op.response = *response;
  op.error = std::move(error);
  if (outcome == Outcome::kOk) ++ok_count_;
}

void History::CompleteOk(int64_t id, const Response& response) {
  Complete(id, Outcome::kOk, &response, "");
}
void History::CompleteFailed(int64_t id, std::string error) {
  Complete(id, Outcome::kFailed, nullptr, std::move(error));
}
void History::CompleteUnknown(int64_t id, std::string error) {
  Complete(id, Outcome::kUnknown, nullptr, std::move(error));
}

int64_t History::Add(Operation op) {
  util::MutexLock l(&mu_);
  op.id = static_cast<int64_t>(ops_.size());
  if (op.outcome == Outcome::kOk) ++ok_count_;
  ops_.push_back(std::move(op));
  return ops_.back().id;
}

std::vector<Operation> History::Operations() const {
  util::MutexLock l(&mu_);
  return ops_;
}

Operation History::At(int64_t id) const {
  util::MutexLock l(&mu_);
  return ops_.at(static_cast<size_t>(id));
}

size_t History::size() const {
  util::MutexLock l(&mu_);
  return ops_.size();
}

int64_t History::ok_count() const {
  util::MutexLock l(&mu_);
  return ok_count_;
}

}  // namespace capstan::testing::cluster
