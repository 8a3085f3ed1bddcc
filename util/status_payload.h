// Named errors as values: an absl::Status that carries an enumerator of a
// layer's error enum as a payload under that layer's URL, so that the one
// table in server/api/errors.cc can map it to etcd's gRPC code and text.
//
// Thread safety: pure functions.

#ifndef CAPSTAN_UTIL_STATUS_PAYLOAD_H_
#define CAPSTAN_UTIL_STATUS_PAYLOAD_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace capstan::util {

// A status of `code` and `text` carrying `e` under `url`.
template <typename E>
absl::Status StatusWithPayload(absl::StatusCode code, absl::string_view text, absl::string_view url,
                               E e) {
  absl::Status s(code, text);
  s.SetPayload(url, absl::Cord(std::to_string(static_cast<int>(e))));
  return s;
}

// The enumerator s carries under `url`, if any.
template <typename E>
std::optional<E> PayloadOf(const absl::Status& s, absl::string_view url) {
  auto payload = s.GetPayload(url);
  if (!payload) return std::nullopt;
  return static_cast<E>(std::stoi(std::string(*payload)));
}

}  // namespace capstan::util

#endif  // CAPSTAN_UTIL_STATUS_PAYLOAD_H_
