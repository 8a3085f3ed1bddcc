#include "cluster/availability_probe.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cluster/cluster_fixture.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/client_context.h"

namespace capstan::testing::cluster {
namespace {

std::string Describe(const grpc::Status& s) {
  return absl::StrCat("code ", s.error_code(), " \"", s.error_message(), "\"");
}

}  // namespace

AvailabilityProbe::AvailabilityProbe(std::vector<std::string> endpoints,
                                     std::chrono::milliseconds interval,
                                     std::chrono::milliseconds deadline)
    : interval_(interval),
      deadline_(deadline),
      endpoints_(std::move(endpoints)),
      runner_([this] { Run(); }) {}

AvailabilityProbe::~AvailabilityProbe() { Stop(); }

void AvailabilityProbe::SetEndpoints(std::vector<std::string> endpoints) {
  absl::MutexLock lock(&mu_);
  endpoints_ = std::move(endpoints);
}

void AvailabilityProbe::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (runner_.joinable()) runner_.join();
}

std::vector<AvailabilityProbe::Op> AvailabilityProbe::ops() const {
  std::vector<Op> ops;
  {
    absl::MutexLock lock(&mu_);
    ops = ops_;
  }
  std::stable_sort(ops.begin(), ops.end(),
                   [](const Op& a, const Op& b) { return a.start < b.start; });
  return ops;
}

int AvailabilityProbe::SuccessesSince(Clock::time_point t) const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(std::count_if(ops_.begin(), ops_.end(), [t](const Op& op) {
    return op.ok && op.start >= t;
  }));
}

std::vector<std::string> AvailabilityProbe::violations() const {
  absl::MutexLock lock(&mu_);
  return violations_;
}

AvailabilityProbe::Outage AvailabilityProbe::LongestOutage(const std::vector<Op>& ops) {
  Outage longest;
  if (ops.empty()) return longest;
  Clock::time_point first = ops.front().start;
  Clock::time_point last = ops.front().end;
  std::vector<Clock::time_point> answers;  // successful ones
  for (const Op& op : ops) {
    first = std::min(first, op.start);
    last = std::max(last, op.end);
    if (op.ok) answers.push_back(op.end);
  }
  std::sort(answers.begin(), answers.end());
  answers.insert(answers.begin(), first);
  answers.push_back(last);
  for (size_t i = 1; i < answers.size(); ++i) {
    const auto length =
        std::chrono::duration_cast<std::chrono::milliseconds>(answers[i] - answers[i - 1]);
    if (length > longest.length) {
      longest.length = length;
      longest.from = answers[i - 1];
      longest.to = answers[i];
    }
  }
  for (const Op& op : ops) {
    if (op.ok || op.start < longest.from || op.start > longest.to) continue;
    const std::string failure = absl::StrCat(op.what, ": ", op.error);
    if (longest.failures++ == 0) longest.first_failure = failure;
    longest.last_failure = failure;
  }
  return longest;
}

void AvailabilityProbe::Record(Op op) {
  absl::MutexLock lock(&mu_);
  ops_.push_back(std::move(op));
}

void AvailabilityProbe::Run() {
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels;
  std::vector<Worker> workers;
  size_t turn = 0;
  for (int64_t n = 0;; ++n) {
    const Clock::time_point round = Clock::now();
    std::string endpoint;
    std::vector<Worker> ended;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) break;
      endpoint = endpoints_[turn++ % endpoints_.size()];
      auto running = std::stable_partition(workers.begin(), workers.end(),
                                           [](const Worker& w) { return *w.done; });
      std::move(workers.begin(), running, std::back_inserter(ended));
      workers.erase(workers.begin(), running);
    }
    // Exchanges that have ended are joined as the client goes.
    for (Worker& w : ended) w.thread.join();
    auto& channel = channels[endpoint];
    if (channel == nullptr) channel = NewMemberChannel(endpoint);
    auto done = std::make_shared<bool>(false);
    workers.push_back(Worker{std::thread([this, channel, endpoint, n, done] {
                               Exchange(channel, endpoint, n);
                               absl::MutexLock lock(&mu_);
                               *done = true;
                             }),
                             done});
    // The pace of the client, not a wait for anything: Stop ends it early.
    absl::MutexLock lock(&mu_);
    const auto rest = interval_ - (Clock::now() - round);
    if (rest > std::chrono::milliseconds(0)) {
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::FromChrono(rest));
    }
  }
  for (Worker& w : workers) w.thread.join();
}

void AvailabilityProbe::Exchange(std::shared_ptr<grpc::Channel> channel, std::string endpoint,
                                 int64_t n) {
  auto stub = etcdserverpb::KV::NewStub(channel);
  const std::string key = absl::StrCat("probe/", n);
  const std::string value = absl::StrCat("v", n);

  Op put;
  put.what = absl::StrCat("put ", key, " @", endpoint);
  put.start = Clock::now();
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline_);
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value(value);
    etcdserverpb::PutResponse resp;
    grpc::Status s = stub->Put(&ctx, req, &resp);
    put.end = Clock::now();
    put.ok = s.ok();
    if (!s.ok()) put.error = Describe(s);
  }
  const bool put_ok = put.ok;
  Record(std::move(put));

  Op get;
  get.what = absl::StrCat("get ", key, " @", endpoint);
  get.start = Clock::now();
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline_);
    etcdserverpb::RangeRequest req;
    req.set_key(key);
    etcdserverpb::RangeResponse resp;
    grpc::Status s = stub->Range(&ctx, req, &resp);
    get.end = Clock::now();
    get.ok = s.ok();
    if (!s.ok()) {
      get.error = Describe(s);
    } else {
      // A failed put may still have been applied: only a value other than
      // the one put, or none after an acknowledged put, is wrong.
      const bool other =
          resp.kvs_size() > 1 || (resp.kvs_size() == 1 && resp.kvs(0).value() != value);
      if (other || (put_ok && resp.kvs_size() == 0)) {
        absl::MutexLock lock(&mu_);
        violations_.push_back(absl::StrCat(get.what, " after ",
                                           put_ok ? "an acknowledged" : "a failed",
                                           " put answered ", resp.ShortDebugString()));
      }
    }
  }
  Record(std::move(get));
}

}  // namespace capstan::testing::cluster
