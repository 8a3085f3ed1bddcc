// A main() for fuzz targets built without libFuzzer (the normal g++ build).
//
//   TARGET [-seconds=N] [-seed=S] PATH...
//
// Runs LLVMFuzzerTestOneInput on every file under each PATH (the checked-in
// corpus and crash regressions), then for N seconds (default 0) on inputs
// mutated from them (bit flips, byte changes, inserts, erases, splices),
// from a fixed seed unless -seed says otherwise. If an input crashes the
// process, it is written to ./crash-<pid> first so it can become a
// regression input. `make fuzz` builds the same targets with libFuzzer.

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

namespace {

const std::string* g_current = nullptr;

void DumpCurrent(int sig) {
  if (g_current != nullptr) {
    char name[64];
    snprintf(name, sizeof(name), "crash-%d", static_cast<int>(getpid()));
    int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      (void)!write(fd, g_current->data(), g_current->size());
      close(fd);
    }
    static const char kMsg[] = "fuzz replay: crashing input written to ./crash-<pid>\n";
    (void)!write(2, kMsg, sizeof(kMsg) - 1);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void Run(const std::string& input) {
  g_current = &input;
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  g_current = nullptr;
}

std::string Mutate(std::string s, const std::vector<std::string>& corpus, std::mt19937_64& rng) {
  const int steps = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < steps; ++i) {
    const size_t pos = s.empty() ? 0 : rng() % s.size();
    switch (rng() % 6) {
      case 0:
        if (!s.empty()) s[pos] = static_cast<char>(s[pos] ^ (1u << (rng() % 8)));
        break;
      case 1:
        if (!s.empty()) s[pos] = static_cast<char>(rng());
        break;
      case 2:
        s.insert(pos, 1 + rng() % 8, static_cast<char>(rng()));
        break;
      case 3:
        if (!s.empty()) s.erase(pos, 1 + rng() % std::min<size_t>(s.size() - pos, 16));
        break;
      case 4: {  // an interesting value: 0, 0xff, 0x7f, 0x80
        static const char kBytes[] = {0, '\xff', 0x7f, '\x80', 1};
        if (!s.empty()) s[pos] = kBytes[rng() % sizeof(kBytes)];
        break;
      }
      case 5:
        if (!corpus.empty()) {
          const std::string& other = corpus[rng() % corpus.size()];
          if (!other.empty()) {
            const size_t from = rng() % other.size();
            s.insert(pos, other, from, 1 + rng() % (other.size() - from));
          }
        }
        break;
    }
  }
  if (s.size() > 64 * 1024) s.resize(64 * 1024);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  double seconds = 0;
  uint64_t seed = 1;
  std::vector<std::string> corpus;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("-seconds=", 0) == 0) {
      seconds = std::atof(arg.c_str() + 9);
      continue;
    }
    if (arg.rfind("-seed=", 0) == 0) {
      seed = std::strtoull(arg.c_str() + 6, nullptr, 10);
      continue;
    }
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(arg)) {
      for (const auto& e : std::filesystem::recursive_directory_iterator(arg)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
    } else {
      files.emplace_back(arg);
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      corpus.push_back(ss.str());
    }
  }
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) signal(sig, DumpCurrent);

  for (const auto& input : corpus) Run(input);
  uint64_t runs = corpus.size();
  std::mt19937_64 rng(seed);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  std::vector<std::string> pool = corpus;
  if (pool.empty()) pool.emplace_back();
  while (seconds > 0 && std::chrono::steady_clock::now() < deadline) {
    std::string input = Mutate(pool[rng() % pool.size()], pool, rng);
    Run(input);
    ++runs;
    // Keep some mutants as parents so mutations stack up.
    if (rng() % 16 == 0) {
      if (pool.size() < 4096) {
        pool.push_back(std::move(input));
      } else {
        pool[corpus.size() + rng() % (pool.size() - corpus.size())] = std::move(input);
      }
    }
  }
  std::printf("fuzz replay: %zu corpus inputs, %llu runs in total, seed %llu\n", corpus.size(),
              static_cast<unsigned long long>(runs), static_cast<unsigned long long>(seed));
  return 0;
}
