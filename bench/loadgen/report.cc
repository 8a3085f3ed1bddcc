#include "bench/loadgen/report.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace capstan::bench {

namespace {

constexpr double kNsPerSec = 1e9;

std::string CodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::OK: return "OK";
    case grpc::CANCELLED: return "Canceled";
    case grpc::UNKNOWN: return "Unknown";
    case grpc::INVALID_ARGUMENT: return "InvalidArgument";
    case grpc::DEADLINE_EXCEEDED: return "DeadlineExceeded";
    case grpc::NOT_FOUND: return "NotFound";
    case grpc::ALREADY_EXISTS: return "AlreadyExists";
    case grpc::PERMISSION_DENIED: return "PermissionDenied";
    case grpc::RESOURCE_EXHAUSTED: return "ResourceExhausted";
    case grpc::FAILED_PRECONDITION: return "FailedPrecondition";
    case grpc::ABORTED: return "Aborted";
    case grpc::OUT_OF_RANGE: return "OutOfRange";
    case grpc::UNIMPLEMENTED: return "Unimplemented";
    case grpc::INTERNAL: return "Internal";
    case grpc::UNAVAILABLE: return "Unavailable";
    case grpc::DATA_LOSS: return "DataLoss";
    case grpc::UNAUTHENTICATED: return "Unauthenticated";
    default: return absl::StrCat("Code(", static_cast<int>(code), ")");
  }
}

}  // namespace

void ErrorCounter::Add(const grpc::Status& status) {
  Add(absl::StrCat("rpc error: code = ", CodeName(status.error_code()),
                   " desc = ", status.error_message()));
}

void ErrorCounter::Add(const std::string& what) {
  std::lock_guard<std::mutex> l(mu_);
  ++counts_[what];
  ++total_;
}

uint64_t ErrorCounter::Total() const {
  std::lock_guard<std::mutex> l(mu_);
  return total_;
}

std::map<std::string, uint64_t> ErrorCounter::Snapshot() const {
  std::lock_guard<std::mutex> l(mu_);
  return counts_;
}

uint64_t RunReport::TotalErrors() const {
  uint64_t n = 0;
  for (const auto& p : phases) n += p.errors;
  return n;
}

PhaseResult* RunReport::Phase(const std::string& name) {
  for (auto& p : phases) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

std::vector<Metric> RunReport::Metrics() const {
  std::vector<Metric> out;
  for (const auto& p : phases) {
    if (p.has_throughput) out.push_back({p.name + " throughput", p.Throughput(), "req/s", true});
    const Histogram& h = p.latency;
    out.push_back({p.name + " p50", h.Percentile(50) / 1e6, "ms", false});
    out.push_back({p.name + " p90", h.Percentile(90) / 1e6, "ms", false});
    out.push_back({p.name + " p99", h.Percentile(99) / 1e6, "ms", false});
    out.push_back({p.name + " p99.9", h.Percentile(99.9) / 1e6, "ms", false});
    out.push_back({p.name + " max", h.Max() / 1e6, "ms", false});
  }
  for (const auto& m : extras) out.push_back(m);
  return out;
}

std::string Ms(uint64_t ns) { return absl::StrFormat("%.3f", ns / 1e6); }

std::string FormatNumber(double v) {
  if (std::isnan(v)) return "-";
  const double a = std::fabs(v);
  if (a >= 1000) return absl::StrFormat("%.0f", v);
  if (a >= 100) return absl::StrFormat("%.1f", v);
  if (a >= 1) return absl::StrFormat("%.2f", v);
  return absl::StrFormat("%.3f", v);
}

void PrintEtcdStyle(const PhaseResult& p, std::ostream& out) {
  const Histogram& h = p.latency;
  out << "\nSummary (" << p.name << "):\n";
  out << absl::StrFormat("  Total:\t%.4f secs.\n", p.seconds);
  out << absl::StrFormat("  Slowest:\t%.4f secs.\n", h.Max() / kNsPerSec);
  out << absl::StrFormat("  Fastest:\t%.4f secs.\n", h.Min() / kNsPerSec);
  out << absl::StrFormat("  Average:\t%.4f secs.\n", h.Mean() / kNsPerSec);
  out << absl::StrFormat("  Stddev:\t%.4f secs.\n", h.Stddev() / kNsPerSec);
  if (p.has_throughput) out << absl::StrFormat("  Requests/sec:\t%.4f\n", p.Throughput());
  out << absl::StrFormat("  Count:\t%d ok, %d errors\n", h.Count(), p.errors);
  if (h.Count() > 0) {
    out << "\nLatency distribution:\n";
    for (double q : {10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9}) {
      out << absl::StrFormat("  %g%% in %.4f secs.\n", q, h.Percentile(q) / kNsPerSec);
    }
  }
  if (!p.error_counts.empty()) {
    out << "\nError distribution:\n";
    for (const auto& [msg, n] : p.error_counts) out << "  [" << n << "]\t" << msg << "\n";
  }
}

void PrintReport(const RunReport& r, std::ostream& out) {
  for (const auto& p : r.phases) PrintEtcdStyle(p, out);
  if (!r.extras.empty()) {
    out << "\n";
    for (const auto& m : r.extras) {
      out << "  " << m.name << ":\t" << FormatNumber(m.value) << " " << m.unit << "\n";
    }
  }
  for (const auto& n : r.notes) out << "note: " << n << "\n";
  for (const auto& t : r.text) out << t << "\n";
  out << "\n";
}

std::string MarkdownTable(const RunReport& r) {
  std::string s = absl::StrCat("### ", r.workload, " against ", r.target, "\n\n");
  if (!r.params.empty()) absl::StrAppend(&s, "`", r.params, "`\n\n");
  absl::StrAppend(&s,
                  "| phase | ok | errors | req/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms |\n"
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const auto& p : r.phases) {
    const Histogram& h = p.latency;
    absl::StrAppend(&s, "| ", p.name, " | ", h.Count(), " | ", p.errors, " | ",
                    p.has_throughput ? FormatNumber(p.Throughput()) : "-", " | ",
                    Ms(h.Percentile(50)), " | ", Ms(h.Percentile(90)), " | ", Ms(h.Percentile(99)),
                    " | ", Ms(h.Percentile(99.9)), " | ", Ms(h.Max()), " |\n");
  }
  if (!r.extras.empty()) {
    absl::StrAppend(&s, "\n| metric | value |\n| --- | ---: |\n");
    for (const auto& m : r.extras) {
      absl::StrAppend(&s, "| ", m.name, " | ", FormatNumber(m.value), " ", m.unit, " |\n");
    }
  }
  return s;
}

// JsonWriter

void JsonWriter::Separate() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ",";
    first_.back() = false;
  }
}

