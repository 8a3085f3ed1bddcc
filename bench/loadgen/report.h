// What a run measured, and the ways it is printed: etcd benchmark's text
// summary, a markdown table, and JSON.
//
// Not thread-safe: a RunReport is filled in by one thread after the load that
// produced it has stopped.

#ifndef CAPSTAN_BENCH_LOADGEN_REPORT_H_
#define CAPSTAN_BENCH_LOADGEN_REPORT_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <ostream>
#include <string>
#include <vector>

#include <grpcpp/support/status.h>

#include "bench/loadgen/histogram.h"

namespace capstan::bench {

// Counts failed requests by "<gRPC code>: <message>". Thread-safe.
class ErrorCounter {
 public:
  void Add(const grpc::Status& status);
  void Add(const std::string& what);
  uint64_t Total() const;
  std::map<std::string, uint64_t> Snapshot() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> counts_;  // guarded by mu_
  uint64_t total_ = 0;                      // guarded by mu_
};

// One timed phase of a run: every successful sample's latency (ns) and the
// failures.
struct PhaseResult {
  std::string name;
  Histogram latency;
  uint64_t errors = 0;
  std::map<std::string, uint64_t> error_counts;
  double seconds = 0;               // wall time of the phase
  bool has_throughput = true;       // false when samples are not paced by the load (e.g. watch events)
  std::vector<double> per_second;   // completions in each second of the phase
  std::vector<double> p99_ms_per_second;  // the p99 of each second's samples (empty: not kept)

  double Throughput() const { return seconds > 0 ? latency.Count() / seconds : 0; }
};

// A scalar that is not a latency distribution (objects/s, RSS, CPU...).
struct Metric {
  std::string name;
  double value = 0;
  std::string unit;
  bool higher_is_better = false;
};

struct RunReport {
  std::string workload;  // "put", "k8s", ...
  std::string target;    // "capstan", "etcd" or the endpoint
  std::string params;    // the workload's flags, for the record
  std::vector<PhaseResult> phases;
  std::vector<Metric> extras;
  std::vector<std::string> notes;
  // Blocks printed as they are after the summary (etcd's tool's own, such as
  // put --check-hashkv's "HashKV Summary:").
  std::vector<std::string> text;

  uint64_t TotalErrors() const;
  PhaseResult* Phase(const std::string& name);
  // Every phase as "<phase> throughput" (req/s), "<phase> p50" (ms), p90, p99, p99.9, max,
  // then the extras; the unit of comparison for `compare`.
  std::vector<Metric> Metrics() const;
};

// The "Summary:" block etcd's benchmark prints (pkg/report), plus the
// percentiles this tool adds (p99.9, max) and the error distribution.
void PrintEtcdStyle(const PhaseResult& phase, std::ostream& out);
void PrintReport(const RunReport& report, std::ostream& out);

// | phase | ok | errors | req/s | p50 | p90 | p99 | p99.9 | max |  (ms)
std::string MarkdownTable(const RunReport& report);

// A small JSON writer: enough for reports, no dependency.
class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  JsonWriter& Key(const std::string& key);
  JsonWriter& Value(const std::string& s);
  JsonWriter& Value(const char* s) { return Value(std::string(s)); }
  JsonWriter& Value(double v);
  JsonWriter& Value(uint64_t v);
  JsonWriter& Value(int64_t v);
  JsonWriter& Value(int v) { return Value(static_cast<int64_t>(v)); }
  JsonWriter& Value(bool v);
  const std::string& str() const { return out_; }

 private:
  void Separate();
  std::string out_;
  std::vector<bool> first_;  // per open container: no element written yet
  bool after_key_ = false;
};

void WriteJson(const RunReport& report, JsonWriter& w);

// Milliseconds with 3 significant decimals, e.g. "1.234".
std::string Ms(uint64_t ns);
std::string FormatNumber(double v);

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_REPORT_H_
