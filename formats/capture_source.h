#pragma once
// Reading captures: one interface over every format, so replay, info and convert never care
// where a call came from. Calls load one at a time; a bad call throws for itself alone.
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "formats/attention_call.h"

namespace attnreplay {

class CaptureSource {
 public:
  virtual ~CaptureSource() = default;
  virtual const std::string& path() const = 0;
  // e.g. "attnreplay-hdf5 v1", "attnreplay-pt v1", "aiter-pt-folder"
  virtual std::string format() const = 0;
  virtual std::size_t size() const = 0;
  // Loads the call at `position` (0 .. size()-1, in call order). Without data the tensors carry
  // shape, dtype and strides but no bytes. Throws InputError naming file, call and field.
  virtual AttentionCall load(std::size_t position, bool with_data = true) = 0;
  // Problems that made calls unreachable while opening (e.g. an unreadable file in a folder).
  virtual const std::vector<std::string>& open_errors() const = 0;
};

// Detects the format by content (HDF5 signature, zip) or by folder contents. Throws InputError.
std::unique_ptr<CaptureSource> open_capture(const std::string& path);

// Writing: every call is durable once append() returns (HDF5 flushes; .pt folders write a file
// per call). A single .pt file holds all calls and is written by close().
class CaptureWriter {
 public:
  virtual ~CaptureWriter() = default;
  virtual void append(const AttentionCall& call) = 0;
  virtual void close() = 0;
};

// ".h5"/".hdf5": HDF5 schema v1. ".pt": one torch.load-able file. A path ending in '/' or an
// existing folder: one .pt per call inside it.
// `producer` is recorded in the file (HDF5's root attribute 'producer').
std::unique_ptr<CaptureWriter> open_capture_writer(const std::string& path, const std::string& producer);

}  // namespace attnreplay
