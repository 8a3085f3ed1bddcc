// JwtTokens: etcd's JWT auth tokens (--auth-token jwt,...), signed and
// verified with OpenSSL.
//
// A token is "<header>.<claims>.<signature>" in base64url without padding,
// as etcd issues it: header {"alg":"RS256","typ":"JWT"}, claims
// {"exp":<unix seconds>,"revision":<auth revision>,"username":"<name>"}.
// Supported sign methods are etcd's (golang-jwt's): RS256/384/512 and
// PS256/384/512 with an RSA key, ES256/384/512 with an EC key of the matching
// curve, HS256/384/512 with priv-key's bytes as the secret. With only a
// public key the provider verifies tokens but cannot issue them.
//
// Thread safety: immutable after Create; every method may be called from any
// thread.

#ifndef CAPSTAN_AUTH_JWT_TOKEN_H_
#define CAPSTAN_AUTH_JWT_TOKEN_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

typedef struct evp_pkey_st EVP_PKEY;

namespace capstan::auth {

// What a verified token says.
struct JwtClaims {
  std::string username;
  uint64_t revision = 0;
};

class JwtTokens {
 public:
  // etcd's newTokenProviderJWT over the options after "jwt," ("sign-method",
  // "pub-key", "priv-key", "ttl"; others are ignored). Errors carry etcd's
  // texts: "auth: invalid auth options" for a bad sign method, ttl or an
  // unreadable file; "auth: missing key data"; "auth: public and private keys
  // don't match"; golang-jwt's "key is not a valid RSA private key" and
  // kin for keys of the wrong kind.
  static absl::StatusOr<std::unique_ptr<JwtTokens>> Create(
      const std::map<std::string, std::string>& options);
  JwtTokens(const JwtTokens&) = delete;
  JwtTokens& operator=(const JwtTokens&) = delete;

  // A token for user at auth revision, expiring ttl() after now. Fails with
  // "auth: token signing attempted with verify-only key" without a private
  // key.
  absl::StatusOr<std::string> Sign(const std::string& user, uint64_t revision,
                                   absl::Time now) const;
  // The claims of a well-formed token signed by this key with this method
  // and not expired at now; kInvalidAuthToken otherwise.
  absl::StatusOr<JwtClaims> Verify(const std::string& token, absl::Time now) const;

  absl::Duration ttl() const { return ttl_; }
  const std::string& sign_method() const { return method_; }
  bool verify_only() const { return verify_only_; }

 private:
  JwtTokens() = default;
  absl::StatusOr<std::string> SignBytes(const std::string& data) const;
  bool VerifyBytes(const std::string& data, const std::string& signature) const;

  std::string method_;  // e.g. "RS256"
  char family_ = 0;     // 'R' (PKCS#1 v1.5), 'P' (PSS), 'E' (ECDSA), 'H' (HMAC)
  int hash_bits_ = 0;   // 256, 384, 512
  absl::Duration ttl_;
  bool verify_only_ = false;
  struct KeyDeleter {
    void operator()(EVP_PKEY* k) const;
  };
  std::string secret_;                         // HMAC
  std::unique_ptr<EVP_PKEY, KeyDeleter> key_;  // private unless verify_only_
};

}  // namespace capstan::auth

#endif  // CAPSTAN_AUTH_JWT_TOKEN_H_
