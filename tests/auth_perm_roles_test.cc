// Roles and names with auth on, against etcd: a role's permissions in
// etcd's order, names and passwords that are not UTF-8 (the AuthPermTest
// fixture: auth_perm.h).

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "auth_perm.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "gtest/gtest.h"

namespace capstan::testing::auth_perm {
namespace {

// etcd keeps a role's permissions sorted by key with Go's sort.Sort, which
// is not stable: past 12 permissions, those on one key (a point and ranges
// from it) come out in the order its pattern-defeating quicksort leaves.
TEST_F(AuthPermTest, RoleGetListsPermissionsInEtcdsOrder) {
  auto auth = [&](int i) { return etcdserverpb::Auth::NewStub(channels_[i]); };
  ASSERT_EQ(Both("root", "RoleAdd many", [&](int i, grpc::ClientContext* ctx) {
              etcdserverpb::AuthRoleAddRequest req;
              req.set_name("many");
              etcdserverpb::AuthRoleAddResponse resp;
              return auth(i)->RoleAdd(ctx, req, &resp);
            }).code,
            grpc::OK);
  // 30 grants over 8 keys, each key as a point, up to "\0" and as a prefix,
  // in an order that is neither sorted nor reversed.
  const std::vector<std::string> keys = {"/p/d", "/p/a", "/p/g", "/p/b", "/p/h", "/p/c", "/p/f", "/p/e"};
  const std::vector<std::string> ends = {"", std::string(1, '\0'), "prefix"};
  for (int n = 0; n < 30; ++n) {
    const std::string& key = keys[(n * 5) % keys.size()];
    std::string end = ends[(n * 7 / 3) % ends.size()];
    if (end == "prefix") end = key + "0";
    Reply r = Both("root", absl::StrCat("RoleGrantPermission ", n), [&](int i, grpc::ClientContext* ctx) {
      etcdserverpb::AuthRoleGrantPermissionRequest req;
      req.set_name("many");
      req.mutable_perm()->set_key(key);
      req.mutable_perm()->set_range_end(end);
      req.mutable_perm()->set_permtype(static_cast<authpb::Permission::Type>(n % 3));
      etcdserverpb::AuthRoleGrantPermissionResponse resp;
      return auth(i)->RoleGrantPermission(ctx, req, &resp);
    });
    ASSERT_EQ(r.code, grpc::OK) << r.message;
  }
  etcdserverpb::AuthRoleGetResponse got[2];
  Both("root", "RoleGet many", [&](int i, grpc::ClientContext* ctx) {
    etcdserverpb::AuthRoleGetRequest req;
    req.set_role("many");
    return auth(i)->RoleGet(ctx, req, &got[i]);
  });
  got[0].clear_header();
  got[1].clear_header();
  EXPECT_GT(got[1].perm_size(), 12);
  EXPECT_EQ(got[0].DebugString(), got[1].DebugString());
}

// Names and passwords that are not UTF-8 (Latin-1 here): etcd takes any
// bytes in its string fields, and so does Capstan's decoder. A user and a
// role made with etcdctl, then the user logs in and writes under the
// role's prefix, and root reads both back: the same on both servers.
TEST_F(AuthPermTest, NamesThatAreNotUtf8) {
  const std::string user = "b\xe9la", password = "\xe9t\xe9", role = "r\xe9";
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"user", "add", user, "--new-user-password=" + password},
           {"role", "add", role},
           {"role", "grant-permission", role, "readwrite", "/l/", "--prefix"},
           {"user", "grant-role", user, role}}) {
    std::string out[2];
    for (int i = 0; i < 2; ++i) {
      std::vector<std::string> argv = {EtcdctlBinary(), "--endpoints=" + servers_[i]->endpoint(),
                                       "--user=root:rootpw"};
      argv.insert(argv.end(), args.begin(), args.end());
      CommandResult r = RunCommand(argv, "", std::chrono::seconds(20));
      EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 0)
          << i << ": " << absl::StrJoin(args, " ") << r.out << r.err;
      out[i] = r.out;
    }
    EXPECT_EQ(out[1], out[0]) << absl::StrJoin(args, " ");
  }
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext ctx;
    etcdserverpb::AuthenticateRequest req;
    req.set_name(user);
    req.set_password(password);
    etcdserverpb::AuthenticateResponse resp;
    grpc::Status st = etcdserverpb::Auth::NewStub(channels_[i])->Authenticate(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << i << ": " << st.error_message();
    tokens_[i][user] = resp.token();
  }
  EXPECT_EQ(Put(user, "/l/x", 0), (Reply{0, ""}));
  EXPECT_EQ(Put(user, "/a/x", 0), (Reply{grpc::PERMISSION_DENIED, kDenied}));
  // Read raw: C++ protobuf would refuse the responses' strings too.
  std::string answers[2];
  for (int i = 0; i < 2; ++i) {
    auto as_root = [&](const std::string& method, const google::protobuf::Message& req) {
      grpc::GenericStub stub(channels_[i]);
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      ctx.AddMetadata("token", tokens_[i].at("root"));
      grpc::Slice slice(req.SerializeAsString());
      grpc::ByteBuffer request(&slice, 1), response;
      grpc::CompletionQueue cq;
      auto call = stub.PrepareUnaryCall(&ctx, "/etcdserverpb.Auth/" + method, request, &cq);
      call->StartCall();
      grpc::Status status;
      call->Finish(&response, &status, nullptr);
      void* tag;
      bool ok;
      cq.Next(&tag, &ok);
      EXPECT_TRUE(status.ok()) << i << " " << method << ": " << status.error_message();
      std::vector<grpc::Slice> slices;
      std::string bytes;
      if (status.ok() && response.Dump(&slices).ok()) {
        for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
      }
      google::protobuf::UnknownFieldSet fields;  // no schema: no UTF-8 check
      EXPECT_TRUE(fields.ParseFromString(bytes));
      fields.DeleteByNumber(1);  // the header
      std::string rest;
      fields.SerializeToString(&rest);
      return absl::CHexEscape(rest);
    };
    etcdserverpb::AuthUserGetRequest get;
    get.set_name(user);
    etcdserverpb::AuthRoleGetRequest role_get;
    role_get.set_role(role);
    answers[i] = absl::StrCat(as_root("UserGet", get), " | ", as_root("RoleGet", role_get), " | ",
                              as_root("UserList", etcdserverpb::AuthUserListRequest()));
  }
  EXPECT_EQ(answers[1], answers[0]);
  EXPECT_NE(answers[1].find("r\\xe9"), std::string::npos) << answers[1];
}


}  // namespace
}  // namespace capstan::testing::auth_perm
