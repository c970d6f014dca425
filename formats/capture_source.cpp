#include "formats/capture_source.h"

#include <filesystem>

#include "formats/errors.h"
#include "formats/hdf5_format.h"
#include "formats/pt_format.h"

namespace attnreplay {
namespace fs = std::filesystem;

std::unique_ptr<CaptureSource> open_capture(const std::string& path) {
  std::error_code error;
  const auto status = fs::status(path, error);
  if (error || !fs::exists(status)) throw_input_error(path, "no such file or folder");
  if (fs::is_directory(status)) {
    // A folder of HDF5 captures (one per process) is not one call order; replay takes them as
    // separate inputs.
    for (const auto& entry : fs::directory_iterator(path)) {
      if (entry.path().extension() == ".pt") return open_pt_folder(path);
    }
    throw_input_error(path, "a folder with no .pt files; pass HDF5 captures as files");
  }
  if (looks_like_hdf5(path)) return open_hdf5_capture(path);
  if (looks_like_zip(path)) return open_pt_file(path);
  if (fs::file_size(path, error) == 0) throw_input_error(path, "empty file");
  return open_pt_file(path);  // gives the precise reason it is neither format
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

class PtFileWriter final : public CaptureWriter {
 public:
  explicit PtFileWriter(std::string path) : path_(std::move(path)) {}
  ~PtFileWriter() override {
    try {
      close();
    } catch (...) {
    }
  }
  void append(const AttentionCall& call) override { calls_.push_back(call); }
  void close() override {
    if (closed_) return;
    closed_ = true;
    write_pt_calls(calls_, path_);
  }

 private:
  std::string path_;
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
  if (extension == ".pt") return std::make_unique<PtFileWriter>(path);
  throw_input_error(path, "unknown output format: use .h5, .pt, or a folder ending in '/'");
}

}  // namespace attnreplay
