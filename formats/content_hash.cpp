#include "formats/content_hash.h"

#include <cstring>

namespace attnreplay {
namespace {

std::uint64_t mix(std::uint64_t value) {
  // The finaliser of splitmix64: every input bit reaches every output bit.
  value ^= value >> 30;
  value *= 0xbf58476d1ce4e5b9ULL;
  value ^= value >> 27;
  value *= 0x94d049bb133111ebULL;
  value ^= value >> 31;
  return value;
}

}  // namespace

std::uint64_t content_hash(const void* data, std::size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  // Four independent lanes keep the multiply latency off the critical path.
  std::uint64_t lanes[4] = {0x9e3779b97f4a7c15ULL, 0xc2b2ae3d27d4eb4fULL, 0x165667b19e3779f9ULL,
                            0x27d4eb2f165667c5ULL};
  std::size_t i = 0;
  for (; i + 32 <= size; i += 32) {
    for (int lane = 0; lane < 4; ++lane) {
      std::uint64_t word;
      std::memcpy(&word, bytes + i + 8 * lane, 8);
      lanes[lane] = mix(lanes[lane] ^ word) + word;
    }
  }
  std::uint64_t tail = 0;
  std::uint64_t hash = mix(size);
  for (; i < size; ++i) tail = (tail << 8) | bytes[i], hash = mix(hash ^ tail);
  for (std::uint64_t lane : lanes) hash = mix(hash ^ lane) + lane;
  return hash;
}

}  // namespace attnreplay
