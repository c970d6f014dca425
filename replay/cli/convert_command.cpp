// `attnreplay convert`: a capture in another format (.h5, .pt, .safetensors, a folder of .pt calls, FlashInfer-Trace);
// a call that cannot be read is named and skipped, the others are written. A call the target format cannot hold
// (FlashInfer-Trace has no definition for it) is listed with the reason, and is not a failure.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>
#include <map>
#include <regex>

#include "formats/capture_source.h"
#include "formats/errors.h"
#include "formats/flashinfer_trace.h"
#include "replay/cli/command.h"
#include "replay/report/record_files.h"

namespace attnreplay {
namespace {

class ConvertCommand final : public Command {
 public:
  void define(CLI::App& app) override {
    app.add_option("from", from_, "capture to read")->required();
    // Named apart from --to: CLI11 keeps one namespace for positionals and flags.
    app.add_option("output", to_, "capture to write: .h5, .pt, .safetensors, or a folder ending in '/'")->required();
    app.add_option("--to", format_, "the format of `to`: by its name (default), or flashinfer-trace (a folder of FlashInfer-Bench's "
                                    "definitions and workloads, docs/format.md)")
        ->check(CLI::IsMember({"auto", "flashinfer-trace"}));
  }

  int run(const std::vector<std::string>&) override {
    auto source = open_capture(from_);
    auto writer = format_ == "flashinfer-trace" ? open_flashinfer_trace_writer(to_, "attnreplay convert")
                                                : open_capture_writer(to_, "attnreplay convert");
    int written = 0;
    std::map<std::string, std::vector<std::int64_t>> not_written;  // reason -> calls
    int status = kExitOk;
    for (const std::string& error : source->open_errors()) {
      std::cerr << "error: " << error << '\n';
      status = kExitFailures;
    }
    for (std::size_t i = 0; i < source->size(); ++i) {
      try {
        writer->append(source->load(i));
        ++written;
      } catch (const NotRepresentable& refusal) {
        // "caps.h5: call 3: a sliding window (left 64): ..." -> the reason, the call apart
        static const std::regex place(R"(^.*?: call -?\d+: )");
        not_written[std::regex_replace(refusal.what(), place, "")].push_back(static_cast<std::int64_t>(i));
      } catch (const InputError& error) {
        std::cerr << "error: " << error.what() << " (skipped)\n";
        status = kExitFailures;
      }
    }
    writer->close();
    std::cout << fmt::format("{}: {} of {} calls written\n", to_, written, source->size());
    for (const auto& [reason, calls] : not_written) {
      std::cout << fmt::format("  not written, {} call{} ({}): {}\n", calls.size(), calls.size() == 1 ? "" : "s",
                               call_list(calls), reason);
    }
    return status;
  }

 private:
  // "0-3, 7, 9"
  static std::string call_list(const std::vector<std::int64_t>& calls) {
    std::string text;
    for (std::size_t i = 0; i < calls.size();) {
      std::size_t j = i;
      while (j + 1 < calls.size() && calls[j + 1] == calls[j] + 1) ++j;
      text += fmt::format("{}{}", text.empty() ? "" : ", ", j > i ? fmt::format("{}-{}", calls[i], calls[j]) : std::to_string(calls[i]));
      i = j + 1;
    }
    return text;
  }

  std::string from_, to_, format_ = "auto";
};

}  // namespace

std::unique_ptr<Command> make_convert_command() { return std::make_unique<ConvertCommand>(); }

}  // namespace attnreplay
