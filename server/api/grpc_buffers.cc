#include "server/api/grpc_buffers.h"

#include <cstring>
#include <vector>

#include "grpc/slice.h"

namespace capstan::server {

bool FlattenBuffer(const grpc::ByteBuffer& buffer, std::string* out) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  out->clear();
  out->reserve(buffer.Length());
  for (const auto& s : slices) out->append(reinterpret_cast<const char*>(s.begin()), s.size());
  return true;
}

namespace {

grpc::Slice OwningSlice(std::string&& bytes) {
  auto* owned = new std::string(std::move(bytes));
  return grpc::Slice(owned->data(), owned->size(),
                     [](void* p) { delete static_cast<std::string*>(p); }, owned);
}

}  // namespace

void StringToBuffer(std::string&& bytes, grpc::ByteBuffer* out) {
  grpc::Slice slice = OwningSlice(std::move(bytes));
  grpc::ByteBuffer buffer(&slice, 1);
  out->Swap(&buffer);
}

void PartsToBuffer(std::vector<std::string>&& parts, grpc::ByteBuffer* out) {
  std::vector<grpc::Slice> slices;
  slices.reserve(parts.size());
  for (auto& p : parts) {
    if (!p.empty()) slices.push_back(OwningSlice(std::move(p)));
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  out->Swap(&buffer);
}

void CopyPartsToBuffer(const std::vector<std::string>& parts, grpc::ByteBuffer* out) {
  size_t total = 0;
  for (const auto& p : parts) total += p.size();
  grpc_slice raw = grpc_slice_malloc(total);
  char* at = reinterpret_cast<char*>(GRPC_SLICE_START_PTR(raw));
  for (const auto& p : parts) {
    std::memcpy(at, p.data(), p.size());
    at += p.size();
  }
  grpc::Slice slice(raw, grpc::Slice::STEAL_REF);
  grpc::ByteBuffer buffer(&slice, 1);
  out->Swap(&buffer);
}

}  // namespace capstan::server
