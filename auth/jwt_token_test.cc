#include "auth/jwt_token.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "auth/errors.h"
#include "gtest/gtest.h"
#include "openssl/evp.h"
#include "openssl/pem.h"

namespace capstan::auth {
namespace {

namespace fs = std::filesystem;

// Key files in a temp dir, made with OpenSSL.
class JwtTokensTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / absl::StrCat("capstan-jwt-", getpid(), "-", rand());
    fs::create_directories(dir_);
    WriteKeyPair(EVP_RSA_gen(2048), "rsa");
    WriteKeyPair(EVP_RSA_gen(2048), "rsa2");
    WriteKeyPair(EVP_EC_gen("P-256"), "ec256");
    WriteKeyPair(EVP_EC_gen("P-384"), "ec384");
    WriteKeyPair(EVP_EC_gen("P-521"), "ec521");
    std::ofstream(Path("secret")) << "a shared secret";
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string Path(const std::string& name) { return (dir_ / name).string(); }

  static void WriteKeyPair(EVP_PKEY* key, const std::string& name) {
    FILE* priv = std::fopen(Path(name + ".key").c_str(), "w");
    FILE* pub = std::fopen(Path(name + ".pub").c_str(), "w");
    if (!key || !priv || !pub) std::abort();
    PEM_write_PrivateKey(priv, key, nullptr, nullptr, 0, nullptr, nullptr);
    PEM_write_PUBKEY(pub, key);
    std::fclose(priv);
    std::fclose(pub);
    EVP_PKEY_free(key);
  }

  static absl::StatusOr<std::unique_ptr<JwtTokens>> Make(std::map<std::string, std::string> opts) {
    for (const char* k : {"priv-key", "pub-key"}) {
      if (opts.count(k) && !opts[k].empty() && opts[k][0] != '/') opts[k] = Path(opts[k]);
    }
    return JwtTokens::Create(opts);
  }

  static fs::path dir_;
};

fs::path JwtTokensTest::dir_;

const absl::Time kNow = absl::FromUnixSeconds(1700000000);

TEST_F(JwtTokensTest, EverySignMethodSignsAndVerifies) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"RS256", "rsa"},   {"RS384", "rsa"},   {"RS512", "rsa"},   {"PS256", "rsa"},
      {"PS384", "rsa"},   {"PS512", "rsa"},   {"ES256", "ec256"}, {"ES384", "ec384"},
      {"ES512", "ec521"}, {"HS256", "secret"}, {"HS384", "secret"}, {"HS512", "secret"}};
  for (const auto& [method, key] : cases) {
    SCOPED_TRACE(method);
    std::map<std::string, std::string> opts = {{"sign-method", method},
                                               {"priv-key", key + (key == "secret" ? "" : ".key")}};
    if (key != "secret") opts["pub-key"] = key + ".pub";
    auto t = Make(opts);
    ASSERT_TRUE(t.ok()) << t.status();
    auto token = (*t)->Sign("alice", 7, kNow);
    ASSERT_TRUE(token.ok()) << token.status();
    auto claims = (*t)->Verify(*token, kNow);
    ASSERT_TRUE(claims.ok()) << claims.status();
    EXPECT_EQ(claims->username, "alice");
    EXPECT_EQ(claims->revision, 7u);

    // etcd's layout: the header and claims with Go's sorted keys.
    std::vector<std::string> parts = absl::StrSplit(*token, '.');
    ASSERT_EQ(parts.size(), 3u);
    std::string header, body;
    ASSERT_TRUE(absl::WebSafeBase64Unescape(parts[0], &header));
    ASSERT_TRUE(absl::WebSafeBase64Unescape(parts[1], &body));
    EXPECT_EQ(header, absl::StrCat(R"({"alg":")", method, R"(","typ":"JWT"})"));
    EXPECT_EQ(body, absl::StrCat(R"({"exp":)", absl::ToUnixSeconds(kNow) + 300,
                                 R"(,"revision":7,"username":"alice"})"));
  }
}

