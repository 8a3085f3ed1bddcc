// Certificates for the TLS tests, made by the openssl command (a test
// reference: CAPSTAN_REQUIRE_REFERENCE("openssl", kOpensslBinary) first).
// Two certificate authorities with P-256 keys, "ca" (CN testca) and "other"
// (CN otherca), then the leaf certificates a test names, signed by either,
// and revocation lists of "ca"; every file is <dir>/<name>.pem (and .key):
//
//   TestCertificates certs;
//   certs.leaves = {{.name = "server", .common_name = "localhost"},
//                   {.name = "foreign", .common_name = "root", .issuer = "other"}};
//   certs.revoked = {"server"};
//   certs.revocation_lists = {{.file = "crl.pem"}};
//   const absl::Status made = MakeTestCertificates(dir.path(), certs);
//   ASSERT_TRUE(made.ok()) << made;
//
// Thread safety: MakeTestCertificates may run concurrently for different
// directories.

#ifndef CAPSTAN_TESTS_TEST_CERTIFICATES_H_
#define CAPSTAN_TESTS_TEST_CERTIFICATES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace capstan::testing {

inline constexpr char kOpensslBinary[] = "/usr/bin/openssl";

// A certificate for serverAuth and clientAuth, <name>.pem with its key
// <name>.key. Times are openssl's YYYYMMDDHHMMSSZ.
struct LeafCertificate {
  std::string name;
  std::string common_name;
  std::string issuer = "ca";  // "ca" or "other"
  // The subjectAltName extension, as openssl writes it; "" for none.
  std::string subject_alt_name = "IP:127.0.0.1,DNS:localhost";
  std::string not_before = "20200101000000Z";
  std::string not_after = "20991231000000Z";
};

// A certificate revocation list signed by "ca".
struct RevocationList {
  std::string file;  // its name in the directory, e.g. "crl.pem"
  // Whether it lists TestCertificates::revoked (or nothing).
  bool lists_revoked = true;
  // Its lastUpdate and nextUpdate; "" for now and 30 days from now.
  std::string last_update;
  std::string next_update;
};

struct TestCertificates {
  std::vector<LeafCertificate> leaves;
  std::vector<std::string> revoked;  // names of leaves "ca" revokes
  std::vector<RevocationList> revocation_lists;
};

// Makes the CAs and `certs` in `dir` (an existing, empty directory), with
// openssl's database of issued certificates in <dir>/db and its
// configuration in <dir>/ca.cnf. Returns the failed openssl command and its
// error output on failure.
absl::Status MakeTestCertificates(const std::string& dir, const TestCertificates& certs);

}  // namespace capstan::testing

#endif  // CAPSTAN_TESTS_TEST_CERTIFICATES_H_
