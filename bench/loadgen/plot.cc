#include "bench/loadgen/plot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace capstan::bench {

namespace {

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// Runs gnuplot on a script; true if it exited 0.
bool RunGnuplot(const std::string& gnuplot, const std::string& script) {
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    execl(gnuplot.c_str(), gnuplot.c_str(), script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string Render(const std::string& dir, const std::string& stem, const std::string& script) {
  const std::string gp = dir + "/" + stem + ".gp";
  std::ofstream(gp) << script;
  const std::string gnuplot = FindGnuplot();
  if (gnuplot.empty()) {
    return absl::StrCat("gnuplot not found (apt-get install gnuplot-nox); wrote ", gp,
                        " but skipped the plot");
  }
  if (!RunGnuplot(gnuplot, gp)) return absl::StrCat("gnuplot failed on ", gp);
  return absl::StrCat("plot: ", dir, "/", stem, ".png");
}

const char* kHeader =
    "set terminal pngcairo size 1000,600 noenhanced font 'DejaVu Sans,10'\n"
    "set grid\nset key top left\n";

}  // namespace

std::string FindGnuplot() {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string candidate = dirs.substr(start, end - start) + "/gnuplot";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

std::string Slug(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '.') {
      out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  return out;
}

std::string PlotPercentiles(const std::string& dir, const std::string& stem,
                            const std::string& title,
                            const std::vector<std::pair<std::string, const Histogram*>>& series) {
  std::filesystem::create_directories(dir);
  const std::string dat = dir + "/" + stem + ".dat";
  std::ofstream out(dat);
  // x = 1 / (1 - p): 2 at p50, 100 at p99, 10000 at p99.99.
  for (size_t i = 0; i < series.size(); ++i) {
    out << "# " << series[i].first << "\n";
    for (double nines = 0.301; nines <= 4.0001; nines += 0.05) {
      const double frac = 1 - std::pow(10, -nines);
      out << absl::StrFormat("%.6f %.6f\n", 1 / (1 - frac),
                             series[i].second->Percentile(frac * 100) / 1e6);
    }
    out << "\n\n";
  }
  out.close();
  std::string script = kHeader;
  absl::StrAppend(&script, "set output ", Quote(dir + "/" + stem + ".png"), "\n",
                  "set title ", Quote(title), "\n",
                  "set logscale x\nset logscale y\n"
                  "set xtics (\"50%%\" 2, \"90%%\" 10, \"99%%\" 100, \"99.9%%\" 1000, \"99.99%%\" 10000)\n"
                  "set xlabel \"percentile\"\nset ylabel \"latency (ms)\"\n"
                  "plot ");
  for (size_t i = 0; i < series.size(); ++i) {
    absl::StrAppend(&script, i ? ", " : "", Quote(dat), " index ", i, " using 1:2 with lines lw 2 title ",
                    Quote(series[i].first));
  }
  script += "\n";
  return Render(dir, stem, script);
}

std::string PlotThroughput(const std::string& dir, const std::string& stem,
                           const std::string& title,
                           const std::vector<std::pair<std::string, std::vector<double>>>& series) {
  return PlotOverTime(dir, stem, title, "requests completed per second", series);
}

std::string PlotOverTime(const std::string& dir, const std::string& stem, const std::string& title,
                         const std::string& ylabel,
                         const std::vector<std::pair<std::string, std::vector<double>>>& series,
                         bool sparse) {
  std::filesystem::create_directories(dir);
  const std::string dat = dir + "/" + stem + ".dat";
  std::ofstream out(dat);
  for (const auto& [label, values] : series) {
    out << "# " << label << "\n";
    for (size_t t = 0; t < values.size(); ++t) {
      if (!sparse || values[t] != 0) out << (t + 1) << " " << values[t] << "\n";
    }
    out << "\n\n";
  }
  out.close();
  std::string script = kHeader;
  absl::StrAppend(&script, "set output ", Quote(dir + "/" + stem + ".png"), "\n",
                  "set title ", Quote(title), "\n",
                  "set xlabel \"second\"\nset ylabel ", Quote(ylabel), "\n",
                  "set yrange [0:*]\nplot ");
  for (size_t i = 0; i < series.size(); ++i) {
    absl::StrAppend(&script, i ? ", " : "", Quote(dat), " index ", i,
                    " using 1:2 with linespoints lw 2 title ", Quote(series[i].first));
  }
  script += "\n";
  return Render(dir, stem, script);
}

}  // namespace capstan::bench