TEST_F(JwtTokensTest, ExpiredTamperedAndForeignTokensAreInvalid) {
  auto t = Make({{"sign-method", "RS256"}, {"priv-key", "rsa.key"}, {"ttl", "10s"}});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->ttl(), absl::Seconds(10));
  auto token = (*t)->Sign("bob", 3, kNow);
  ASSERT_TRUE(token.ok());
  EXPECT_TRUE((*t)->Verify(*token, kNow + absl::Seconds(10)).ok());
  auto expired = (*t)->Verify(*token, kNow + absl::Seconds(11));
  EXPECT_EQ(ErrorOf(expired.status()), Error::kInvalidAuthToken);

  // A claims part with another user name, signature kept.
  std::vector<std::string> parts = absl::StrSplit(*token, '.');
  std::string forged = absl::StrCat(
      parts[0], ".",
      absl::WebSafeBase64Escape(absl::StrCat(R"({"exp":)", absl::ToUnixSeconds(kNow) + 10,
                                             R"(,"revision":3,"username":"root"})")),
      ".", parts[2]);
  EXPECT_EQ(ErrorOf((*t)->Verify(forged, kNow).status()), Error::kInvalidAuthToken);
  // One flipped signature character (not the last: its low bits are
  // padding, which base64url decoders ignore, as Go's does).
  std::string flipped = *token;
  char& c = flipped[flipped.size() - 5];
  c = c == 'A' ? 'B' : 'A';
  EXPECT_EQ(ErrorOf((*t)->Verify(flipped, kNow).status()), Error::kInvalidAuthToken);
  // alg "none" with no signature.
  std::string none = absl::StrCat(absl::WebSafeBase64Escape(R"({"alg":"none","typ":"JWT"})"), ".",
                                  parts[1], ".");
  EXPECT_EQ(ErrorOf((*t)->Verify(none, kNow).status()), Error::kInvalidAuthToken);
  // Signed by another key; a simple token; garbage.
  auto other = Make({{"sign-method", "RS256"}, {"priv-key", "rsa2.key"}});
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(ErrorOf((*t)->Verify(*(*other)->Sign("bob", 3, kNow), kNow).status()),
            Error::kInvalidAuthToken);
  EXPECT_EQ(ErrorOf((*t)->Verify("abcdefghijklmnop.12", kNow).status()), Error::kInvalidAuthToken);
  EXPECT_EQ(ErrorOf((*t)->Verify("a.b.c", kNow).status()), Error::kInvalidAuthToken);
  // The same key under another method (RS256 -> PS256) is refused too.
  auto ps = Make({{"sign-method", "PS256"}, {"priv-key", "rsa.key"}});
  ASSERT_TRUE(ps.ok());
  EXPECT_EQ(ErrorOf((*t)->Verify(*(*ps)->Sign("bob", 3, kNow), kNow).status()),
            Error::kInvalidAuthToken);
}

TEST_F(JwtTokensTest, PublicKeyOnlyVerifies) {
  auto signer = Make({{"sign-method", "ES256"}, {"priv-key", "ec256.key"}});
  auto verifier = Make({{"sign-method", "ES256"}, {"pub-key", "ec256.pub"}});
  ASSERT_TRUE(signer.ok() && verifier.ok());
  EXPECT_TRUE((*verifier)->verify_only());
  auto token = (*signer)->Sign("carol", 1, kNow);
  ASSERT_TRUE(token.ok());
  EXPECT_TRUE((*verifier)->Verify(*token, kNow).ok());
  auto refused = (*verifier)->Sign("carol", 1, kNow);
  EXPECT_EQ(refused.status().message(), "auth: token signing attempted with verify-only key");
}

TEST_F(JwtTokensTest, EtcdOptionErrors) {
  auto msg = [&](std::map<std::string, std::string> opts) {
    auto t = Make(std::move(opts));
    return t.ok() ? std::string("ok") : std::string(t.status().message());
  };
  EXPECT_EQ(msg({}), "auth: invalid auth options");
  EXPECT_EQ(msg({{"sign-method", "FOO"}, {"priv-key", "rsa.key"}}), "auth: invalid auth options");
  EXPECT_EQ(msg({{"sign-method", "RS256"}}), "auth: missing key data");
  EXPECT_EQ(msg({{"sign-method", "HS256"}}), "auth: missing key data");
  EXPECT_EQ(msg({{"sign-method", "RS256"}, {"priv-key", "/nonexistent"}}),
            "auth: invalid auth options");
  EXPECT_EQ(msg({{"sign-method", "RS256"}, {"priv-key", "rsa.key"}, {"ttl", "abc"}}),
            "auth: invalid auth options");
  EXPECT_EQ(msg({{"sign-method", "ES256"}, {"priv-key", "rsa.key"}}),
            "key is not a valid ECDSA private key");
  EXPECT_EQ(msg({{"sign-method", "RS256"}, {"priv-key", "ec256.key"}}),
            "key is not a valid RSA private key");
  EXPECT_EQ(msg({{"sign-method", "RS256"}, {"pub-key", "ec256.pub"}}),
            "key is not a valid RSA public key");
  EXPECT_EQ(msg({{"sign-method", "RS256"}, {"priv-key", "rsa.key"}, {"pub-key", "rsa2.pub"}}),
            "auth: public and private keys don't match");
  EXPECT_EQ(msg({{"sign-method", "RS256"}, {"priv-key", "secret"}}),
            "invalid key: Key must be a PEM encoded PKCS1 or PKCS8 key");
  EXPECT_EQ(msg({{"sign-method", "RS512"}, {"priv-key", "rsa.key"}, {"ttl", "1m30s"}}), "ok");
}

}  // namespace
}  // namespace capstan::auth
