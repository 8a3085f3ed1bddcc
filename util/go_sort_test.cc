// GoSort against Go's own sort.Sort: the same inputs, sorted by a small Go
// program and by GoSort, must come out in the same order, equal elements
// included. The installed Go (Debian 12's 1.19) checks GoSortBefore124; the
// one difference of Go 1.24's sort, its xorshift, is checked against etcd
// 3.5.16 built by it (DiffRangeTest.BulkRangesMatch sorts ranges with many
// ties), and here by the inputs on which the two generators part.

#include "util/go_sort.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/reference.h"

namespace capstan::util {
namespace {

struct Element {
  int value;  // the sort key; many are equal
  int id;     // where it started
};

// Sorts each input by value, ascending or descending, returning the ids.
std::vector<int> SortIds(std::vector<Element> v, bool descending,
                         go_sort_internal::Xorshift xorshift = go_sort_internal::Xorshift::kGo124) {
  const int n = static_cast<int>(v.size());
  auto swap = [&v](int i, int j) { std::swap(v[i], v[j]); };
  if (descending) {
    GoSortWith(xorshift, n, [&v](int i, int j) { return v[j].value < v[i].value; }, swap);
  } else {
    GoSortWith(xorshift, n, [&v](int i, int j) { return v[i].value < v[j].value; }, swap);
  }
  std::vector<int> ids;
  for (const auto& e : v) ids.push_back(e.id);
  return ids;
}

// Inputs of several shapes: random with many ties, sorted, reversed, equal,
// sawtooth, and lengths around the algorithm's thresholds.
std::vector<std::vector<int>> Inputs() {
  std::vector<std::vector<int>> out;
  std::mt19937 rng(7);
  for (int n : {0, 1, 2, 7, 12, 13, 49, 50, 51, 100, 1000, 5000}) {
    for (int distinct : {1, 3, 50, 1000000}) {
      std::vector<int> v(n);
      for (auto& x : v) x = static_cast<int>(rng() % distinct);
      out.push_back(v);
    }
    std::vector<int> up(n), down(n), saw(n);
    for (int i = 0; i < n; ++i) {
      up[i] = i / 3;
      down[i] = (n - i) / 3;
      saw[i] = i % 17;
    }
    out.push_back(up);
    out.push_back(down);
    out.push_back(saw);
  }
  return out;
}

constexpr char kGoProgram[] = R"(package main

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

type elems struct{ v, id []int }

func (e elems) Len() int           { return len(e.v) }
func (e elems) Less(i, j int) bool { return e.v[i] < e.v[j] }
func (e elems) Swap(i, j int) {
	e.v[i], e.v[j] = e.v[j], e.v[i]
	e.id[i], e.id[j] = e.id[j], e.id[i]
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		fields := strings.Fields(in.Text())
		e := elems{}
		for i, f := range fields[1:] {
			x, _ := strconv.Atoi(f)
			e.v = append(e.v, x)
			e.id = append(e.id, i)
		}
		if fields[0] == "desc" {
			sort.Sort(sort.Reverse(e))
		} else {
			sort.Sort(e)
		}
		for _, id := range e.id {
			fmt.Fprint(out, id, " ")
		}
		fmt.Fprintln(out)
	}
}
)";

TEST(GoSortTest, SortsAscendingAndDescending) {
  for (const auto& input : Inputs()) {
    std::vector<Element> v;
    for (size_t i = 0; i < input.size(); ++i) v.push_back({input[i], static_cast<int>(i)});
    for (bool descending : {false, true}) {
      auto ids = SortIds(v, descending);
      ASSERT_EQ(ids.size(), input.size());
      std::vector<int> values;
      for (int id : ids) values.push_back(input[id]);
      if (descending) std::reverse(values.begin(), values.end());
      EXPECT_TRUE(std::is_sorted(values.begin(), values.end()));
      std::sort(ids.begin(), ids.end());
      for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(ids[i], static_cast<int>(i));
    }
  }
}

// The generators part on inputs that partition badly: those with ties.
TEST(GoSortTest, Go124LeavesSomeTiesElsewhere) {
  int differ = 0, cases = 0;
  for (const auto& input : Inputs()) {
    std::vector<Element> v;
    for (size_t i = 0; i < input.size(); ++i) v.push_back({input[i], static_cast<int>(i)});
    for (bool descending : {false, true}) {
      ++cases;
      differ += SortIds(v, descending, go_sort_internal::Xorshift::kGo124) !=
                SortIds(v, descending, go_sort_internal::Xorshift::kBeforeGo124);
    }
  }
  EXPECT_GT(differ, 0);
  EXPECT_LT(differ, cases);
}

TEST(GoSortTest, LeavesEqualElementsWhereGoDoes) {
  CAPSTAN_REQUIRE_REFERENCE("go (Debian golang-go)", ::capstan::testing::FindInPath("go"));
  char dir_template[] = "/tmp/capstan-gosort-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  std::ofstream(dir + "/main.go") << kGoProgram;
  std::string input_text;
  std::vector<std::vector<int>> expected;
  for (const auto& input : Inputs()) {
    std::vector<Element> v;
    for (size_t i = 0; i < input.size(); ++i) v.push_back({input[i], static_cast<int>(i)});
    for (bool descending : {false, true}) {
      input_text += descending ? "desc" : "asc";
      for (int x : input) {
        input_text += ' ';
        input_text += std::to_string(x);
      }
      input_text += "\n";
      expected.push_back(SortIds(v, descending, go_sort_internal::Xorshift::kBeforeGo124));
    }
  }
  std::ofstream(dir + "/input.txt") << input_text;
  const std::string cmd = "cd " + dir + " && GO111MODULE=off GOCACHE=" + dir +
                          "/cache go run main.go < input.txt > output.txt 2> error.txt";
  const int rc = system(cmd.c_str());
  std::ifstream error_file(dir + "/error.txt");
  std::stringstream error;
  error << error_file.rdbuf();
  ASSERT_EQ(rc, 0) << error.str();
  std::ifstream output(dir + "/output.txt");
  std::string line;
  size_t case_index = 0;
  while (std::getline(output, line)) {
    ASSERT_LT(case_index, expected.size());
    std::istringstream ids(line);
    std::vector<int> go_ids;
    for (int id; ids >> id;) go_ids.push_back(id);
    EXPECT_EQ(go_ids, expected[case_index]) << "case " << case_index;
    ++case_index;
  }
  EXPECT_EQ(case_index, expected.size());
  system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace capstan::util
