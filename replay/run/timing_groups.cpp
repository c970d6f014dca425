#include "replay/run/timing_groups.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "formats/content_hash.h"

namespace attnreplay {
namespace {

std::string describe(const HostTensor& t) {
  return fmt::format("{}[{}]/[{}]", dtype_name(t.dtype), fmt::join(t.shape, ","), fmt::join(t.captured_strides, ","));
}

}  // namespace

std::string timing_key(const AttentionCall& call) {
  std::string key = fmt::format("{} q {} k {} v {}", layout_name(call.layout), describe(call.q), describe(call.k),
                                describe(call.v));
  if (call.mask) {
    key += " mask " + describe(*call.mask);
    // A header loaded without data (the share-out's plan) groups by the mask's kind alone.
    if (call.mask->data()) key += fmt::format(" {:016x}", content_hash(call.mask->data(), call.mask->nbytes()));
  }
  if (call.is_causal) key += fmt::format(" causal {}", causal_alignment_name(call.causal_alignment));
  // A window or softcap changes the work; a ragged batch's lengths and pages change it too.
  for (const auto extension : call.extensions()) key += " " + call.describe(extension);
  for (const auto& [name, tensor] : call.named_tensors()) {
    if (name.rfind("cu_seqlens", 0) != 0 && name != "seqused_k" && name != "block_table") continue;
    key += fmt::format(" {} {}", name, describe(*tensor));
    if (tensor->data()) key += fmt::format(" {:016x}", content_hash(tensor->data(), tensor->nbytes()));
  }
  return key;
}

const SharedTiming* TimingGroups::shared(const std::string& key, const std::string& kernel) const {
  if (timed_per_group_ <= 0) return nullptr;
  const auto found = entries_.find({key, kernel});
  return found != entries_.end() && found->second.timed >= timed_per_group_ ? &found->second.first : nullptr;
}

void TimingGroups::record(const std::string& key, const std::string& kernel, SharedTiming timing) {
  Entry& entry = entries_[{key, kernel}];
  if (entry.timed++ == 0) entry.first = std::move(timing);
}

}  // namespace attnreplay
