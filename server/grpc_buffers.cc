#include "server/grpc_buffers.h"

#include <vector>

namespace capstan::server {

bool FlattenBuffer(const grpc::ByteBuffer& buffer, std::string* out) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  out->clear();
  out->reserve(buffer.Length());
  for (const auto& s : slices) out->append(reinterpret_cast<const char*>(s.begin()), s.size());
  return true;
}

void StringToBuffer(std::string&& bytes, grpc::ByteBuffer* out) {
  auto* owned = new std::string(std::move(bytes));
  grpc::Slice slice(owned->data(), owned->size(),
                    [](void* p) { delete static_cast<std::string*>(p); }, owned);
  grpc::ByteBuffer buffer(&slice, 1);
  out->Swap(&buffer);
}

}  // namespace capstan::server
