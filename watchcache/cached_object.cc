#include "watchcache/cached_object.h"

#include <cstring>
#include <new>
#include <vector>

#include "mvcc/kv_codec.h"
#include "util/check.h"

namespace capstan::watchcache {
namespace {

constexpr uint32_t kAbsent = 0xffffffffu;

size_t AlignUp(size_t v, size_t a) { return (v + a - 1) & ~(a - 1); }

}  // namespace

ObjectRef CachedObject::Create(ObjectAllocator* alloc, std::string_view kv_record,
                               const Extracted& ex) {
  mvcc::KeyValueView kv;
  if (!mvcc::DecodeKeyValue(kv_record, &kv)) return ObjectRef();
  const char* base = kv_record.data();
  auto inside = [&](std::string_view v) {
    return v.data() >= base && v.data() + v.size() <= base + kv_record.size();
  };
  const size_t nf = ex.decoded ? ex.fields.size() : 0;
  const size_t nl = ex.decoded ? ex.labels.size() : 0;
  // Extracted strings that are not substrings of the record (unescaped JSON)
  // are copied after the table.
  size_t extra = 0;
  for (size_t i = 0; i < nf; ++i) {
    if (ex.fields[i] && !inside(*ex.fields[i])) extra += ex.fields[i]->size();
  }
  for (size_t j = 0; j < nl; ++j) {
    if (!inside(ex.labels[j].first)) extra += ex.labels[j].first.size();
    if (!inside(ex.labels[j].second)) extra += ex.labels[j].second.size();
  }
  const size_t table_off = AlignUp(kv_record.size(), 4);
  const size_t table_bytes = (nf * 2 + nl * 4) * sizeof(uint32_t);
  const size_t total = sizeof(CachedObject) + table_off + table_bytes + extra;
  CHECK(total < (size_t{1} << 32)) << "object too large: " << total;

  void* mem = alloc->Allocate(total);
  auto* o = new (mem) CachedObject();
  o->block_size_ = static_cast<uint32_t>(total);
  o->alloc_ = alloc;
  o->mod_revision_ = kv.mod_revision;
  o->create_revision_ = kv.create_revision;
  o->version_ = kv.version;
  o->lease_ = kv.lease;
  o->kv_size_ = static_cast<uint32_t>(kv_record.size());
  o->key_off_ = static_cast<uint32_t>(kv.key.data() - base);
  o->key_size_ = static_cast<uint32_t>(kv.key.size());
  o->value_off_ = static_cast<uint32_t>(kv.value.data() - base);
  o->value_size_ = static_cast<uint32_t>(kv.value.size());
  if (kv.value.empty()) o->value_off_ = 0;
  o->table_off_ = static_cast<uint32_t>(table_off);
  o->num_fields_ = static_cast<uint16_t>(nf);
  o->num_labels_ = static_cast<uint16_t>(nl);
  o->decoded_ = ex.decoded ? 1 : 0;
  char* d = o->data();
  std::memcpy(d, kv_record.data(), kv_record.size());
  auto* table = reinterpret_cast<uint32_t*>(d + table_off);
  size_t extra_at = table_off + table_bytes;
  auto place = [&](std::string_view v, uint32_t* slot) {
    if (inside(v)) {
      slot[0] = static_cast<uint32_t>(v.data() - base);
    } else {
      if (!v.empty()) std::memcpy(d + extra_at, v.data(), v.size());
      slot[0] = static_cast<uint32_t>(extra_at);
      extra_at += v.size();
    }
    slot[1] = static_cast<uint32_t>(v.size());
  };
  for (size_t i = 0; i < nf; ++i) {
    if (ex.fields[i]) {
      place(*ex.fields[i], &table[i * 2]);
    } else {
      table[i * 2] = kAbsent;
      table[i * 2 + 1] = 0;
    }
  }
  for (size_t j = 0; j < nl; ++j) {
    place(ex.labels[j].first, &table[nf * 2 + j * 4]);
    place(ex.labels[j].second, &table[nf * 2 + j * 4 + 2]);
  }
  return ObjectRef::Adopt(o);
}

const uint32_t* CachedObject::table() const {
  return reinterpret_cast<const uint32_t*>(data() + table_off_);
}

std::string_view CachedObject::field(int i) const {
  if (i < 0 || i >= num_fields_) return {};
  const uint32_t* t = table() + i * 2;
  if (t[0] == kAbsent) return {};
  return {data() + t[0], t[1]};
}

std::pair<std::string_view, std::string_view> CachedObject::label(int j) const {
  const uint32_t* t = table() + num_fields_ * 2 + j * 4;
  return {{data() + t[0], t[1]}, {data() + t[2], t[3]}};
}

std::optional<std::string_view> CachedObject::FindLabel(std::string_view key) const {
  int lo = 0, hi = num_labels_;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    auto [k, v] = label(mid);
    if (k < key) {
      lo = mid + 1;
    } else if (k > key) {
      hi = mid;
    } else {
      return v;
    }
  }
  return std::nullopt;
}

void CachedObject::Unref() const {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  ObjectAllocator* alloc = alloc_;
  const size_t n = block_size_;
  auto* self = const_cast<CachedObject*>(this);
  self->~CachedObject();
  alloc->Free(self, n);
}

}  // namespace capstan::watchcache
