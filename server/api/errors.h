// The one place where Capstan's errors become etcd's gRPC codes and texts.

#ifndef CAPSTAN_SERVER_API_ERRORS_H_
#define CAPSTAN_SERVER_API_ERRORS_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"
#include "grpcpp/support/string_ref.h"

namespace capstan::membership {
struct MemberInfo;
}  // namespace capstan::membership

namespace capstan::server {

// Maps a status from the layers below to the grpc::Status etcd would send:
// a named mvcc::Error gets etcd's code and exact text ("etcdserver: ...");
// anything else keeps its code with its message.
grpc::Status ToGrpcStatus(const absl::Status& s);
// The error's text as etcd's server holds it, before its gRPC layer maps it
// (what etcd's metrics label errors with): the gRPC text, except that
// etcd's membership errors keep their own ("membership: ID not found").
std::string EtcdInternalText(const absl::Status& s);

// etcd's maintenance server returns the auth store's errors unconverted:
// clients see code Unknown with the auth package's text ("auth: permission
// denied"). Maps an auth error that way; anything else as ToGrpcStatus.
grpc::Status ToUnconvertedAuthStatus(const absl::Status& s);

// etcd's learner interceptor: a learner serves only Maintenance.Status,
// serializable ranges and Maintenance.Snapshot; every other call gets
// "etcdserver: rpc not supported for learner". OK when `member` is not a
// learner (or null).
absl::Status LearnerRefusal(const membership::MemberInfo* member);

// etcd's stream interceptor: a client that asks for a leader (metadata
// "hasleader: true", clientv3.WithRequireLeader) is refused with
// Unavailable "etcdserver: no leader" while the member knows none.
// RequiresLeader says whether it asked (and the member is in a Raft group).
bool RequiresLeader(const std::multimap<grpc::string_ref, grpc::string_ref>& client_metadata,
                    const membership::MemberInfo* member);
grpc::Status NoLeaderStatus();

// Go gRPC's name of a status code ("InvalidArgument", "Unauthenticated").
const char* GoCodeName(grpc::StatusCode code);

// A status as a Go client prints it, which etcd puts in texts such as a
// watch's cancel reason: "rpc error: code = PermissionDenied desc = ...".
std::string GoErrorText(const grpc::Status& s);

// The cancel reason etcd gives a watcher it refuses to create (its watch
// server's isWatchPermitted): a bad token, an old auth revision and no user
// keep their own error; anything else reads as "permission denied".
std::string WatchRefusalReason(const absl::Status& s);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_ERRORS_H_
