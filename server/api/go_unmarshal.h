// What etcd says about a request that does not decode.
//
// etcd decodes requests with the Unmarshal methods gogo/protobuf generated
// for its messages, and Go gRPC answers a failure with INTERNAL and that
// method's error: "unexpected EOF", "proto: wrong wireType = 0 for field
// Key", "proto: integer overflow" and so on. GoUnmarshalError walks the
// bytes as those methods do, by the message's descriptor, and returns the
// same text. It also refuses what C++ protobuf would take and etcd does not:
// a known field sent with another wire type.
//
// C++ protobuf's setters take any bytes in a string field, so a name that
// is not UTF-8 reaches Capstan as it reaches etcd; serializing it into a
// response logs protobuf's complaint, and the bytes go out unchanged.

#ifndef CAPSTAN_SERVER_API_GO_UNMARSHAL_H_
#define CAPSTAN_SERVER_API_GO_UNMARSHAL_H_

#include <string>
#include <string_view>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"

namespace capstan::server {

// The error etcd's generated Unmarshal gives for data as a message of
// `type`, or "" if it decodes.
std::string GoUnmarshalError(const google::protobuf::Descriptor& type, std::string_view data);

// Decodes data into message as etcd would: "" on success, else the error
// text that follows Go gRPC's prefix. What gogo takes and C++ protobuf
// refuses (a string that is not UTF-8, an unknown group closed by another
// field's end tag) is decoded as gogo decodes it; only messages nested more
// than 100 deep, which C++ protobuf cannot hold, are refused where etcd
// takes them.
std::string DecodeAsEtcd(std::string_view data, google::protobuf::Message* message);
// DecodeAsEtcd of a request received from a client, whose bytes are counted
// in etcd_network_client_grpc_received_bytes_total (client_traffic.h).
std::string DecodeReceived(const grpc::ByteBuffer& buffer, google::protobuf::Message* message);

// The decoding DecodeAsEtcd falls back to, by itself (tests and fuzzing
// compare it with C++ protobuf's).
std::string DecodeLikeGogo(std::string_view data, google::protobuf::Message* message);

// What Go's gRPC server, and so etcd, answers for a unary request that
// does not decode, and ends a stream with for a streamed message that does
// not; error is DecodeAsEtcd's text.
grpc::Status UnmarshalStatus(const std::string& error);
grpc::Status StreamUnmarshalStatus(const std::string& error);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_GO_UNMARSHAL_H_
