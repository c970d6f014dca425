#pragma once
// Captures as safetensors (Hugging Face's tensor format: an 8-byte little-endian header length, a
// JSON header naming each tensor's dtype, shape and byte range, then the bytes). One file holds
// one or more calls: call i's tensors are named "call<i>.<field>" ("call0.q", "call0.mask"), and
// the header's "__metadata__" holds "format": "attnreplay-safetensors", "version": "1" and "calls":
// every call's other arguments as a JSON array (docs/format.md). A file without that metadata
// whose tensors are named q, k and v (and mask, out) reads as one bhsd call.
#include <memory>
#include <span>
#include <string>

#include "formats/capture_source.h"

namespace attnreplay {

// By content: a header length that fits the file, then '{'.
bool looks_like_safetensors(const std::string& path);

// Throws InputError naming the file (and the call and field) on a bad header.
std::unique_ptr<CaptureSource> open_safetensors_capture(const std::string& path);

// Writes `calls` as one file, whole (through `path`.partial, renamed). Throws InputError.
void write_safetensors_calls(std::span<const AttentionCall> calls, const std::string& path, const std::string& producer);

}  // namespace attnreplay
