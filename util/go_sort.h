// GoSort: the ordering Go's sort.Sort produces (pattern-defeating quicksort,
// Go 1.19 and later), for results that must equal etcd's element for element.
//
// sort.Sort is not stable, and etcd sorts Range results with it, so the order
// of equal elements (keys with the same mod revision, say) is whatever that
// algorithm leaves. std::sort and std::stable_sort leave other orders. This is
// the same sequence of comparisons and swaps, so it leaves the same order.
//
//   GoSort(items.size(),
//          [&](int i, int j) { return items[i].mod < items[j].mod; },
//          [&](int i, int j) { std::swap(items[i], items[j]); });
//
// Descending order is sort.Sort(sort.Reverse(x)): pass less with i and j
// exchanged.
//
// Which Go: the algorithm is the same from Go 1.19 on, except the xorshift
// generator that shuffles a badly partitioned run, whose shifts Go 1.24
// corrected (golang/go#70144). So the order of equal elements depends on the
// Go that built etcd. GoSort leaves them as Go 1.24 and later do: etcd 3.5.16
// as Debian builds it (Go 1.24), the reference of Capstan's tests, and etcd
// 3.6 releases. GoSortBefore124 is the older generator (Go 1.19 to 1.23).

#ifndef CAPSTAN_UTIL_GO_SORT_H_
#define CAPSTAN_UTIL_GO_SORT_H_

#include <cstdint>
#include <utility>

namespace capstan::util {

namespace go_sort_internal {

enum class Hint { kUnknown, kIncreasing, kDecreasing };

// Go's bits.Len: the number of bits needed to represent x.
inline int BitLen(uint64_t x) {
  int n = 0;
  while (x != 0) {
    ++n;
    x >>= 1;
  }
  return n;
}

// The xorshift of breakPatterns: before Go 1.24 its shifts were 13, 17, 5;
// from Go 1.24 on 13, 7, 17.
enum class Xorshift { kBeforeGo124, kGo124 };

template <typename Less, typename Swap>
class Sorter {
 public:
  Sorter(Less& less, Swap& swap, Xorshift xorshift)
      : less_(less), swap_(swap), xorshift_(xorshift) {}

  void Pdqsort(int a, int b, int limit) {
    constexpr int kMaxInsertion = 12;
    bool was_balanced = true;
    bool was_partitioned = true;
    for (;;) {
      const int length = b - a;
      if (length <= kMaxInsertion) {
        InsertionSort(a, b);
        return;
      }
      if (limit == 0) {
        HeapSort(a, b);
        return;
      }
      if (!was_balanced) {
        BreakPatterns(a, b);
        --limit;
      }
      auto [pivot, hint] = ChoosePivot(a, b);
      if (hint == Hint::kDecreasing) {
        ReverseRange(a, b);
        pivot = (b - 1) - (pivot - a);
        hint = Hint::kIncreasing;
      }
      if (was_balanced && was_partitioned && hint == Hint::kIncreasing) {
        if (PartialInsertionSort(a, b)) return;
      }
      // Many elements equal to the one before this part: put the equal ones
      // first and go on with the greater ones.
      if (a > 0 && !less_(a - 1, pivot)) {
        a = PartitionEqual(a, b, pivot);
        continue;
      }
      auto [mid, already_partitioned] = Partition(a, b, pivot);
      was_partitioned = already_partitioned;
      const int left = mid - a;
      const int right = b - mid;
      const int balance_threshold = length / 8;
      if (left < right) {
        was_balanced = left >= balance_threshold;
        Pdqsort(a, mid, limit);
        a = mid + 1;
      } else {
        was_balanced = right >= balance_threshold;
        Pdqsort(mid + 1, b, limit);
        b = mid;
      }
    }
  }

 private:
  void InsertionSort(int a, int b) {
    for (int i = a + 1; i < b; ++i) {
      for (int j = i; j > a && less_(j, j - 1); --j) swap_(j, j - 1);
    }
  }

  void SiftDown(int lo, int hi, int first) {
    int root = lo;
    for (;;) {
      int child = 2 * root + 1;
      if (child >= hi) return;
      if (child + 1 < hi && less_(first + child, first + child + 1)) ++child;
      if (!less_(first + root, first + child)) return;
      swap_(first + root, first + child);
      root = child;
    }
  }

  void HeapSort(int a, int b) {
    const int first = a;
    const int hi = b - a;
    for (int i = (hi - 1) / 2; i >= 0; --i) SiftDown(i, hi, first);
    for (int i = hi - 1; i >= 0; --i) {
      swap_(first, first + i);
      SiftDown(0, i, first);
    }
  }

  std::pair<int, bool> Partition(int a, int b, int pivot) {
    swap_(a, pivot);
    int i = a + 1;
    int j = b - 1;
    while (i <= j && less_(i, a)) ++i;
    while (i <= j && !less_(j, a)) --j;
    if (i > j) {
      swap_(j, a);
      return {j, true};
    }
    swap_(i, j);
    ++i;
    --j;
    for (;;) {
      while (i <= j && less_(i, a)) ++i;
      while (i <= j && !less_(j, a)) --j;
      if (i > j) break;
      swap_(i, j);
      ++i;
      --j;
    }
    swap_(j, a);
    return {j, false};
  }

