#include "auth/jwt_token.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "auth/errors.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "openssl/bio.h"
#include "openssl/ec.h"
#include "openssl/ecdsa.h"
#include "openssl/evp.h"
#include "openssl/hmac.h"
#include "openssl/pem.h"
#include "openssl/rsa.h"
#include "openssl/x509.h"

namespace capstan::auth {
namespace {

// etcd's auth package errors.
absl::Status InvalidAuthOpts() { return absl::InvalidArgumentError("auth: invalid auth options"); }
absl::Status MissingKey() { return absl::InvalidArgumentError("auth: missing key data"); }

const EVP_MD* Digest(int bits) {
  switch (bits) {
    case 256:
      return EVP_sha256();
    case 384:
      return EVP_sha384();
    default:
      return EVP_sha512();
  }
}

// ES256/384/512 signatures are r||s, each the curve's size in bytes.
int EcFieldBytes(int hash_bits) { return hash_bits == 512 ? 66 : hash_bits / 8; }

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream s;
  s << in.rdbuf();
  *out = s.str();
  return true;
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;

BioPtr MemBio(const std::string& pem) {
  return BioPtr(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

bool IsPem(const std::string& data) { return data.find("-----BEGIN ") != std::string::npos; }

EVP_PKEY* ReadPrivateKey(const std::string& pem) {
  return PEM_read_bio_PrivateKey(MemBio(pem).get(), nullptr, nullptr, nullptr);
}

// A PKIX public key ("BEGIN PUBLIC KEY") or a certificate's key, as
// golang-jwt's ParseRSAPublicKeyFromPEM / ParseECPublicKeyFromPEM accept.
EVP_PKEY* ReadPublicKey(const std::string& pem) {
  if (EVP_PKEY* k = PEM_read_bio_PUBKEY(MemBio(pem).get(), nullptr, nullptr, nullptr)) return k;
  if (X509* cert = PEM_read_bio_X509(MemBio(pem).get(), nullptr, nullptr, nullptr)) {
    EVP_PKEY* k = X509_get_pubkey(cert);
    X509_free(cert);
    return k;
  }
  return nullptr;
}

std::string KindError(char family, bool priv) {
  return absl::StrCat("key is not a valid ", family == 'E' ? "ECDSA" : "RSA",
                      priv ? " private key" : " public key");
}

bool KeyFits(EVP_PKEY* k, char family) {
  const int id = EVP_PKEY_get_base_id(k);
  return family == 'E' ? id == EVP_PKEY_EC : id == EVP_PKEY_RSA || id == EVP_PKEY_RSA_PSS;
}

std::string Base64Url(const std::string& s) { return absl::WebSafeBase64Escape(s); }

}  // namespace

void JwtTokens::KeyDeleter::operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }

absl::StatusOr<std::unique_ptr<JwtTokens>> JwtTokens::Create(
    const std::map<std::string, std::string>& options) {
  auto get = [&](const char* name) -> std::string {
    auto it = options.find(name);
    return it == options.end() ? std::string() : it->second;
  };
  std::unique_ptr<JwtTokens> t(new JwtTokens());
  // jwtOptions.ParseWithDefaults: ttl, then the key files, then the method.
  t->ttl_ = absl::Minutes(5);
  if (std::string ttl = get("ttl"); !ttl.empty()) {
    if (!absl::ParseDuration(ttl, &t->ttl_) || ttl == "inf" || ttl == "-inf") {
      return InvalidAuthOpts();
    }
  }
  std::string pub, priv;
  if (std::string f = get("pub-key"); !f.empty() && !ReadFile(f, &pub)) return InvalidAuthOpts();
  if (std::string f = get("priv-key"); !f.empty() && !ReadFile(f, &priv)) return InvalidAuthOpts();
  const std::string method = get("sign-method");
  int bits = 0;
  if (method.size() != 5 || !absl::SimpleAtoi(method.substr(2), &bits) ||
      (bits != 256 && bits != 384 && bits != 512) ||
      (method.substr(0, 2) != "RS" && method.substr(0, 2) != "PS" &&
       method.substr(0, 2) != "ES" && method.substr(0, 2) != "HS")) {
    return InvalidAuthOpts();
  }
  t->method_ = method;
  t->family_ = method[0];
  t->hash_bits_ = bits;

  // jwtOptions.Key.
  if (t->family_ == 'H') {
    if (priv.empty()) return MissingKey();
    t->secret_ = priv;
    return t;
  }
  using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;
  const absl::Status not_pem =
      absl::InvalidArgumentError("invalid key: Key must be a PEM encoded PKCS1 or PKCS8 key");
  KeyPtr priv_key, pub_key;
  if (!priv.empty()) {
    if (!IsPem(priv)) return not_pem;
    priv_key.reset(ReadPrivateKey(priv));
    if (!priv_key || !KeyFits(priv_key.get(), t->family_)) {
      return absl::InvalidArgumentError(KindError(t->family_, true));
    }
  }
  if (!pub.empty()) {
    if (!IsPem(pub)) return not_pem;
    pub_key.reset(ReadPublicKey(pub));
    if (!pub_key || !KeyFits(pub_key.get(), t->family_)) {
      return absl::InvalidArgumentError(KindError(t->family_, false));
    }
  }
  if (!priv_key && !pub_key) return MissingKey();
  if (priv_key && pub_key && EVP_PKEY_eq(priv_key.get(), pub_key.get()) != 1) {
    return absl::InvalidArgumentError("auth: public and private keys don't match");
  }
  t->verify_only_ = !priv_key;
  t->key_ = priv_key ? std::move(priv_key) : std::move(pub_key);
  return t;
}

absl::StatusOr<std::string> JwtTokens::SignBytes(const std::string& data) const {
  const EVP_MD* md = Digest(hash_bits_);
  if (family_ == 'H') {
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    HMAC(md, secret_.data(), static_cast<int>(secret_.size()),
         reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac, &len);
    return std::string(reinterpret_cast<char*>(mac), len);
  }
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_PKEY_CTX* pctx = nullptr;
  std::string sig;
  size_t len = 0;
  bool ok = EVP_DigestSignInit(ctx, &pctx, md, nullptr, key_.get()) == 1;
  if (ok && family_ == 'P') {
    ok = EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) == 1 &&
         EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST) == 1;
  }
  ok = ok &&
       EVP_DigestSign(ctx, nullptr, &len, reinterpret_cast<const unsigned char*>(data.data()),
                      data.size()) == 1;
  if (ok) {
    sig.resize(len);
    ok = EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &len,
                        reinterpret_cast<const unsigned char*>(data.data()), data.size()) == 1;
    sig.resize(len);
  }
  EVP_MD_CTX_free(ctx);
  if (!ok) return absl::InternalError("jwt: signing failed");
  if (family_ != 'E') return sig;
  // DER ECDSA-Sig-Value to JWS's fixed-size r||s.
  const unsigned char* p = reinterpret_cast<const unsigned char*>(sig.data());
  ECDSA_SIG* es = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(sig.size()));
  if (!es) return absl::InternalError("jwt: bad ECDSA signature");
  const int n = EcFieldBytes(hash_bits_);
  std::string raw(2 * n, '\0');
  const bool fits =
      BN_bn2binpad(ECDSA_SIG_get0_r(es), reinterpret_cast<unsigned char*>(raw.data()), n) == n &&
      BN_bn2binpad(ECDSA_SIG_get0_s(es), reinterpret_cast<unsigned char*>(raw.data()) + n, n) == n;
  ECDSA_SIG_free(es);
  // golang-jwt refuses a key whose curve does not match the method.
  if (!fits || EVP_PKEY_get_bits(key_.get()) != (hash_bits_ == 512 ? 521 : hash_bits_)) {
    return absl::InvalidArgumentError("key is invalid");
  }
  return raw;
}

