#pragma once
// Capture's configuration: ATTNCAP_* environment variables (docs/capture.md). A bad value is
// reported once and capture stays off; the job itself always runs on.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace attnreplay::capture {

// Ops captured by default: torch SDPA and its backends, the attention ops that flash-attn (and
// vLLM's and SGLang's builds of it), SageAttention and xformers register, and the Python entry
// points capture wraps (FlashInfer's, flash-attn's flash_attn_with_kvcache; python_entry_points.py),
// by the names they are recorded under. nn.MultiheadAttention's fast path (aten::_native_multi_head_attention) is left out on
// purpose: its inputs are the unprojected sequences, not per-head Q, K, V (the observer reports
// when it computes attention unseen).
inline constexpr const char* kDefaultOpsPattern =
    R"(^aten::(scaled_dot_product_attention|_scaled_dot_product_\w*attention\w*|_flash_attention_forward|_efficient_attention_forward)$|^flash_attn\w*::|^_vllm_fa\d_C::|^sgl_kernel::fwd$|^sage\w*::|^xformers\w*::.*attention|^flashinfer::)";

enum class WhenFull { wait, drop };
enum class OutputFormat { hdf5, pt, safetensors };

struct CaptureConfig {
  std::string out = "attncap";  // folder (created) for one file per process, or a .h5 path
  OutputFormat format = OutputFormat::hdf5;
  std::string ops_pattern = kDefaultOpsPattern;
  std::vector<std::pair<std::int64_t, std::int64_t>> call_ranges;  // empty: every call
  std::int64_t every = 1;
  std::int64_t max_calls = -1;      // -1: no limit
  std::uint64_t max_bytes = 0;      // written bytes; 0: no limit
  std::uint64_t queue_bytes = 4ull << 30;  // host memory held by calls waiting to be written
  WhenFull when_full = WhenFull::wait;
  bool backward = false;       // also capture backward attention ops
  bool record_output = true;   // store the output the model got
  bool call_site = true;       // Python file:line and caller object, or the C++ frame
  std::int64_t calls_per_step = 0;  // 0: infer steps and layers from the caller objects
  bool quiet = false;          // no summary at exit
  bool time_attention = false;  // sum each attention call's time and say it at exit (attention_clock.h)
  // Whether calls are written: always, except where ATTNCAP_SUBSTITUTE or ATTNCAP_TIME_ATTENTION is
  // set without ATTNCAP_OUT.
  bool capture = true;
  // Kernel substitution (capture/substitution.h): the kernel, and the calls, layers and steps it
  // takes (empty: all); the call's index counts every attention call, as ATTNCAP_CALLS does.
  std::string substitute;
  std::vector<std::string> kernel_modules;  // Python kernels' files or modules (ATTNCAP_KERNEL_MODULE)
  using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;
  Ranges substitute_calls, substitute_layers, substitute_steps;

  bool selects(std::int64_t call_index) const;
};

// Whether `value` is in one of `ranges`; every value is when there are none.
bool in_ranges(const CaptureConfig::Ranges& ranges, std::int64_t value);

// Reads every ATTNCAP_* variable through `lookup`; an unknown ATTNCAP_ name is an error too, so
// that a typo does not silently capture everything. Returns the config or the error message.
std::variant<CaptureConfig, std::string> parse_config(
    const std::function<const char*(const char*)>& lookup, const std::vector<std::string>& attncap_names);

std::optional<std::uint64_t> parse_byte_size(const std::string& text);  // "512M", "10G", "1000"

}  // namespace attnreplay::capture
