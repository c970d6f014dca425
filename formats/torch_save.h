#pragma once
// A file torch.save wrote (a zip of a pickle and one record per storage), read at page-cache speed:
// the zip's directory by caffe2's reader (torch.load's), then the pickle of plain containers and
// tensors that torch.save writes, by a small unpickler of its own, with each tensor described (shape, dtype, strides, where its bytes
// are) rather than read. A tensor's bytes are read only when asked for, straight into memory: one
// read per tensor, no per-element decoding, and a call's header costs the pickle alone.
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "formats/host_tensor.h"

namespace attnreplay {

// A pickle this reader does not follow (an object other than containers, numbers, strings and
// tensors): torch's own reader may, and is used instead.
class PickleNotUnderstood : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class TorchSaveArchive {
 public:
  // Reads the directory and the pickle; tensors in root() are meta tensors until host_tensor()
  // reads them. Throws InputError naming the file for a damaged archive, PickleNotUnderstood for a
  // pickle beyond this reader.
  explicit TorchSaveArchive(std::string path);
  ~TorchSaveArchive();
  TorchSaveArchive(const TorchSaveArchive&) = delete;
  TorchSaveArchive& operator=(const TorchSaveArchive&) = delete;

  const c10::IValue& root() const { return root_; }
  // A tensor of root(): with data, its bytes read from the file (contiguous); without, its shape,
  // dtype and strides alone. Throws InputError for a tensor that is not this archive's.
  HostTensor host_tensor(const at::Tensor& tensor, bool with_data) const;

 private:
  struct Record {
    std::uint64_t offset = 0;  // of the stored bytes in the file
    std::uint64_t size = 0;
  };
  // Where a tensor's elements are: its storage's record and its view of it.
  struct Slice {
    std::string storage_key;
    std::int64_t storage_offset = 0;  // elements
    std::vector<std::int64_t> sizes, strides;
  };
  friend class TorchSaveUnpickler;

  void read_directory();
  // `bytes` bytes of a record from `skip` on, into memory from allocate_bytes() (reused where a
  // reader's pool is in scope).
  std::shared_ptr<std::vector<std::byte>> read_record(const Record& record, std::uint64_t skip, std::uint64_t bytes) const;

  std::string path_;
  int fd_ = -1;
  std::map<std::string, Record> records_;  // by name inside the archive, its folder left off
  std::map<const void*, Slice> slices_;    // by the meta tensor's TensorImpl
  c10::IValue root_;
};

}  // namespace attnreplay
