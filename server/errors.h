// The one place where Capstan's errors become etcd's gRPC codes and texts.

#ifndef CAPSTAN_SERVER_ERRORS_H_
#define CAPSTAN_SERVER_ERRORS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace capstan::server {

// Maps a status from the layers below to the grpc::Status etcd would send:
// a named mvcc::Error gets etcd's code and exact text ("etcdserver: ...");
// anything else keeps its code with its message.
grpc::Status ToGrpcStatus(const absl::Status& s);

// etcd's maintenance server returns the auth store's errors unconverted:
// clients see code Unknown with the auth package's text ("auth: permission
// denied"). Maps an auth error that way; anything else as ToGrpcStatus.
grpc::Status ToUnconvertedAuthStatus(const absl::Status& s);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_ERRORS_H_