bool JwtTokens::VerifyBytes(const std::string& data, const std::string& signature) const {
  const EVP_MD* md = Digest(hash_bits_);
  if (family_ == 'H') {
    auto mac = SignBytes(data);
    return mac.ok() && mac->size() == signature.size() &&
           CRYPTO_memcmp(mac->data(), signature.data(), signature.size()) == 0;
  }
  std::string der = signature;
  if (family_ == 'E') {
    const int n = EcFieldBytes(hash_bits_);
    if (signature.size() != static_cast<size_t>(2 * n) ||
        EVP_PKEY_get_bits(key_.get()) != (hash_bits_ == 512 ? 521 : hash_bits_)) {
      return false;
    }
    ECDSA_SIG* es = ECDSA_SIG_new();
    const auto* raw = reinterpret_cast<const unsigned char*>(signature.data());
    ECDSA_SIG_set0(es, BN_bin2bn(raw, n, nullptr), BN_bin2bn(raw + n, n, nullptr));
    unsigned char* out = nullptr;
    const int len = i2d_ECDSA_SIG(es, &out);
    ECDSA_SIG_free(es);
    if (len <= 0) return false;
    der.assign(reinterpret_cast<char*>(out), static_cast<size_t>(len));
    OPENSSL_free(out);
  }
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_PKEY_CTX* pctx = nullptr;
  bool ok = EVP_DigestVerifyInit(ctx, &pctx, md, nullptr, key_.get()) == 1;
  if (ok && family_ == 'P') {
    ok = EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) == 1 &&
         EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_AUTO) == 1;
  }
  ok = ok && EVP_DigestVerify(ctx, reinterpret_cast<const unsigned char*>(der.data()), der.size(),
                              reinterpret_cast<const unsigned char*>(data.data()),
                              data.size()) == 1;
  EVP_MD_CTX_free(ctx);
  return ok;
}

