// `attnreplay info`: what captures hold, read from their headers: calls, ops, shapes, dtypes, sizes;
// with --verify, every call read whole as a replay would, and how fast.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "formats/byte_pool.h"
#include "formats/capture_source.h"
#include "formats/mask_structure.h"
#include "replay/cli/command.h"
#include "replay/report/record_files.h"
#include "replay/report/text_wrap.h"

namespace attnreplay {
namespace {

// Within 120 columns for the usual ops and shapes; the bytes, the backend and the metadata go on
// the lines below, wrapped.
constexpr const char* kRowFormat = "  {:>4} {:<34} {:<8} {:<4} {:<36} {:<8} {}\n";
constexpr std::size_t kWidth = 120;

std::uint64_t tensor_bytes(const AttentionCall& call) {
  std::uint64_t bytes = call.q.nbytes() + call.k.nbytes() + call.v.nbytes();
  if (call.mask) bytes += call.mask->nbytes();
  if (call.out) bytes += call.out->nbytes();
  return bytes;
}

// The metadata a reader looks for first; the rest (process, thread, times) only with -v.
constexpr std::string_view kShownMetadata[] = {"layer", "step", "caller", "call_site"};

// A call site's path from its package on ("transformers/models/llama/modeling_llama.py:270 in
// forward"), where it is under a site-packages folder.
std::string short_call_site(const std::string& site) {
  for (const std::string_view folder : {"site-packages/", "dist-packages/"}) {
    if (const auto at = site.rfind(folder); at != std::string::npos) return site.substr(at + folder.size());
  }
  return site;
}

// "bytes=... backend=... layer=0 step=1 ...", in lines of at most kWidth characters after an indent, broken
// between fields (a field longer than a line has one to itself).
void print_details(const AttentionCall& call, std::uint64_t bytes, bool every_field) {
  std::vector<std::string> fields{fmt::format("bytes={}", bytes)};
  if (!call.backend.empty()) fields.push_back("backend=" + call.backend);
  if (every_field) {
    for (const auto& [key, value] : call.metadata) fields.push_back(key + "=" + value);
  } else {
    std::size_t shown = 0;
    for (const std::string_view key : kShownMetadata) {
      const auto found = call.metadata.find(std::string(key));
      if (found == call.metadata.end()) continue;
      fields.push_back(found->first + "=" + (key == "call_site" ? short_call_site(found->second) : found->second));
      ++shown;
    }
    if (const std::size_t hidden = call.metadata.size() - shown; hidden > 0) {
      fields.push_back(fmt::format("(+{} field{}: -v)", hidden, hidden == 1 ? "" : "s"));
    }
  }
  const std::string indent(8, ' ');
  std::cout << wrap_fields(fields, indent, indent, " ", kWidth);
}

// An op wider than its column keeps its start and end (the whole name is in the ops' count below).
std::string op_column(const std::string& op) {
  constexpr std::size_t kOpWidth = 34;
  if (op.size() <= kOpWidth) return op;
  return op.substr(0, 13) + "..." + op.substr(op.size() - (kOpWidth - 16));
}

void print_call(const AttentionCall& call, std::uint64_t bytes, bool every_field) {
  std::cout << fmt::format(kRowFormat, call.call_index, op_column(call.op), dtype_name(call.q.dtype), layout_name(call.layout),
                           call.shape().to_string(),
                           call.is_causal ? causal_alignment_name(call.causal_alignment) : "no",
                           call.mask ? fmt::format("{} {}", dtype_name(call.mask->dtype), shape_string(call.mask->shape))
                                     : "none");
  print_details(call, bytes, every_field);
}

// Reads every call of the capture whole, as a replay would; returns whether every one could be.
bool verify_capture(CaptureSource& source) {
  // Memory reused from call to call, as a replay's read-ahead reuses it.
  BytePool pool(std::uint64_t{4} << 30);
  const BytePoolScope scope(pool);
  bool all_read = true;
  std::uint64_t bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < source.size(); ++i) {
    try {
      const AttentionCall call = source.load(i, /*with_data=*/true);
      bytes += tensor_bytes(call);
      // What a mask is can be told only from its values, read here.
      if (call.mask && !call.is_ragged()) {
        std::cout << fmt::format("  call {}: mask {} {}: {}\n", call.call_index, dtype_name(call.mask->dtype),
                                 shape_string(call.mask->shape), read_call_visibility(call).mask_found);
      }
    } catch (const InputError& error) {
      std::cout << "  error: " << error.what() << '\n';
      all_read = false;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << fmt::format("  read whole: {} bytes in {:.3f} s, {:.2f} GB/s\n", bytes, seconds,
                           seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0.0);
  return all_read;
}

// Prints one capture; returns whether every call's header could be read (and with `verify`, every
// call whole).
bool print_capture(const std::string& input, bool verify, bool every_field) {
  auto source = open_capture(input);
  bool all_read = true;
  std::map<std::string, int> ops;
  std::uint64_t bytes = 0;
  std::cout << fmt::format("{}: {}, {} calls\n", input, source->format(), source->size());
  std::cout << fmt::format(kRowFormat, "call", "op", "dtype", "lay.", "shape", "causal", "mask");
  for (const std::string& error : source->open_errors()) {
    std::cout << "  error: " << error << '\n';
    all_read = false;
  }
  for (std::size_t i = 0; i < source->size(); ++i) {
    try {
      const AttentionCall call = source->load(i, /*with_data=*/false);
      const std::uint64_t call_bytes = tensor_bytes(call);
      bytes += call_bytes;
      ++ops[call.op];
      print_call(call, call_bytes, every_field);
    } catch (const InputError& error) {
      std::cout << "  error: " << error.what() << '\n';
      all_read = false;
    }
  }
  for (const auto& [op, count] : ops) std::cout << fmt::format("  {} x {}\n", count, op.empty() ? "(no op)" : op);
  std::cout << fmt::format("  tensor bytes: {}\n", bytes);
  if (verify) all_read = verify_capture(*source) && all_read;
  return all_read;
}

class InfoCommand final : public Command {
 public:
  void define(CLI::App& app) override {
    app.add_option("inputs", inputs_, "capture files or folders")->required();
    app.add_flag("--verify", verify_, "also read every call whole, as a replay would, say how fast, and what each mask is (docs/masks.md)");
    app.add_flag("-v,--verbose", every_field_, "every metadata field of each call, and call sites in full");
  }
  int run(const std::vector<std::string>&) override {
    int status = kExitOk;
    for (const std::string& input : inputs_) {
      try {
        if (!print_capture(input, verify_, every_field_)) status = kExitFailures;
      } catch (const InputError& error) {
        std::cerr << "error: " << error.what() << '\n';
        status = kExitFailures;
      }
    }
    return status;
  }

 private:
  std::vector<std::string> inputs_;
  bool verify_ = false, every_field_ = false;
};

}  // namespace

std::unique_ptr<Command> make_info_command() { return std::make_unique<InfoCommand>(); }

}  // namespace attnreplay
