// RocksDB's view of a storage::FileSystem: the Env a backend opens with.
// Private to storage/ (it names RocksDB types); include it from .cc files only.

#ifndef CAPSTAN_STORAGE_ROCKS_FILE_SYSTEM_H_
#define CAPSTAN_STORAGE_ROCKS_FILE_SYSTEM_H_

#include <memory>

#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "storage/backend.h"

namespace capstan::storage {

struct FileSystem::Rocks {
  std::shared_ptr<rocksdb::FileSystem> fs;
  // An Env doing its file I/O through fs (rocksdb::NewCompositeEnv).
  std::unique_ptr<rocksdb::Env> env;
};

}  // namespace capstan::storage

#endif  // CAPSTAN_STORAGE_ROCKS_FILE_SYSTEM_H_
