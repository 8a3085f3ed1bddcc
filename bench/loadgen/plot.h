// Plots through Debian's gnuplot (package gnuplot-nox): every plot is a .dat
// file and a .gp script written into a directory, then rendered to PNG when
// gnuplot is installed. Without gnuplot the data and scripts are still
// written and the caller is told plots were skipped.

#ifndef CAPSTAN_BENCH_LOADGEN_PLOT_H_
#define CAPSTAN_BENCH_LOADGEN_PLOT_H_

#include <string>
#include <utility>
#include <vector>

#include "bench/loadgen/histogram.h"

namespace capstan::bench {

// The path of gnuplot, or "" when it is not installed.
std::string FindGnuplot();

// An HdrHistogram-style latency-by-percentile plot (x: 50% .. 99.99%, log
// scale) of several series. Returns a line describing what was written.
std::string PlotPercentiles(const std::string& dir, const std::string& stem,
                            const std::string& title,
                            const std::vector<std::pair<std::string, const Histogram*>>& series);

// Completions per second over time, one line per series.
std::string PlotThroughput(const std::string& dir, const std::string& stem,
                           const std::string& title,
                           const std::vector<std::pair<std::string, std::vector<double>>>& series);

// A value per second over time (x: second 1, 2, ...), one line per series;
// ylabel names the value. sparse: a 0 is a second without a sample, left
// out (a p99 per second), rather than a value.
std::string PlotOverTime(const std::string& dir, const std::string& stem, const std::string& title,
                         const std::string& ylabel,
                         const std::vector<std::pair<std::string, std::vector<double>>>& series,
                         bool sparse = false);

// A file name stem from free text: "watch event" -> "watch-event".
std::string Slug(const std::string& s);

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_PLOT_H_