absl::StatusOr<std::string> JwtTokens::Sign(const std::string& user, uint64_t revision,
                                            absl::Time now) const {
  if (verify_only_) {
    return absl::UnknownError("auth: token signing attempted with verify-only key");
  }
  google::protobuf::Value name;
  name.set_string_value(user);
  std::string quoted;
  if (!google::protobuf::util::MessageToJsonString(name, &quoted).ok()) {
    return absl::InternalError("jwt: cannot encode the user name");
  }
  // golang-jwt marshals both maps with sorted keys.
  const std::string header = absl::StrCat(R"({"alg":")", method_, R"(","typ":"JWT"})");
  const std::string claims =
      absl::StrCat(R"({"exp":)", absl::ToUnixSeconds(now + ttl_), R"(,"revision":)", revision,
                   R"(,"username":)", quoted, "}");
  const std::string signing_input = absl::StrCat(Base64Url(header), ".", Base64Url(claims));
  auto sig = SignBytes(signing_input);
  if (!sig.ok()) return sig.status();
  return absl::StrCat(signing_input, ".", Base64Url(*sig));
}

absl::StatusOr<JwtClaims> JwtTokens::Verify(const std::string& token, absl::Time now) const {
  const absl::Status invalid = MakeError(Error::kInvalidAuthToken);
  std::vector<std::string> parts = absl::StrSplit(token, '.');
  if (parts.size() != 3) return invalid;
  std::string header_json, claims_json, sig;
  if (!absl::WebSafeBase64Unescape(parts[0], &header_json) ||
      !absl::WebSafeBase64Unescape(parts[1], &claims_json) ||
      !absl::WebSafeBase64Unescape(parts[2], &sig)) {
    return invalid;
  }
  google::protobuf::Struct header, claims;
  if (!google::protobuf::util::JsonStringToMessage(header_json, &header).ok() ||
      !google::protobuf::util::JsonStringToMessage(claims_json, &claims).ok()) {
    return invalid;
  }
  // The method must be the configured one (no "none", no algorithm swap).
  auto alg = header.fields().find("alg");
  if (alg == header.fields().end() || alg->second.string_value() != method_) return invalid;
  if (!VerifyBytes(absl::StrCat(parts[0], ".", parts[1]), sig)) return invalid;
  const auto& f = claims.fields();
  // golang-jwt MapClaims.Valid: an exp, if present, must be in the future.
  if (auto exp = f.find("exp"); exp != f.end()) {
    if (exp->second.kind_case() != google::protobuf::Value::kNumberValue ||
        static_cast<int64_t>(exp->second.number_value()) < absl::ToUnixSeconds(now)) {
      return invalid;
    }
  }
  auto user = f.find("username");
  auto rev = f.find("revision");
  if (user == f.end() || user->second.kind_case() != google::protobuf::Value::kStringValue ||
      rev == f.end() || rev->second.kind_case() != google::protobuf::Value::kNumberValue ||
      rev->second.number_value() < 0) {
    return invalid;
  }
  return JwtClaims{user->second.string_value(), static_cast<uint64_t>(rev->second.number_value())};
}

}  // namespace capstan::auth
