#pragma once
// A fast 64-bit content hash, used to store identical tensors once. Not cryptographic.
#include <cstddef>
#include <cstdint>

namespace attnreplay {

std::uint64_t content_hash(const void* data, std::size_t size);

}  // namespace attnreplay
