#include "test_certificates.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "process_fixture.h"

namespace capstan::testing {
namespace {

// openssl ca's configuration: one database for both CAs (the serial
// numbers stay unique), and an extensions section per leaf.
std::string CaConfig(const std::string& dir, const TestCertificates& certs) {
  std::string cnf = absl::StrCat(
      "[ca]\n"
      "default_ca = testca\n"
      "[testca]\n"
      "dir = ", dir, "\n",
      "database = $dir/db/index.txt\n"
      "serial = $dir/db/serial\n"
      "crlnumber = $dir/db/crlnumber\n"
      "new_certs_dir = $dir/db\n"
      "default_md = sha256\n"
      "policy = anything\n"
      "copy_extensions = none\n"
      "default_crl_days = 30\n"
      "unique_subject = no\n"
      "[anything]\n"
      "commonName = supplied\n");
  for (size_t i = 0; i < certs.leaves.size(); ++i) {
    absl::StrAppend(&cnf, "[leaf", i, "]\n");
    if (!certs.leaves[i].subject_alt_name.empty()) {
      absl::StrAppend(&cnf, "subjectAltName = ", certs.leaves[i].subject_alt_name, "\n");
    }
    absl::StrAppend(&cnf, "extendedKeyUsage = serverAuth,clientAuth\n");
  }
  return cnf;
}

absl::Status Openssl(std::vector<std::string> args) {
  args.insert(args.begin(), kOpensslBinary);
  const CommandResult r = RunCommand(args);
  if (r.exit.exited && r.exit.exit_code == 0) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(absl::StrJoin(args, " "), ": ", r.exit.ToString(), "\n", r.err));
}

}  // namespace

absl::Status MakeTestCertificates(const std::string& dir, const TestCertificates& certs) {
  const auto path = [&](const std::string& name) { return absl::StrCat(dir, "/", name); };
  std::error_code ec;
  std::filesystem::create_directories(path("db"), ec);
  if (ec) return absl::InternalError(absl::StrCat("mkdir ", path("db"), ": ", ec.message()));
  std::ofstream(path("db/index.txt"));
  std::ofstream(path("db/serial")) << "1000\n";
  std::ofstream(path("db/crlnumber")) << "1000\n";
  const std::string cnf = path("ca.cnf");
  std::ofstream(cnf) << CaConfig(dir, certs);

  const std::vector<std::string> new_key = {"-newkey", "ec", "-pkeyopt",
                                            "ec_paramgen_curve:P-256", "-nodes"};
  const auto req = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "req");
    args.insert(args.begin() + 1, new_key.begin(), new_key.end());
    return Openssl(std::move(args));
  };
  for (const auto& [authority, cn] :
       {std::pair{"ca", "testca"}, std::pair{"other", "otherca"}}) {
    absl::Status s = req({"-x509", "-keyout", path(absl::StrCat(authority, ".key")), "-out",
                          path(absl::StrCat(authority, ".pem")), "-days", "30", "-subj",
                          absl::StrCat("/CN=", cn)});
    if (!s.ok()) return s;
  }
  const std::vector<std::string> ca_args = {"ca", "-batch", "-config", cnf};
  const auto ca = [&](const std::string& issuer, std::vector<std::string> args) {
    std::vector<std::string> all = ca_args;
    all.insert(all.end(), {"-cert", path(issuer + ".pem"), "-keyfile", path(issuer + ".key")});
    all.insert(all.end(), args.begin(), args.end());
    return Openssl(std::move(all));
  };
  for (size_t i = 0; i < certs.leaves.size(); ++i) {
    const LeafCertificate& leaf = certs.leaves[i];
    const std::string csr = path(leaf.name + ".csr");
    absl::Status s = req({"-keyout", path(leaf.name + ".key"), "-out", csr, "-subj",
                          "/CN=" + leaf.common_name});
    if (s.ok()) {
      s = ca(leaf.issuer, {"-extensions", absl::StrCat("leaf", i), "-startdate", leaf.not_before,
                           "-enddate", leaf.not_after, "-in", csr, "-out",
                           path(leaf.name + ".pem")});
    }
    if (!s.ok()) return s;
  }

  const auto make_lists = [&](bool lists_revoked) {
    for (const RevocationList& list : certs.revocation_lists) {
      if (list.lists_revoked != lists_revoked) continue;
      std::vector<std::string> args = {"-gencrl", "-out", path(list.file)};
      if (!list.last_update.empty()) args.insert(args.end(), {"-crl_lastupdate", list.last_update});
      if (!list.next_update.empty()) args.insert(args.end(), {"-crl_nextupdate", list.next_update});
      absl::Status s = ca("ca", std::move(args));
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  };
  absl::Status s = make_lists(false);
  for (size_t i = 0; s.ok() && i < certs.revoked.size(); ++i) {
    s = ca("ca", {"-revoke", path(certs.revoked[i] + ".pem")});
  }
  if (s.ok()) s = make_lists(true);
  return s;
}

}  // namespace capstan::testing
