// `attnreplay convert`: a capture in another format (.h5, .pt, .safetensors, a folder of .pt calls); a call that
// cannot be read is named and skipped, the others are written.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <iostream>

#include "formats/capture_source.h"
#include "replay/cli/command.h"
#include "replay/report/record_files.h"

namespace attnreplay {
namespace {

class ConvertCommand final : public Command {
 public:
  void define(CLI::App& app) override {
    app.add_option("from", from_, "capture to read")->required();
    app.add_option("to", to_, "capture to write: .h5, .pt, .safetensors, or a folder ending in '/'")->required();
  }

  int run(const std::vector<std::string>&) override {
    auto source = open_capture(from_);
    auto writer = open_capture_writer(to_, "attnreplay convert");
    int written = 0;
    int status = kExitOk;
    for (const std::string& error : source->open_errors()) {
      std::cerr << "error: " << error << '\n';
      status = kExitFailures;
    }
    for (std::size_t i = 0; i < source->size(); ++i) {
      try {
        writer->append(source->load(i));
        ++written;
      } catch (const InputError& error) {
        std::cerr << "error: " << error.what() << " (skipped)\n";
        status = kExitFailures;
      }
    }
    writer->close();
    std::cout << fmt::format("{}: {} of {} calls written\n", to_, written, source->size());
    return status;
  }

 private:
  std::string from_, to_;
};

}  // namespace

std::unique_ptr<Command> make_convert_command() { return std::make_unique<ConvertCommand>(); }

}  // namespace attnreplay
