// C shims between libcapstan's callbacks and Go: an exported Go function
// cannot take const pointers, and user_data carries a runtime/cgo.Handle.

#include <stdint.h>

#include <capstan/capstan_c.h>

#include "_cgo_export.h"

static void cacheWatchTrampoline(void* user_data, const capstan_cache_event* events,
                                 size_t num_events, int end_code, const char* end_message) {
  goCacheWatchEvents((uintptr_t)user_data, (capstan_cache_event*)events, num_events, end_code,
                     (char*)end_message);
}

int openCacheWatch(capstan_store* store, capstan_cache_watch_options* options, uintptr_t handle,
                   capstan_cache_watch** watch, char** error) {
  return capstan_cache_watch_open(store, options, cacheWatchTrampoline, (void*)handle, watch,
                                  error);
}
