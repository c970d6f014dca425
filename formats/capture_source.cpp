#include "formats/capture_source.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>

#include <fmt/ranges.h>

#include "formats/errors.h"
#include "formats/hdf5_format.h"
#include "formats/pt_format.h"
#include "formats/flashinfer_trace.h"
#include "formats/safetensors_format.h"

namespace attnreplay {
namespace fs = std::filesystem;

namespace {

// A folder of HDF5 or safetensors captures, as capture writes them (one file per process): the
// files' calls one file after the other, files in name order. A file that cannot be opened is
// reported; the others are read.
class FileFolderSource final : public CaptureSource {
 public:
  FileFolderSource(std::string path, std::vector<std::string> files) : path_(std::move(path)) {
    std::sort(files.begin(), files.end());
    for (const std::string& file : files) {
      try {
        auto source = open_capture(file);
        for (const std::string& error : source->open_errors()) open_errors_.push_back(error);
        for (std::size_t i = 0; i < source->size(); ++i) positions_.emplace_back(sources_.size(), i);
        sources_.push_back(std::move(source));
      } catch (const InputError& error) {
        open_errors_.push_back(error.what());
      }
    }
    if (sources_.empty()) throw_input_error(path_, "no readable capture: {}", open_errors_.front());
  }
  const std::string& path() const override { return path_; }
  std::string format() const override {
    return fmt::format("folder of {} {} files", sources_.size(), sources_.front()->format());
  }
  std::size_t size() const override { return positions_.size(); }
  const std::vector<std::string>& open_errors() const override { return open_errors_; }
  AttentionCall load(std::size_t position, bool with_data) override {
    const auto [source, index] = positions_.at(position);
    return sources_[source]->load(index, with_data);
  }

 private:
  std::string path_;
  std::vector<std::unique_ptr<CaptureSource>> sources_;
  std::vector<std::pair<std::size_t, std::size_t>> positions_;  // (file, position in it)
  std::vector<std::string> open_errors_;
};

}  // namespace

std::unique_ptr<CaptureSource> open_capture(const std::string& path) {
  std::error_code error;
  const auto status = fs::status(path, error);
  if (error || !fs::exists(status)) throw_input_error(path, "no such file or folder");
  if (fs::is_directory(status)) {
    if (looks_like_flashinfer_trace(path)) return open_flashinfer_trace(path);
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(path)) {
      if (entry.path().extension() == ".pt") return open_pt_folder(path);
      const std::string extension = entry.path().extension().string();
      if (entry.is_regular_file() && (extension == ".h5" || extension == ".hdf5" || extension == ".safetensors")) {
        files.push_back(entry.path().string());
      }
    }
    if (!files.empty()) return std::make_unique<FileFolderSource>(path, std::move(files));
    throw_input_error(path, "a folder with no .pt, .h5, .hdf5 or .safetensors files, nor FlashInfer-Trace's definitions/ "
                            "and workloads/");
  }
  if (looks_like_hdf5(path)) return open_hdf5_capture(path);
  if (looks_like_zip(path)) return open_pt_file(path);
  if (looks_like_safetensors(path)) return open_safetensors_capture(path);
  if (fs::file_size(path, error) == 0) throw_input_error(path, "empty file");
  if (fs::path(path).extension() == ".jsonl" && fs::path(path).parent_path().parent_path().filename() == "workloads") {
    throw_input_error(path, "a FlashInfer-Trace workloads file: give the folder that holds definitions/ and workloads/");
  }
  // Neither signature: say what the content is, whatever the name says.
  refuse_legacy_torch_save(path);
  std::ifstream in(path, std::ios::binary);
  unsigned char head[8] = {};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  throw_input_error(path, "neither an HDF5 capture, a torch.save (.pt) file nor safetensors: it starts with bytes "
                          "{:02x}, not HDF5's signature, a zip's or a safetensors header",
                    fmt::join(std::span(head, static_cast<std::size_t>(in.gcount())), " "));
}

namespace {

class PtFolderWriter final : public CaptureWriter {
 public:
  explicit PtFolderWriter(std::string folder) : folder_(std::move(folder)) {
    std::error_code error;
    fs::create_directories(folder_, error);
    if (error) throw_input_error(folder_, "cannot create folder: {}", error.message());
  }
  void append(const AttentionCall& call) override {
    write_pt_call(call, (fs::path(folder_) / fmt::format("call_{:06d}.pt", call.call_index)).string());
  }
  void close() override {}

 private:
  std::string folder_;
};

// A format that holds every call in one file (.pt, .safetensors): the calls are kept until close(),
// which writes the file whole.
class WholeFileWriter final : public CaptureWriter {
 public:
  using Write = std::function<void(std::span<const AttentionCall>, const std::string&)>;
  WholeFileWriter(std::string path, Write write) : path_(std::move(path)), write_(std::move(write)) {}
  ~WholeFileWriter() override {
    try {
      close();
    } catch (...) {
    }
  }
  void append(const AttentionCall& call) override { calls_.push_back(call); }
  void close() override {
    if (closed_) return;
    closed_ = true;
    write_(calls_, path_);
  }

 private:
  std::string path_;
  Write write_;
  std::vector<AttentionCall> calls_;
  bool closed_ = false;
};

}  // namespace

std::unique_ptr<CaptureWriter> open_capture_writer(const std::string& path, const std::string& producer) {
  const fs::path target(path);
  std::error_code error;
  if (path.ends_with('/') || fs::is_directory(target, error)) return std::make_unique<PtFolderWriter>(path);
  const std::string extension = target.extension().string();
  if (extension == ".h5" || extension == ".hdf5") {
    Hdf5WriterOptions options;
    options.producer = producer;
    return std::make_unique<Hdf5CaptureWriter>(path, options);
  }
  if (extension == ".pt") {
    return std::make_unique<WholeFileWriter>(
        path, [](std::span<const AttentionCall> calls, const std::string& to) { write_pt_calls({calls.begin(), calls.end()}, to); });
  }
  if (extension == ".safetensors") {
    return std::make_unique<WholeFileWriter>(path, [producer](std::span<const AttentionCall> calls, const std::string& to) {
      write_safetensors_calls(calls, to, producer);
    });
  }
  throw_input_error(path, "unknown output format: use .h5, .pt, .safetensors, or a folder ending in '/'");
}

}  // namespace attnreplay
