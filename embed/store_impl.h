// The implementation side of capstan::Store, shared by the files of
// embed/.

#ifndef CAPSTAN_EMBED_STORE_IMPL_H_
#define CAPSTAN_EMBED_STORE_IMPL_H_

#include <memory>

#include "capstan/capstan.h"
#include "server/server.h"

namespace capstan {

// A Store is a server::Server opened on its data directory, serving
// (listening) only when client URLs were given.
struct Store::Impl {
  std::unique_ptr<server::Server> server;
};

}  // namespace capstan

#endif  // CAPSTAN_EMBED_STORE_IMPL_H_
