// Names for Capstan's own threads, so that `top -H`, `perf` and /proc show
// which thread is the committer and which one builds a big list.

#ifndef CAPSTAN_UTIL_THREAD_NAME_H_
#define CAPSTAN_UTIL_THREAD_NAME_H_

#include <pthread.h>

#include <string>
#include <thread>
#include <utility>

namespace capstan {

// Starts a thread named `name` (Linux keeps the first 15 characters) that
// runs `fn`.
template <typename Fn>
std::thread NamedThread(std::string name, Fn&& fn) {
  return std::thread([name = std::move(name), fn = std::forward<Fn>(fn)]() mutable {
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    fn();
  });
}

}  // namespace capstan

#endif  // CAPSTAN_UTIL_THREAD_NAME_H_
