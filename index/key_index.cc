// Copyright 2025 The Capstan Authors.

#include "index/key_index.h"

#include <cstdio>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace capstan::index {
namespace {

// A broken invariant is a crash with a message (etcd panics in these places).
[[noreturn]] void Panic(const std::string& message) {
  std::fprintf(stderr, "capstan/index: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

absl::Status RevisionNotFound() { return absl::NotFoundError("revision not found"); }

}  // namespace

void KeyIndex::Put(Revision rev, int64_t lease) {
  Append(rev);
  if (lease != lease_) {
    lease_ = lease;
    lease_since_ = rev.main;
  }
}

void KeyIndex::Append(Revision rev) {
  const Revision modified = this->modified();
  if (!(rev > modified)) {
    Panic(absl::StrFormat(
        "'put' with an unexpected smaller revision: given {%d,%d}, modified {%d,%d}", rev.main,
        rev.sub, modified.main, modified.sub));
  }
  if (revs_.size() >= std::numeric_limits<uint32_t>::max()) {
    Panic("'put' on a key with 2^32 revisions");
  }
  if (gens_.empty()) gens_.emplace_back();
  GenerationHeader& g = gens_.back();
  if (GenerationIsEmpty(gens_.size() - 1)) g.created = rev;  // creates the key
  revs_.push_back(rev);
  ++g.version;
}

void KeyIndex::Restore(Revision created, Revision modified, int64_t version, int64_t lease) {
  if (!gens_.empty()) {
    Panic(absl::StrFormat("'restore' got an unexpected non-empty generations (%d)", gens_.size()));
  }
  revs_.push_back(modified);
  gens_.push_back(GenerationHeader{created, version, 0});
  // Only `modified` is held: the lease is known for every put Lookup returns.
  lease_ = lease;
  lease_since_ = lease == 0 ? 0 : modified.main;
}

absl::Status KeyIndex::Tombstone(Revision rev) {
  if (!IsLive()) return RevisionNotFound();
  // Not a put: the lease marks stay (a Range never returns a tombstone).
  Append(rev);
  gens_.push_back(GenerationHeader{Revision{}, 0, static_cast<uint32_t>(revs_.size())});
  return absl::OkStatus();
}

absl::Status KeyIndex::Get(int64_t at_rev, Revision* modified, Revision* created,
                           int64_t* version) const {
  if (Lookup(at_rev, modified, created, version)) return absl::OkStatus();
  return RevisionNotFound();
}

bool KeyIndex::Lookup(int64_t at_rev, Revision* modified, Revision* created,
                      int64_t* version) const {
  *modified = Revision{};
  *created = Revision{};
  *version = 0;
  const ptrdiff_t g = FindGeneration(at_rev);
  if (g < 0) return false;
  const size_t begin = GenerationBegin(g);
  const size_t end = GenerationEnd(g);
  // Walk the generation from its newest revision (etcd's generation.walk).
  for (size_t i = end; i > begin; --i) {
    if (revs_[i - 1].main <= at_rev) {
      *modified = revs_[i - 1];
      *created = gens_[g].created;
      *version = gens_[g].version - static_cast<int64_t>(end - i);
      return true;
    }
  }
  return false;
}

std::vector<Revision> KeyIndex::Since(int64_t rev) const {
  std::vector<Revision> out;
  AppendSince(rev, &out);
  return out;
}

void KeyIndex::AppendSince(int64_t rev, std::vector<Revision>* out) const {
  if (IsEmpty()) return;
  const Revision since{rev, 0};
  // Find the generation to start from: the newest one created before `since`.
  size_t gi = gens_.size() - 1;
  for (; gi > 0; --gi) {
    if (GenerationIsEmpty(gi)) continue;
    if (since > gens_[gi].created) break;
  }
  const size_t first_out = out->size();
  int64_t last = 0;
  for (size_t i = GenerationBegin(gi); i < revs_.size(); ++i) {
    const Revision r = revs_[i];
    if (since > r) continue;
    if (out->size() > first_out && r.main == last) {
      // Only the largest sub revision of a main revision is visible outside.
      out->back() = r;
      continue;
    }
    out->push_back(r);
    last = r.main;
  }
}

void KeyIndex::FindCompactionPoint(int64_t at_rev, RevisionSet* available, size_t* gen,
                                   ptrdiff_t* rev_index) const {
  // The first generation that includes at_rev or was created after it; a
  // generation whose tombstone is at at_rev still includes it (etcd 3.5.16),
  // unless the key was created again in that same revision (a txn deleting
  // a range ending at "\0" and putting a key in it): then the next
  // generation holds the key's value at at_rev, which etcd 3.5.16 loses
  // (etcd-io/etcd#22376; Capstan takes the fix proposed there).
  size_t g = 0;
  while (g + 1 < gens_.size()) {
    const int64_t tomb = revs_[GenerationEnd(g) - 1].main;
    if (tomb > at_rev) break;
    if (tomb == at_rev &&
        (GenerationIsEmpty(g + 1) || revs_[GenerationBegin(g + 1)].main > at_rev)) {
      break;
    }
    ++g;
  }
  // Its largest revision <= at_rev, if any.
  *gen = g;
  *rev_index = -1;
  const size_t begin = GenerationBegin(g);
  for (size_t i = GenerationEnd(g); i > begin; --i) {
    if (revs_[i - 1].main <= at_rev) {
      if (available != nullptr) available->insert(revs_[i - 1]);
      *rev_index = static_cast<ptrdiff_t>(i - 1 - begin);
      break;
    }
  }
}

void KeyIndex::Compact(int64_t at_rev, RevisionSet* available) {
  if (IsEmpty()) Panic("'compact' got an unexpected empty keyIndex");
  size_t g;
  ptrdiff_t rev_index;
  FindCompactionPoint(at_rev, available, &g, &rev_index);

  // first_rev: index in revs_ of the first revision that stays.
  size_t first_rev = GenerationBegin(g);
  // Remove the previous contents of the generation. A tombstone at at_rev
  // stays, alone in its generation, until a later compaction (etcd 3.5.16;
  // 3.4 removed it with its generation).
  if (!GenerationIsEmpty(g) && rev_index != -1) first_rev += static_cast<size_t>(rev_index);
  // Remove the previous generations.
  if (first_rev == 0 && g == 0) return;
  revs_.erase(revs_.begin(), revs_.begin() + first_rev);
  gens_.erase(gens_.begin(), gens_.begin() + g);
  gens_[0].begin = 0;
  for (size_t i = 1; i < gens_.size(); ++i) gens_[i].begin -= first_rev;
}

void KeyIndex::Keep(int64_t at_rev, RevisionSet* available) const {
  if (IsEmpty()) return;
  size_t g;
  ptrdiff_t rev_index;
  FindCompactionPoint(at_rev, available, &g, &rev_index);
  if (GenerationIsEmpty(g)) return;
  // A tombstone at at_rev is not kept, though Compact keeps it (etcd's keep:
  // hashes stay those of versions that removed it).
  const ptrdiff_t len = static_cast<ptrdiff_t>(GenerationEnd(g) - GenerationBegin(g));
  if (rev_index == len - 1 && g != gens_.size() - 1) {
    available->erase(revs_[GenerationBegin(g) + rev_index]);
  }
}

void KeyIndex::Retained(int64_t at_rev, RevisionSet* available) const {
  if (IsEmpty()) return;
  size_t g;
  ptrdiff_t rev_index;
  FindCompactionPoint(at_rev, available, &g, &rev_index);
}

bool KeyIndex::NeedsCompaction(int64_t at_rev) const {
  if (IsEmpty()) return false;
  size_t g;
  ptrdiff_t rev_index;
  FindCompactionPoint(at_rev, nullptr, &g, &rev_index);
  if (g > 0) return true;
  return !GenerationIsEmpty(g) && rev_index > 0;
}

ptrdiff_t KeyIndex::FindGeneration(int64_t rev) const {
  const ptrdiff_t last = static_cast<ptrdiff_t>(gens_.size()) - 1;
  for (ptrdiff_t cg = last; cg >= 0; --cg) {
    if (GenerationIsEmpty(cg)) continue;
    if (cg != last) {
      // The key was deleted at or before rev.
      if (revs_[GenerationEnd(cg) - 1].main <= rev) return -1;
    }
    if (revs_[GenerationBegin(cg)].main <= rev) return cg;
  }
  return -1;
}

KeyIndex::Generation KeyIndex::generation(size_t i) const {
  const size_t begin = GenerationBegin(i);
  return Generation{gens_[i].created, gens_[i].version,
                    std::span<const Revision>(revs_.data() + begin, GenerationEnd(i) - begin)};
}

std::string KeyIndex::DebugString() const {
  const Revision modified = this->modified();
  std::string s = absl::StrFormat("modified={%d,%d}", modified.main, modified.sub);
  for (size_t g = 0; g < gens_.size(); ++g) {
    if (GenerationIsEmpty(g)) {
      absl::StrAppend(&s, " []");
      continue;
    }
    absl::StrAppendFormat(&s, " [created={%d,%d} ver=%d revs=", gens_[g].created.main,
                          gens_[g].created.sub, gens_[g].version);
    for (size_t i = GenerationBegin(g); i < GenerationEnd(g); ++i) {
      absl::StrAppendFormat(&s, "{%d,%d}", revs_[i].main, revs_[i].sub);
    }
    absl::StrAppend(&s, "]");
  }
  if (lease_ != 0 || lease_since_ != 0) {
    absl::StrAppendFormat(&s, " lease=%d since=%d", lease_, lease_since_);
  }
  return s;
}

bool operator==(const KeyIndex& a, const KeyIndex& b) {
  if (a.revs_ != b.revs_ || a.gens_.size() != b.gens_.size() || a.lease_ != b.lease_ ||
      a.lease_since_ != b.lease_since_) {
    return false;
  }
  for (size_t g = 0; g < a.gens_.size(); ++g) {
    const auto& x = a.gens_[g];
    const auto& y = b.gens_[g];
    // An empty generation's created/version carry no meaning.
    if (x.begin != y.begin) return false;
    if (a.GenerationIsEmpty(g)) continue;
    if (x.created != y.created || x.version != y.version) return false;
  }
  return true;
}

}  // namespace capstan::index
