// Mutex, CondVar: absl::Mutex and absl::CondVar with their lock operations
// made visible to ThreadSanitizer, and the scoped locks over them. Every
// lock of the libraries is a util::Mutex, so that clang's thread-safety
// analysis checks what it guards (ABSL_GUARDED_BY) and what each function
// requires (ABSL_EXCLUSIVE_LOCKS_REQUIRED, ABSL_SHARED_LOCKS_REQUIRED,
// ABSL_LOCKS_EXCLUDED): scripts/check_thread_safety.py, the ctest
// check_thread_safety, compiles the libraries with -Werror=thread-safety.
//
//   // Lock order: mu_ before Stream::mu_; nothing calls out under it.
//   mutable util::Mutex mu_;
//   std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
//   void PushLocked(Item item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
//
//   util::MutexLock l(&mu_);
//   mu_.Await(absl::Condition(&stopping_));            // or a lambda, below
//
// Waiting: prefer Await / AwaitWithTimeout with an absl::Condition over the
// state the mutex guards. The mutex re-evaluates waiters' conditions when
// it is released, so writers need no notify call and no wake-up is lost.
// A Condition over a lambda reads guarded state: annotate the lambda
// `[this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ... }` (or SHARED). It may
// run on any thread that releases the mutex, so it must be cheap and must
// not lock anything. CondVar is for the rest: waits signalled explicitly,
// where a condition would be costly to re-evaluate on every release.
//
// Why a wrapper: Debian builds Abseil without ThreadSanitizer, so absl::Mutex
// locks and unlocks in uninstrumented code: TSan sees no happens-before edge
// through it, reports every access to state it guards as a race and buries
// real races among them. Under TSan (-DCAPSTAN_SANITIZE=thread) this wrapper
// tells TSan about each lock operation through its mutex annotation
// interface, as Abseil does when it is built with TSan itself; otherwise the
// annotations compile to nothing and each method is the absl::Mutex one plus
// a flag store. Memory accesses inside the absl::Mutex calls (a waiter's
// Condition evaluated by another thread's Unlock) are ignored by TSan, as
// they are in Abseil's own TSan build (the annotations' pre- and post-
// calls bracket an ignored region).
//
// Thread safety: as absl::Mutex. Not reentrant. Lock order is the owner's
// to state, where it declares the mutex.

#ifndef CAPSTAN_UTIL_MUTEX_H_
#define CAPSTAN_UTIL_MUTEX_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace capstan::util {

class CondVar;

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() { TsanCreate(); }
  ~Mutex() { TsanDestroy(); }
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() {
    TsanPreLock(kExclusive);
    mu_.Lock();
    TsanPostLock(kExclusive);
    exclusive_ = true;
  }
  void Unlock() ABSL_UNLOCK_FUNCTION() {
    exclusive_ = false;
    TsanPreUnlock(kExclusive);
    mu_.Unlock();
    TsanPostUnlock(kExclusive);
  }
  void ReaderLock() ABSL_SHARED_LOCK_FUNCTION() {
    TsanPreLock(kShared);
    mu_.ReaderLock();
    TsanPostLock(kShared);
  }
  void ReaderUnlock() ABSL_UNLOCK_FUNCTION() {
    TsanPreUnlock(kShared);
    mu_.ReaderUnlock();
    TsanPostUnlock(kShared);
  }

  // absl::Mutex::Await: releases the mutex until cond holds, then takes it
  // back in the mode it was held in. cond is evaluated with the mutex held
  // (by this thread or by one releasing it).
  // REQUIRES: held, in either mode.
  void Await(const absl::Condition& cond) ABSL_SHARED_LOCKS_REQUIRED(this) {
    Released([&] {
      mu_.Await(cond);
      return true;
    });
  }

  // absl::Mutex::AwaitWithTimeout: as Await, but gives up when timeout
  // passes. Returns whether cond holds (it may hold at the deadline).
  // REQUIRES: held, in either mode.
  bool AwaitWithTimeout(const absl::Condition& cond, absl::Duration timeout)
      ABSL_SHARED_LOCKS_REQUIRED(this) {
    return Released([&] { return mu_.AwaitWithTimeout(cond, timeout); });
  }

  // Tells the analysis (and, where Abseil checks, the run) that the calling
  // context holds the mutex: for code the analysis cannot follow, such as a
  // callback known to run under the lock. absl::Mutex checks only that
  // some thread holds it (exclusively, for AssertHeld).
  void AssertHeld() const ABSL_ASSERT_EXCLUSIVE_LOCK() { mu_.AssertHeld(); }
  void AssertReaderHeld() const ABSL_ASSERT_SHARED_LOCK() { mu_.AssertReaderHeld(); }

 private:
  friend class CondVar;

  // Runs wait, which releases mu_ and takes it back in the same mode, with
  // TSan told of the release and of the acquisition after it.
  template <typename Wait>
  bool Released(Wait wait) {
    // A shared holder reads false: no writer holds the mutex meanwhile.
    const bool exclusive = exclusive_;
    const unsigned mode = exclusive ? kExclusive : kShared;
    TsanPreUnlock(mode);
    const bool result = wait();
    TsanPostUnlock(mode);
    TsanPreLock(mode);
    TsanPostLock(mode);
    // Writers that held the mutex during the wait cleared the flag.
    if (exclusive) exclusive_ = true;
    return result;
  }

