#pragma once
// .pt files: what Python's torch.load (weights_only=True) reads, and peers' .pt captures.
// Reading goes through libtorch's C++ unpickler, which rebuilds tensors and plain containers
// only and never runs pickled code.
#include <memory>
#include <string>
#include <vector>

#include "formats/capture_source.h"

namespace attnreplay {

inline constexpr std::int64_t kPtSchemaVersion = 2;
inline constexpr const char* kPtSchemaName = "attnreplay.call";

bool looks_like_zip(const std::string& path);
// Throws InputError, naming the file, when it is a legacy (pre-1.6, pickle-only) torch.save file;
// returns otherwise. For readers that found no zip signature, before they say what else it is.
void refuse_legacy_torch_save(const std::string& path);
// A single .pt: one attnreplay call dict, {"calls": [...]}, an aiter call dict, or a plain
// {q,k,v} / {query,key,value} dict.
std::unique_ptr<CaptureSource> open_pt_file(const std::string& path);
// A folder of .pt files: aiter's <kernel>_input_<n>.pt capture, or attnreplay's call_<n>.pt.
std::unique_ptr<CaptureSource> open_pt_folder(const std::string& path);

void write_pt_calls(const std::vector<AttentionCall>& calls, const std::string& path);
void write_pt_call(const AttentionCall& call, const std::string& path);
// A dict of named tensors and string metadata (used for saved kernel outputs).
void write_pt_tensors(const std::vector<std::pair<std::string, HostTensor>>& tensors,
                      const std::vector<std::pair<std::string, std::string>>& strings,
                      const std::string& path);

}  // namespace attnreplay
