// Requests decoded as etcd decodes them (server/go_unmarshal): the first
// byte picks a request type of any service, the rest is decoded. Nothing
// may crash, and where C++ protobuf and gogo both take the bytes, the
// gogo-style decoding must give what C++ protobuf gives (unknown fields
// aside, which gogo drops).

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "etcdserverpb/rpc.pb.h"
#include "server/api/go_unmarshal.h"
#include "v3electionpb/v3election.pb.h"
#include "v3lockpb/v3lock.pb.h"

namespace {

std::unique_ptr<google::protobuf::Message> NewRequest(uint8_t pick) {
  using namespace etcdserverpb;  // NOLINT
  switch (pick % 12) {
    case 0: return std::make_unique<RangeRequest>();
    case 1: return std::make_unique<PutRequest>();
    case 2: return std::make_unique<DeleteRangeRequest>();
    case 3: return std::make_unique<TxnRequest>();
    case 4: return std::make_unique<WatchRequest>();
    case 5: return std::make_unique<LeaseGrantRequest>();
    case 6: return std::make_unique<LeaseTimeToLiveRequest>();
    case 7: return std::make_unique<AuthUserAddRequest>();
    case 8: return std::make_unique<AuthRoleGrantPermissionRequest>();
    case 9: return std::make_unique<AlarmRequest>();
    case 10: return std::make_unique<v3lockpb::LockRequest>();
    default: return std::make_unique<v3electionpb::CampaignRequest>();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto message = NewRequest(data[0]);
  const std::string error = capstan::server::DecodeAsEtcd(bytes, message.get());
  auto cpp = NewRequest(data[0]);
  auto gogo = NewRequest(data[0]);
  const bool cpp_ok = cpp->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  const std::string gogo_error = capstan::server::DecodeLikeGogo(bytes, gogo.get());
  // DecodeAsEtcd refuses only what the walker refuses, with its text
  // (the walker alone also refuses nesting C++ protobuf may still hold).
  if (gogo_error.empty() && !error.empty()) abort();
  if (!gogo_error.empty() && gogo_error != error &&
      gogo_error != "proto: cannot parse invalid wire-format data") {
    abort();
  }
  if (cpp_ok && gogo_error.empty()) {
    cpp->DiscardUnknownFields();
    if (cpp->SerializeAsString() != gogo->SerializeAsString()) abort();
  }
  return 0;
}
