#pragma once
// attnreplay's HDF5 capture schema (docs/format.md). Every dataset exists from the start and is
// only ever appended to, so the writer runs in SWMR mode and a killed writer leaves a file whose
// completed calls all read back.
#include <cstdint>
#include <memory>
#include <string>

#include "formats/capture_source.h"

namespace attnreplay {

inline constexpr std::int64_t kHdf5SchemaVersion = 2;
inline constexpr const char* kHdf5SchemaName = "attnreplay.capture";

struct Hdf5WriterOptions {
  // Store a tensor whose bytes were already written once (a CFG duplicate, a repeated K/V) only
  // once; its row points at the first copy.
  bool deduplicate = true;
  std::string producer;  // free text stored in the root attribute 'producer'
  bool exclusive = false;  // fail if the file exists, instead of replacing it
};

class Hdf5CaptureWriter final : public CaptureWriter {
 public:
  explicit Hdf5CaptureWriter(const std::string& path, Hdf5WriterOptions options = {});
  ~Hdf5CaptureWriter() override;
  void append(const AttentionCall& call) override;
  void close() override;
  std::size_t calls_written() const;
  std::uint64_t bytes_written() const;
  std::uint64_t bytes_deduplicated() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

bool looks_like_hdf5(const std::string& path);
std::unique_ptr<CaptureSource> open_hdf5_capture(const std::string& path);

}  // namespace attnreplay
