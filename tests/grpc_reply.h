// A gRPC call's outcome as tests compare it between etcd and Capstan: the
// status code and message (OK is code 0 with an empty message).

#ifndef CAPSTAN_TESTS_GRPC_REPLY_H_
#define CAPSTAN_TESTS_GRPC_REPLY_H_

#include <ostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/status.h"

namespace capstan::testing {

struct Reply {
  int code = -1;
  std::string message;
  std::string ToString() const { return absl::StrCat(code, " ", message); }
  bool operator==(const Reply& o) const { return code == o.code && message == o.message; }
};

inline void PrintTo(const Reply& r, std::ostream* os) { *os << r.ToString(); }

inline Reply ReplyOf(const grpc::Status& s) { return Reply{s.error_code(), s.error_message()}; }

}  // namespace capstan::testing

#endif  // CAPSTAN_TESTS_GRPC_REPLY_H_
