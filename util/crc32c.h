// CRC-32C (Castagnoli), as Go's crc32.MakeTable(crc32.Castagnoli) computes
// it; etcd's HashKV uses it.

#ifndef CAPSTAN_UTIL_CRC32C_H_
#define CAPSTAN_UTIL_CRC32C_H_

#include <cstdint>
#include <string_view>

namespace capstan::util {

// Extends crc (the value of a previous call, or 0) with data.
uint32_t Crc32cExtend(uint32_t crc, std::string_view data);

}  // namespace capstan::util

#endif  // CAPSTAN_UTIL_CRC32C_H_