  int PartitionEqual(int a, int b, int pivot) {
    swap_(a, pivot);
    int i = a + 1;
    int j = b - 1;
    for (;;) {
      while (i <= j && !less_(a, i)) ++i;
      while (i <= j && less_(a, j)) --j;
      if (i > j) break;
      swap_(i, j);
      ++i;
      --j;
    }
    return i;
  }

  bool PartialInsertionSort(int a, int b) {
    constexpr int kMaxSteps = 5;
    constexpr int kShortestShifting = 50;
    int i = a + 1;
    for (int step = 0; step < kMaxSteps; ++step) {
      while (i < b && !less_(i, i - 1)) ++i;
      if (i == b) return true;
      if (b - a < kShortestShifting) return false;
      swap_(i, i - 1);
      if (i - a >= 2) {
        for (int j = i - 1; j >= 1; --j) {
          if (!less_(j, j - 1)) break;
          swap_(j, j - 1);
        }
      }
      if (b - i >= 2) {
        for (int j = i + 1; j < b; ++j) {
          if (!less_(j, j - 1)) break;
          swap_(j, j - 1);
        }
      }
    }
    return false;
  }

  void BreakPatterns(int a, int b) {
    const int length = b - a;
    if (length < 8) return;
    uint64_t random = static_cast<uint64_t>(length);
    const uint64_t modulus = uint64_t{1} << BitLen(static_cast<uint64_t>(length));
    for (int idx = a + (length / 4) * 2 - 1; idx <= a + (length / 4) * 2 + 1; ++idx) {
      random ^= random << 13;
      if (xorshift_ == Xorshift::kGo124) {
        random ^= random >> 7;
        random ^= random << 17;
      } else {
        random ^= random >> 17;
        random ^= random << 5;
      }
      int other = static_cast<int>(random & (modulus - 1));
      if (other >= length) other -= length;
      swap_(idx, a + other);
    }
  }

  std::pair<int, Hint> ChoosePivot(int a, int b) {
    constexpr int kShortestNinther = 50;
    constexpr int kMaxSwaps = 4 * 3;
    const int l = b - a;
    int swaps = 0;
    int i = a + l / 4 * 1;
    int j = a + l / 4 * 2;
    int k = a + l / 4 * 3;
    if (l >= 8) {
      if (l >= kShortestNinther) {
        i = MedianAdjacent(i, &swaps);
        j = MedianAdjacent(j, &swaps);
        k = MedianAdjacent(k, &swaps);
      }
      j = Median(i, j, k, &swaps);
    }
    if (swaps == 0) return {j, Hint::kIncreasing};
    if (swaps == kMaxSwaps) return {j, Hint::kDecreasing};
    return {j, Hint::kUnknown};
  }

  // Orders the indexes a and b by their elements, counting a swap.
  void Order2(int* a, int* b, int* swaps) {
    if (less_(*b, *a)) {
      ++*swaps;
      const int t = *a;
      *a = *b;
      *b = t;
    }
  }

  int Median(int a, int b, int c, int* swaps) {
    Order2(&a, &b, swaps);
    Order2(&b, &c, swaps);
    Order2(&a, &b, swaps);
    return b;
  }

  int MedianAdjacent(int a, int* swaps) { return Median(a - 1, a, a + 1, swaps); }

  void ReverseRange(int a, int b) {
    for (int i = a, j = b - 1; i < j; ++i, --j) swap_(i, j);
  }

  Less& less_;
  Swap& swap_;
  const Xorshift xorshift_;
};

}  // namespace go_sort_internal

// GoSort or GoSortBefore124, by `xorshift`.
template <typename Less, typename Swap>
void GoSortWith(go_sort_internal::Xorshift xorshift, int n, Less less, Swap swap) {
  if (n <= 1) return;
  go_sort_internal::Sorter<Less, Swap> sorter(less, swap, xorshift);
  sorter.Pdqsort(0, n, go_sort_internal::BitLen(static_cast<uint64_t>(n)));
}

// Sorts the n elements that less(i, j) and swap(i, j) address as Go's
// sort.Sort does (Go 1.24 and later). less must be a strict weak order.
template <typename Less, typename Swap>
void GoSort(int n, Less less, Swap swap) {
  GoSortWith(go_sort_internal::Xorshift::kGo124, n, less, swap);
}

// As GoSort, the way Go 1.19 to 1.23 sort.
template <typename Less, typename Swap>
void GoSortBefore124(int n, Less less, Swap swap) {
  GoSortWith(go_sort_internal::Xorshift::kBeforeGo124, n, less, swap);
}

}  // namespace capstan::util

#endif  // CAPSTAN_UTIL_GO_SORT_H_