JsonWriter& JsonWriter::BeginObject() {
  Separate();
  out_ += "{";
  first_.push_back(true);
  return *this;
}
JsonWriter& JsonWriter::EndObject() {
  out_ += "}";
  first_.pop_back();
  return *this;
}
JsonWriter& JsonWriter::BeginArray() {
  Separate();
  out_ += "[";
  first_.push_back(true);
  return *this;
}
JsonWriter& JsonWriter::EndArray() {
  out_ += "]";
  first_.pop_back();
  return *this;
}
JsonWriter& JsonWriter::Key(const std::string& key) {
  Value(key);
  out_ += ":";
  after_key_ = true;
  return *this;
}
JsonWriter& JsonWriter::Value(const std::string& s) {
  Separate();
  out_ += "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out_ += "\\\""; break;
      case '\\': out_ += "\\\\"; break;
      case '\n': out_ += "\\n"; break;
      case '\t': out_ += "\\t"; break;
      case '\r': out_ += "\\r"; break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(&out_, "\\u%04x", c);
        } else {
          out_ += static_cast<char>(c);
        }
    }
  }
  out_ += "\"";
  return *this;
}
JsonWriter& JsonWriter::Value(double v) {
  Separate();
  if (std::isfinite(v)) {
    absl::StrAppendFormat(&out_, "%.6g", v);
  } else {
    out_ += "null";
  }
  return *this;
}
JsonWriter& JsonWriter::Value(uint64_t v) {
  Separate();
  absl::StrAppend(&out_, v);
  return *this;
}
JsonWriter& JsonWriter::Value(int64_t v) {
  Separate();
  absl::StrAppend(&out_, v);
  return *this;
}
JsonWriter& JsonWriter::Value(bool v) {
  Separate();
  out_ += v ? "true" : "false";
  return *this;
}

void WriteJson(const RunReport& r, JsonWriter& w) {
  w.BeginObject();
  w.Key("workload").Value(r.workload);
  w.Key("target").Value(r.target);
  w.Key("params").Value(r.params);
  w.Key("errors").Value(r.TotalErrors());
  w.Key("phases").BeginArray();
  for (const auto& p : r.phases) {
    const Histogram& h = p.latency;
    w.BeginObject();
    w.Key("name").Value(p.name);
    w.Key("ok").Value(h.Count());
    w.Key("errors").Value(p.errors);
    w.Key("seconds").Value(p.seconds);
    if (p.has_throughput) w.Key("requests_per_sec").Value(p.Throughput());
    w.Key("latency_ms").BeginObject();
    w.Key("min").Value(h.Min() / 1e6);
    w.Key("mean").Value(h.Mean() / 1e6);
    w.Key("stddev").Value(h.Stddev() / 1e6);
    for (auto [label, q] : std::vector<std::pair<const char*, double>>{
             {"p50", 50}, {"p90", 90}, {"p99", 99}, {"p99.9", 99.9}}) {
      w.Key(label).Value(h.Percentile(q) / 1e6);
    }
    w.Key("max").Value(h.Max() / 1e6);
    w.EndObject();
    if (!p.error_counts.empty()) {
      w.Key("error_distribution").BeginObject();
      for (const auto& [msg, n] : p.error_counts) w.Key(msg).Value(n);
      w.EndObject();
    }
    if (!p.per_second.empty()) {
      w.Key("per_second").BeginArray();
      for (double v : p.per_second) w.Value(v);
      w.EndArray();
    }
    if (!p.p99_ms_per_second.empty()) {
      w.Key("p99_ms_per_second").BeginArray();
      for (double v : p.p99_ms_per_second) w.Value(v);
      w.EndArray();
    }
    w.EndObject();
  }
  w.EndArray();
  w.Key("extras").BeginObject();
  for (const auto& m : r.extras) w.Key(m.name + " (" + m.unit + ")").Value(m.value);
  w.EndObject();
  w.Key("notes").BeginArray();
  for (const auto& n : r.notes) w.Value(n);
  w.EndArray();
  w.EndObject();
}

}  // namespace capstan::bench
