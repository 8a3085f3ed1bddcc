// Conversions between gRPC byte buffers and strings for raw methods.

#ifndef CAPSTAN_SERVER_API_GRPC_BUFFERS_H_
#define CAPSTAN_SERVER_API_GRPC_BUFFERS_H_

#include <string>
#include <vector>

#include "grpcpp/support/byte_buffer.h"

namespace capstan::server {

// Concatenates a ByteBuffer into one string. False if it cannot be read.
bool FlattenBuffer(const grpc::ByteBuffer& buffer, std::string* out);

// Moves a string into a ByteBuffer without copying its bytes.
void StringToBuffer(std::string&& bytes, grpc::ByteBuffer* out);

// Moves strings into a ByteBuffer, in order, as one message, without copying
// their bytes.
void PartsToBuffer(std::vector<std::string>&& parts, grpc::ByteBuffer* out);

// Copies strings into a ByteBuffer of one slice, in order, as one message: for
// small messages, one allocation instead of one owner per part.
void CopyPartsToBuffer(const std::vector<std::string>& parts, grpc::ByteBuffer* out);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_GRPC_BUFFERS_H_
