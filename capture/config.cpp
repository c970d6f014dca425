#include "capture/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <regex>
#include <set>
#include <sstream>

namespace attnreplay::capture {

bool in_ranges(const CaptureConfig::Ranges& ranges, std::int64_t value) {
  return ranges.empty() || std::any_of(ranges.begin(), ranges.end(), [value](const auto& range) {
           return value >= range.first && value <= range.second;
         });
}

bool CaptureConfig::selects(std::int64_t call_index) const {
  return in_ranges(call_ranges, call_index) && call_index % every == 0;
}

std::optional<std::uint64_t> parse_byte_size(const std::string& text) {
  if (text.empty()) return std::nullopt;
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  std::string unit = text.substr(used);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::toupper(c); });
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (!unit.empty() && unit.back() == 'I') unit.pop_back();  // KiB, MiB, GiB: binary like K, M, G
  double scale = 1;
  if (unit == "K") scale = 1024.0;
  else if (unit == "M") scale = 1024.0 * 1024;
  else if (unit == "G") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty()) return std::nullopt;
  if (value < 0) return std::nullopt;
  return static_cast<std::uint64_t>(value * scale);
}

namespace {

std::optional<std::int64_t> parse_int(const std::string& text) {
  try {
    std::size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used != text.size()) return std::nullopt;
    return value;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// "0-40,55": inclusive ranges.
std::optional<CaptureConfig::Ranges> parse_ranges(const std::string& text) {
  CaptureConfig::Ranges ranges;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, ',');) {
    const auto dash = part.find('-', 1);
    auto low = parse_int(dash == std::string::npos ? part : part.substr(0, dash));
    auto high = dash == std::string::npos ? low : parse_int(part.substr(dash + 1));
    if (!low || !high || *low < 0 || *high < *low) return std::nullopt;
    ranges.emplace_back(*low, *high);
  }
  if (ranges.empty()) return std::nullopt;
  return ranges;
}

std::optional<bool> parse_bool(const std::string& text) {
  if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
  if (text == "0" || text == "false" || text == "no" || text == "off") return false;
  return std::nullopt;
}

}  // namespace

