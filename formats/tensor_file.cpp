#include "formats/tensor_file.h"

#include <ATen/core/ivalue.h>
#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>

#include "formats/errors.h"
#include "formats/image_file.h"
#include "formats/safetensors_format.h"
#include "formats/torch_save.h"

namespace attnreplay {
namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("{}: cannot open", path));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// NumPy's format (numpy.lib.format): a magic string, a version, a header length, a Python dict
// literal with 'descr', 'fortran_order' and 'shape', then the elements in C order.
HostTensor read_npy(const std::string& path, const std::string& bytes) {
  auto bad = [&](const std::string& what) { return InputError(fmt::format("{}: not a .npy file NumPy wrote: {}", path, what)); };
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0) throw bad("no \\x93NUMPY magic");
  const int major = static_cast<unsigned char>(bytes[6]);
  std::size_t header_length = 0, header_start = 0;
  if (major == 1) {
    header_length = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    header_start = 10;
  } else if (bytes.size() >= 12) {
    std::uint32_t length = 0;
    std::memcpy(&length, bytes.data() + 8, 4);
    header_length = length;
    header_start = 12;
  }
  if (header_start == 0 || header_start + header_length > bytes.size()) throw bad("a header longer than the file");
  const std::string header = bytes.substr(header_start, header_length);
  std::smatch descr, order, shape;
  if (!std::regex_search(header, descr, std::regex(R"('descr':\s*'([^']*)')")) ||
      !std::regex_search(header, order, std::regex(R"('fortran_order':\s*(True|False))")) ||
      !std::regex_search(header, shape, std::regex(R"('shape':\s*\(([^)]*)\))"))) {
    throw bad(fmt::format("a header without descr, fortran_order and shape: {}", header));
  }
  if (order[1] == "True") throw InputError(fmt::format("{}: a Fortran-ordered array; save it C-ordered (np.ascontiguousarray)", path));
  static const std::map<std::string, DType> kDtypes = {
      {"<f8", DType::float64}, {"<f4", DType::float32}, {"<f2", DType::float16}, {"<i8", DType::int64},
      {"<i4", DType::int32},   {"|i1", DType::int8},    {"|u1", DType::uint8},   {"|b1", DType::boolean}};
  const auto dtype = kDtypes.find(descr[1]);
  if (dtype == kDtypes.end()) {
    throw InputError(fmt::format("{}: dtype '{}' is not compared (little-endian float64/32/16, int64/32/8, uint8, "
                                 "bool are)", path, descr[1].str()));
  }
  std::vector<std::int64_t> dims;
  const std::string dims_text = shape[1];
  const std::regex digits(R"(\d+)");
  for (std::sregex_iterator it(dims_text.begin(), dims_text.end(), digits), end; it != end; ++it) {
    dims.push_back(std::stoll(it->str()));
  }
  HostTensor tensor = HostTensor::allocate(dtype->second, dims);
  const std::size_t data_start = header_start + header_length;
  if (bytes.size() - data_start < tensor.nbytes()) {
    throw bad(fmt::format("{} bytes of elements where shape {} needs {}", bytes.size() - data_start,
                          shape_string(dims), tensor.nbytes()));
  }
  std::memcpy(tensor.mutable_data(), bytes.data() + data_start, tensor.nbytes());
  return tensor;
}

// torch.save's containers, walked for their tensors.
void collect_tensors(const TorchSaveArchive& archive, const c10::IValue& value, const std::string& name,
                     std::vector<std::pair<std::string, HostTensor>>& tensors) {
  auto child = [&](const std::string& key) { return name.empty() ? key : name + "." + key; };
  if (value.isTensor()) {
    tensors.emplace_back(name, archive.host_tensor(value.toTensor(), /*with_data=*/true));
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      const c10::IValue& key = entry.key();
      const std::string key_name = key.isString() ? key.toStringRef() : key.isInt() ? std::to_string(key.toInt()) : "?";
      collect_tensors(archive, entry.value(), child(key_name), tensors);
    }
  } else if (value.isList() || value.isTuple()) {
    const auto elements = value.isList() ? value.toListRef().vec() : value.toTupleRef().elements().vec();
    for (std::size_t i = 0; i < elements.size(); ++i) collect_tensors(archive, elements[i], child(std::to_string(i)), tensors);
  }
}

}  // namespace

std::vector<std::pair<std::string, HostTensor>> read_tensor_file(const std::string& path) {
  std::vector<std::pair<std::string, HostTensor>> tensors;
  std::string head(8, '\0');
  {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw InputError(fmt::format("{}: cannot open", path));
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<std::size_t>(in.gcount()));
  }
  if (const ImageKind kind = image_kind(head); kind != ImageKind::none) {
    tensors.emplace_back("", read_image_file(path, kind));
  } else if (head.rfind("\x93NUMPY", 0) == 0) {
    tensors.emplace_back("", read_npy(path, read_bytes(path)));
  } else if (head.rfind("PK", 0) == 0) {
    try {
      TorchSaveArchive archive(path);
      collect_tensors(archive, archive.root(), "", tensors);
    } catch (const PickleNotUnderstood& error) {
      throw InputError(fmt::format("{}: a zip that is not a torch.save of tensors and containers of them ({})", path,
                                   error.what()));
    } catch (const InputError& error) {
      // NumPy's .npz is a zip too, of .npy files.
      throw InputError(fmt::format("{} (NumPy's .npz is not read: save arrays with np.save, or a dict of tensors with "
                                   "torch.save or safetensors)", error.what()));
    }
  } else if (looks_like_safetensors(path)) {
    SafetensorsFile file(path);
    for (const auto& [name, info] : file.tensors()) tensors.emplace_back(name, file.tensor(name));
  } else {
    throw InputError(fmt::format("{}: not a .npy, .pt (torch.save), .safetensors, PNG or JPEG file, by its content",
                                 path));
  }
  if (tensors.empty()) throw InputError(fmt::format("{}: holds no tensor", path));
  return tensors;
}

}  // namespace attnreplay
