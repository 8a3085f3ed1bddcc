// Mutex: the watch cache's absl::Mutex, with its lock operations made
// visible to ThreadSanitizer.
//
// Debian builds Abseil without ThreadSanitizer, so absl::Mutex locks and
// unlocks in uninstrumented code: TSan sees no happens-before edge through
// it, reports every access to state it guards as a race and buries real
// races among them. Under TSan (-DCAPSTAN_SANITIZE=thread) this wrapper
// tells TSan about each lock operation through its mutex annotation
// interface, as Abseil does when it is built with TSan itself; otherwise
// the annotations compile to nothing and each method is the absl::Mutex
// one plus a flag store. Memory accesses inside the absl::Mutex calls (a
// waiter's Condition evaluated by another thread's Unlock) are ignored by
// TSan, as they are in Abseil's own TSan build.
//
// Thread safety: as absl::Mutex. Lock order is the owner's to state.

#ifndef CAPSTAN_UTIL_MUTEX_H_
#define CAPSTAN_UTIL_MUTEX_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#endif

namespace capstan::util {

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

  // absl::Mutex::AwaitWithTimeout: releases the mutex until cond holds or
  // timeout passes, then takes it back in the mode it was held in.
  // REQUIRES: held, in either mode.
  bool AwaitWithTimeout(const absl::Condition& cond, absl::Duration timeout)
      ABSL_SHARED_LOCKS_REQUIRED(this) {
    // A shared holder reads false: no writer holds the mutex meanwhile.
    const bool exclusive = exclusive_;
    const unsigned mode = exclusive ? kExclusive : kShared;
    TsanPreUnlock(mode);
    const bool ok = mu_.AwaitWithTimeout(cond, timeout);
    TsanPostUnlock(mode);
    TsanPreLock(mode);
    TsanPostLock(mode);
    // Writers that held the mutex during the wait cleared the flag.
    if (exclusive) exclusive_ = true;
    return ok;
  }

 private:
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
  // a holder in AwaitWithTimeout, so mu_ itself orders every access.
  bool exclusive_ = false;
};

class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

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