std::variant<CaptureConfig, std::string> parse_config(const std::function<const char*(const char*)>& lookup,
                                                      const std::vector<std::string>& attncap_names) {
  static const std::set<std::string> kKnown = {
      "ATTNCAP_OUT",        "ATTNCAP_FORMAT",      "ATTNCAP_OPS",     "ATTNCAP_CALLS",  "ATTNCAP_EVERY",
      "ATTNCAP_MAX_CALLS",  "ATTNCAP_MAX_BYTES",   "ATTNCAP_QUEUE_BYTES", "ATTNCAP_WHEN_FULL",
      "ATTNCAP_BACKWARD",   "ATTNCAP_OUTPUT",      "ATTNCAP_CALL_SITE", "ATTNCAP_CALLS_PER_STEP",
      "ATTNCAP_QUIET",      "ATTNCAP_ENABLE",      "ATTNCAP_TORCH_LIB",  "ATTNCAP_PARTS_DIR",
      "ATTNCAP_SUBSTITUTE", "ATTNCAP_SUBSTITUTE_CALLS", "ATTNCAP_SUBSTITUTE_LAYERS", "ATTNCAP_SUBSTITUTE_STEPS",
      "ATTNCAP_KERNEL_MODULE", "ATTNCAP_TIME_ATTENTION"};
  for (const std::string& name : attncap_names) {
    if (!kKnown.count(name)) return fmt::format("unknown variable {} (see docs/capture.md)", name);
  }
  CaptureConfig config;
  auto get = [&lookup](const char* name) -> std::optional<std::string> {
    const char* value = lookup(name);
    if (!value) return std::nullopt;
    return std::string(value);
  };
  auto bad = [](const char* name, const std::string& value, const char* expected) {
    return fmt::format("{}='{}': expected {}", name, value, expected);
  };
  if (auto v = get("ATTNCAP_OUT")) {
    if (v->empty()) return bad("ATTNCAP_OUT", *v, "a folder or a .h5 file path");
    config.out = *v;
  }
  if (auto v = get("ATTNCAP_FORMAT")) {
    if (*v == "h5" || *v == "hdf5") config.format = OutputFormat::hdf5;
    else if (*v == "pt") config.format = OutputFormat::pt;
    else if (*v == "safetensors") config.format = OutputFormat::safetensors;
    else return bad("ATTNCAP_FORMAT", *v, "h5, pt or safetensors");
  }
  if (auto v = get("ATTNCAP_OPS")) {
    try {
      std::regex check(*v);
    } catch (const std::regex_error& error) {
      return bad("ATTNCAP_OPS", *v, "a regular expression over op names");
    }
    // Users write short forms like 'sdpa|flash_attn'; sdpa stands for torch's attention ops.
    std::string pattern = *v;
    for (std::size_t at = pattern.find("sdpa"); at != std::string::npos; at = pattern.find("sdpa", at + 1)) {
      pattern.replace(at, 4, "scaled_dot_product");
    }
    config.ops_pattern = pattern;
  }
  const std::pair<const char*, CaptureConfig::Ranges*> range_lists[] = {
      {"ATTNCAP_CALLS", &config.call_ranges},
      {"ATTNCAP_SUBSTITUTE_CALLS", &config.substitute_calls},
      {"ATTNCAP_SUBSTITUTE_LAYERS", &config.substitute_layers},
      {"ATTNCAP_SUBSTITUTE_STEPS", &config.substitute_steps}};
  for (const auto& [name, target] : range_lists) {
    if (auto v = get(name)) {
      auto ranges = parse_ranges(*v);
      if (!ranges) return bad(name, *v, "ranges like 0-40,55");
      *target = std::move(*ranges);
    }
  }
  if (auto v = get("ATTNCAP_EVERY")) {
    auto n = parse_int(*v);
    if (!n || *n < 1) return bad("ATTNCAP_EVERY", *v, "a positive integer");
    config.every = *n;
  }
  if (auto v = get("ATTNCAP_MAX_CALLS")) {
    auto n = parse_int(*v);
    if (!n || *n < 0) return bad("ATTNCAP_MAX_CALLS", *v, "a non-negative integer");
    config.max_calls = *n;
  }
  if (auto v = get("ATTNCAP_MAX_BYTES")) {
    auto n = parse_byte_size(*v);
    if (!n) return bad("ATTNCAP_MAX_BYTES", *v, "a size like 500M or 10G");
    config.max_bytes = *n;
  }
  if (auto v = get("ATTNCAP_QUEUE_BYTES")) {
    auto n = parse_byte_size(*v);
    if (!n || *n == 0) return bad("ATTNCAP_QUEUE_BYTES", *v, "a positive size like 2G");
    config.queue_bytes = *n;
  }
  if (auto v = get("ATTNCAP_WHEN_FULL")) {
    if (*v == "wait") config.when_full = WhenFull::wait;
    else if (*v == "drop") config.when_full = WhenFull::drop;
    else return bad("ATTNCAP_WHEN_FULL", *v, "wait or drop");
  }
  const std::pair<const char*, bool*> flags[] = {{"ATTNCAP_BACKWARD", &config.backward},
                                                 {"ATTNCAP_OUTPUT", &config.record_output},
                                                 {"ATTNCAP_CALL_SITE", &config.call_site},
                                                 {"ATTNCAP_QUIET", &config.quiet},
                                                 {"ATTNCAP_TIME_ATTENTION", &config.time_attention}};
  for (const auto& [name, target] : flags) {
    if (auto v = get(name)) {
      auto value = parse_bool(*v);
      if (!value) return bad(name, *v, "0 or 1");
      *target = *value;
    }
  }
  if (auto v = get("ATTNCAP_CALLS_PER_STEP")) {
    auto n = parse_int(*v);
    if (!n || *n < 0) return bad("ATTNCAP_CALLS_PER_STEP", *v, "a non-negative integer");
    config.calls_per_step = *n;
  }
  if (auto v = get("ATTNCAP_SUBSTITUTE")) {
    if (v->empty()) return bad("ATTNCAP_SUBSTITUTE", *v, "a kernel's name, as `attnreplay kernels` lists them");
    config.substitute = *v;
  }
  // Substitution and timing alone write nothing; ATTNCAP_OUT asks for a capture beside them.
  if (!config.substitute.empty() || config.time_attention) config.capture = get("ATTNCAP_OUT").has_value();
  if (auto v = get("ATTNCAP_KERNEL_MODULE")) {
    std::stringstream stream(*v);
    for (std::string module; std::getline(stream, module, ':');) {
      if (!module.empty()) config.kernel_modules.push_back(module);
    }
  }
  for (const char* name : {"ATTNCAP_SUBSTITUTE_CALLS", "ATTNCAP_SUBSTITUTE_LAYERS", "ATTNCAP_SUBSTITUTE_STEPS",
                           "ATTNCAP_KERNEL_MODULE"}) {
    if (get(name) && config.substitute.empty()) return fmt::format("{} is set, but ATTNCAP_SUBSTITUTE is not", name);
  }
  if ((!config.substitute_layers.empty() || !config.substitute_steps.empty()) && !config.call_site) {
    return "ATTNCAP_SUBSTITUTE_LAYERS and ATTNCAP_SUBSTITUTE_STEPS need call sites to tell layers and steps apart: "
           "leave ATTNCAP_CALL_SITE on";
  }
  return config;
}

}  // namespace attnreplay::capture
