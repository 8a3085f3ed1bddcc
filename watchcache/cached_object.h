// CachedObject: one version of one stored object, as the cache holds it.
//
// A CachedObject is one immutable block from an ObjectAllocator holding the
// object's stored mvccpb.KeyValue record (the bytes List and Watch send, and
// the key the cache orders by) and the values extracted from it for
// selectors and indexes. It is reference-counted: the current-state tree,
// every snapshot that holds it, the event ring and every watcher queue that
// holds an event share the one block; nothing is copied per watcher or per
// snapshot.
//
// Thread safety: immutable after Create; ObjectRef may be copied and
// destroyed on any thread. The allocator must outlive every ObjectRef.

#ifndef CAPSTAN_WATCHCACHE_CACHED_OBJECT_H_
#define CAPSTAN_WATCHCACHE_CACHED_OBJECT_H_

#include <atomic>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>

#include "watchcache/index_extractor.h"
#include "watchcache/slab_allocator.h"

namespace capstan::watchcache {

class ObjectRef;

class CachedObject {
 public:
  // Copies `kv_record` (an encoded mvccpb.KeyValue) and the extracted values
  // into one new block. Returns null if kv_record is not a KeyValue.
  // REQUIRES: ex's views point into kv_record or into ex's own storage.
  static ObjectRef Create(ObjectAllocator* alloc, std::string_view kv_record,
                          const Extracted& ex);

  CachedObject(const CachedObject&) = delete;
  CachedObject& operator=(const CachedObject&) = delete;

  // The encoded mvccpb.KeyValue record, as stored.
  std::string_view kv() const { return {data(), kv_size_}; }
  std::string_view key() const { return {data() + key_off_, key_size_}; }
  std::string_view value() const { return {data() + value_off_, value_size_}; }
  int64_t mod_revision() const { return mod_revision_; }
  int64_t create_revision() const { return create_revision_; }
  int64_t version() const { return version_; }
  int64_t lease() const { return lease_; }

  // False when the value could not be decoded (not k8s protobuf or JSON, or
  // malformed): the object is cached, listed and watched, but has no fields
  // or labels, so only selectors that need none match it.
  bool decoded() const { return decoded_ != 0; }
  // Field i of the resource's ResourceSpec; "" when absent (as Kubernetes'
  // field selectors see an unset field).
  std::string_view field(int i) const;
  int num_fields() const { return num_fields_; }
  // Labels, sorted by key.
  int num_labels() const { return num_labels_; }
  std::pair<std::string_view, std::string_view> label(int j) const;
  std::optional<std::string_view> FindLabel(std::string_view key) const;

  // Bytes of the block (header, record and extracted values).
  size_t block_size() const { return block_size_; }

  // Manual reference counting for holders that cannot keep an ObjectRef
  // (a gRPC slice's destroy callback).
  void Ref() const { refs_.fetch_add(1, std::memory_order_relaxed); }
  void Unref() const;

 private:
  CachedObject() = default;
  const char* data() const { return reinterpret_cast<const char*>(this + 1); }
  char* data() { return reinterpret_cast<char*>(this + 1); }
  const uint32_t* table() const;

  mutable std::atomic<uint32_t> refs_{1};
  uint32_t block_size_ = 0;
  ObjectAllocator* alloc_ = nullptr;
  int64_t mod_revision_ = 0, create_revision_ = 0, version_ = 0, lease_ = 0;
  uint32_t kv_size_ = 0, key_off_ = 0, key_size_ = 0, value_off_ = 0, value_size_ = 0;
  uint32_t table_off_ = 0;  // (offset, size) per field, then (k off, k size, v off, v size) per label
  uint16_t num_fields_ = 0, num_labels_ = 0;
  uint8_t decoded_ = 0;
};

// A counted reference to a CachedObject. Copying costs one atomic increment.
class ObjectRef {
 public:
  ObjectRef() = default;
  ObjectRef(const ObjectRef& o) : p_(o.p_) {
    if (p_) p_->Ref();
  }
  ObjectRef(ObjectRef&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  ObjectRef& operator=(ObjectRef o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~ObjectRef() {
    if (p_) p_->Unref();
  }

  // Takes over one reference the caller owns.
  static ObjectRef Adopt(const CachedObject* p) {
    ObjectRef r;
    r.p_ = p;
    return r;
  }
  // A new reference to p (which the caller keeps alive meanwhile).
  static ObjectRef Share(const CachedObject* p) {
    if (p) p->Ref();
    return Adopt(p);
  }
  // Gives up ownership of the reference without dropping it.
  const CachedObject* Release() { return std::exchange(p_, nullptr); }

  const CachedObject* get() const { return p_; }
  const CachedObject* operator->() const { return p_; }
  const CachedObject& operator*() const { return *p_; }
  explicit operator bool() const { return p_ != nullptr; }
  void reset() { ObjectRef().swap(*this); }
  void swap(ObjectRef& o) noexcept { std::swap(p_, o.p_); }

 private:
  const CachedObject* p_ = nullptr;
};

}  // namespace capstan::watchcache

#endif  // CAPSTAN_WATCHCACHE_CACHED_OBJECT_H_