#if defined(__SANITIZE_THREAD__)
  static constexpr unsigned kExclusive = 0;
  static constexpr unsigned kShared = __tsan_mutex_read_lock;
  void TsanCreate() { __tsan_mutex_create(this, 0); }
  void TsanDestroy() { __tsan_mutex_destroy(this, 0); }
  void TsanPreLock(unsigned mode) { __tsan_mutex_pre_lock(this, mode); }
  void TsanPostLock(unsigned mode) { __tsan_mutex_post_lock(this, mode, 0); }
  void TsanPreUnlock(unsigned mode) { __tsan_mutex_pre_unlock(this, mode); }
  void TsanPostUnlock(unsigned mode) { __tsan_mutex_post_unlock(this, mode); }
#else
  static constexpr unsigned kExclusive = 0;
  static constexpr unsigned kShared = 1;
  void TsanCreate() {}
  void TsanDestroy() {}
  void TsanPreLock(unsigned) {}
  void TsanPostLock(unsigned) {}
  void TsanPreUnlock(unsigned) {}
  void TsanPostUnlock(unsigned) {}
#endif

  absl::Mutex mu_;
  // True while a writer holds mu_: set and cleared by that writer, read by
  // a holder in Released, so mu_ itself orders every access.
  bool exclusive_ = false;
};

// absl::CondVar over a util::Mutex. Prefer Mutex::Await with a Condition
// (above); use a CondVar where waiters are woken explicitly.
//
// Thread safety: as absl::CondVar. Signal and SignalAll may be called with
// or without the mutex held; a waiter must recheck its condition after
// Wait returns (wake-ups may be spurious).
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Releases *mu until signalled (or spuriously woken), then takes it back.
  // REQUIRES: *mu held exclusively.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    mu->Released([&] {
      cv_.Wait(&mu->mu_);
      return true;
    });
  }
  // As Wait, but also returns once timeout has passed. Returns true on
  // timeout, as absl::CondVar does.
  // REQUIRES: *mu held exclusively.
  bool WaitWithTimeout(Mutex* mu, absl::Duration timeout) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return mu->Released([&] { return cv_.WaitWithTimeout(&mu->mu_, timeout); });
  }

  void Signal() { cv_.Signal(); }
  void SignalAll() { cv_.SignalAll(); }

 private:
  absl::CondVar cv_;
};

// Holds a Mutex exclusively for its scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// Holds a Mutex shared for its scope.
class ABSL_SCOPED_LOCKABLE ReaderMutexLock {
 public:
  explicit ReaderMutexLock(Mutex* mu) ABSL_SHARED_LOCK_FUNCTION(mu) : mu_(mu) { mu_->ReaderLock(); }
  ~ReaderMutexLock() ABSL_UNLOCK_FUNCTION() { mu_->ReaderUnlock(); }
  ReaderMutexLock(const ReaderMutexLock&) = delete;
  ReaderMutexLock& operator=(const ReaderMutexLock&) = delete;

 private:
  Mutex* const mu_;
};

}  // namespace capstan::util

#endif  // CAPSTAN_UTIL_MUTEX_H_
