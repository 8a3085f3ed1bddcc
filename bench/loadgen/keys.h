// Keys and values the way etcd's benchmark makes them: a key is --key-size
// bytes holding the zig-zag varint of its index (Go's binary.PutVarint) and
// zeros after it; the value is --val-size random bytes shared by all requests.
//
// One difference: etcd reuses one buffer, so a short varint leaves the tail of
// a longer earlier one in place; here the tail is always zero, so index i is
// always the same key.

#ifndef CAPSTAN_BENCH_LOADGEN_KEYS_H_
#define CAPSTAN_BENCH_LOADGEN_KEYS_H_

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>

#include "mvcc/key_range.h"

namespace capstan::bench {

inline std::string EtcdBenchKey(int64_t index, int key_size) {
  std::string k(static_cast<size_t>(std::max(key_size, 0)), '\0');
  uint64_t ux = static_cast<uint64_t>(index) << 1;
  if (index < 0) ux = ~ux;
  size_t i = 0;
  while (ux >= 0x80 && i < k.size()) {
    k[i++] = static_cast<char>(ux | 0x80);
    ux >>= 7;
  }
  if (i < k.size()) k[i] = static_cast<char>(ux);
  return k;
}

inline std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// A per-thread generator for key indexes and choices.
inline std::mt19937_64& ThreadRng() {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return rng;
}

inline int64_t RandomIndex(int64_t n) {
  return static_cast<int64_t>(ThreadRng()() % static_cast<uint64_t>(n));
}

// The smallest key greater than every key with this prefix ("\0" if none).
using mvcc::PrefixEnd;

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_KEYS_H_
