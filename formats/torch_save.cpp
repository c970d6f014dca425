#include "formats/torch_save.h"

#include <caffe2/serialize/inline_container.h>

#include <ATen/ATen.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <variant>

#include "formats/byte_pool.h"
#include "formats/errors.h"
#include "formats/torch_tensor.h"

namespace attnreplay {
namespace {

std::uint64_t little_endian(const unsigned char* bytes, int count) {
  std::uint64_t value = 0;
  for (int i = count - 1; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

// torch.save's storage classes, by the name its pickle gives them.
std::optional<DType> storage_dtype(const std::string& name) {
  static const std::map<std::string, DType, std::less<>> kStorages = {
      {"DoubleStorage", DType::float64},     {"FloatStorage", DType::float32}, {"HalfStorage", DType::float16},
      {"BFloat16Storage", DType::bfloat16},  {"LongStorage", DType::int64},    {"IntStorage", DType::int32},
      {"CharStorage", DType::int8},          {"ByteStorage", DType::uint8},    {"BoolStorage", DType::boolean},
      {"Float8_e4m3fnStorage", DType::float8_e4m3fn}, {"Float8_e5m2Storage", DType::float8_e5m2}};
  const auto found = kStorages.find(name);
  if (found == kStorages.end()) return std::nullopt;
  return found->second;
}

}  // namespace

// The subset of pickle's opcodes (protocols 2 to 5) that torch.save writes for dicts, lists, tuples,
// strings, numbers and tensors. Anything else is PickleNotUnderstood.
class TorchSaveUnpickler {
 public:
  TorchSaveUnpickler(TorchSaveArchive& archive, const std::vector<std::byte>& pickle)
      : archive_(archive), data_(reinterpret_cast<const unsigned char*>(pickle.data())), size_(pickle.size()) {}

  c10::IValue run() {
    while (true) {
      const unsigned char op = byte();
      if (op == '.') break;  // STOP
      step(op);
    }
    if (stack_.size() != 1) throw PickleNotUnderstood("the pickle does not end with one object");
    return ivalue(pop());
  }

 private:
  struct Mark {};
  struct Global {
    std::string module, name;
  };
  struct StorageRef {
    std::string key;
    std::optional<DType> dtype;  // none for an untyped storage (_rebuild_tensor_v3 names it)
  };
  struct Tuple;
  using Value = std::variant<c10::IValue, Mark, Global, StorageRef, std::shared_ptr<Tuple>>;
  struct Tuple {
    std::vector<Value> items;
  };

  unsigned char byte() {
    need(1);
    return data_[at_++];
  }
  void need(std::size_t bytes) const {
    if (at_ + bytes > size_) throw PickleNotUnderstood("the pickle ends early");
  }
  std::uint64_t unsigned_le(int count) {
    need(count);
    const std::uint64_t value = little_endian(data_ + at_, count);
    at_ += count;
    return value;
  }
  std::string text(std::size_t length) {
    need(length);
    std::string out(reinterpret_cast<const char*>(data_ + at_), length);
    at_ += length;
    return out;
  }
  std::string line() {
    std::string out;
    for (unsigned char c = byte(); c != '\n'; c = byte()) out += static_cast<char>(c);
    return out;
  }
  Value pop() {
    if (stack_.empty()) throw PickleNotUnderstood("pickle stack underflow");
    Value value = std::move(stack_.back());
    stack_.pop_back();
    return value;
  }
  // The values since the last MARK, which is removed.
  std::vector<Value> pop_mark() {
    if (marks_.empty()) throw PickleNotUnderstood("pickle MARK missing");
    const std::size_t from = marks_.back();
    marks_.pop_back();
    std::vector<Value> items(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(from)),
                             std::make_move_iterator(stack_.end()));
    stack_.resize(from);
    return items;
  }
  // A value as it goes into a container: a module-level object torch.save names (a dtype) as its
  // qualified name.
  static c10::IValue ivalue(const Value& value) {
    if (const auto* plain = std::get_if<c10::IValue>(&value)) return *plain;
    if (const auto* global = std::get_if<Global>(&value)) return c10::IValue(global->module + "." + global->name);
    if (const auto* tuple = std::get_if<std::shared_ptr<Tuple>>(&value)) {
      std::vector<c10::IValue> items;
      for (const Value& item : (*tuple)->items) items.push_back(ivalue(item));
      return c10::ivalue::Tuple::create(std::move(items));
    }
    throw PickleNotUnderstood("a storage or MARK where a value belongs");
  }
  static c10::IValue empty_dict() { return c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()); }
  static c10::IValue empty_list() { return c10::impl::GenericList(c10::AnyType::get()); }
  void push_tuple(std::vector<Value> items) { stack_.emplace_back(std::make_shared<Tuple>(Tuple{std::move(items)})); }

  void step(unsigned char op);
  void memo_put(std::size_t index) {
    if (stack_.empty()) throw PickleNotUnderstood("pickle memo of nothing");
    if (memo_.size() <= index) memo_.resize(index + 1);
    memo_[index] = stack_.back();
  }
  void set_items(std::vector<Value> items);
  void append_items(std::vector<Value> items);
  Value reduce(const Value& callable, const Value& arguments);
  Value rebuild_tensor(const std::vector<Value>& args, std::optional<DType> dtype);
  StorageRef persistent(const Value& pid);

  TorchSaveArchive& archive_;
  const unsigned char* data_;
  std::size_t size_;
  std::size_t at_ = 0;
  std::vector<Value> stack_;
  std::vector<std::size_t> marks_;
  std::vector<Value> memo_;
};

void TorchSaveUnpickler::step(unsigned char op) {
  switch (op) {
    case 0x80: byte(); break;                  // PROTO
    case 0x95: unsigned_le(8); break;          // FRAME
    case '}': stack_.emplace_back(empty_dict()); break;
    case ']': stack_.emplace_back(empty_list()); break;
    case ')': push_tuple({}); break;
    case '(': marks_.push_back(stack_.size()); break;
    case 't': push_tuple(pop_mark()); break;
    case 0x85: case 0x86: case 0x87: {           // TUPLE1..3
      std::vector<Value> items(op - 0x84);
      for (auto item = items.rbegin(); item != items.rend(); ++item) *item = pop();
      push_tuple(std::move(items));
      break;
    }
    case 'u': set_items(pop_mark()); break;
    case 's': {
      Value value = pop(), key = pop();
      set_items({std::move(key), std::move(value)});
      break;
    }
    case 'e': append_items(pop_mark()); break;
    case 'a': append_items({pop()}); break;
    case 'q': memo_put(byte()); break;
    case 'r': memo_put(static_cast<std::size_t>(unsigned_le(4))); break;
    case 0x94: memo_put(memo_.size()); break;  // MEMOIZE
    case 'h': case 'j': {
      const std::size_t index = op == 'h' ? byte() : static_cast<std::size_t>(unsigned_le(4));
      if (index >= memo_.size()) throw PickleNotUnderstood("pickle memo index out of range");
      stack_.push_back(memo_[index]);
      break;
    }
    case 'X': stack_.emplace_back(c10::IValue(text(static_cast<std::size_t>(unsigned_le(4))))); break;
    case 0x8c: stack_.emplace_back(c10::IValue(text(byte()))); break;
    case 0x8d: stack_.emplace_back(c10::IValue(text(static_cast<std::size_t>(unsigned_le(8))))); break;
    case 'B': stack_.emplace_back(c10::IValue(text(static_cast<std::size_t>(unsigned_le(4))))); break;
    case 'C': stack_.emplace_back(c10::IValue(text(byte()))); break;
    case 'K': stack_.emplace_back(c10::IValue(static_cast<std::int64_t>(byte()))); break;
    case 'M': stack_.emplace_back(c10::IValue(static_cast<std::int64_t>(unsigned_le(2)))); break;
    case 'J': stack_.emplace_back(c10::IValue(static_cast<std::int64_t>(static_cast<std::int32_t>(unsigned_le(4))))); break;
    case 0x8a: {  // LONG1: little-endian two's complement of n bytes
      const int n = byte();
      if (n > 8) throw PickleNotUnderstood("an integer wider than 64 bits");
      std::uint64_t bits = n ? unsigned_le(n) : 0;
      if (n > 0 && n < 8 && (bits >> (8 * n - 1)) & 1) bits |= ~std::uint64_t{0} << (8 * n);  // sign-extend
      stack_.emplace_back(c10::IValue(static_cast<std::int64_t>(bits)));
      break;
    }
    case 'G': {  // BINFLOAT: big-endian double
      need(8);
      std::uint64_t bits = 0;
      for (int i = 0; i < 8; ++i) bits = (bits << 8) | data_[at_ + i];
      at_ += 8;
      double value;
      std::memcpy(&value, &bits, sizeof value);
      stack_.emplace_back(c10::IValue(value));
      break;
    }
    case 0x88: stack_.emplace_back(c10::IValue(true)); break;
    case 0x89: stack_.emplace_back(c10::IValue(false)); break;
    case 'N': stack_.emplace_back(c10::IValue()); break;
    case 'c': {
      std::string module = line();
      stack_.emplace_back(Global{std::move(module), line()});
      break;
    }
    case 0x93: {  // STACK_GLOBAL
      const c10::IValue name = ivalue(pop()), module = ivalue(pop());
      if (!name.isString() || !module.isString()) throw PickleNotUnderstood("STACK_GLOBAL of non-strings");
      stack_.emplace_back(Global{module.toStringRef(), name.toStringRef()});
      break;
    }
    case 'Q': stack_.emplace_back(persistent(pop())); break;  // BINPERSID
    case 'R': {
      Value arguments = pop(), callable = pop();
      stack_.push_back(reduce(callable, arguments));
      break;
    }
    default: throw PickleNotUnderstood(fmt::format("pickle opcode 0x{:02x}", op));
  }
}

void TorchSaveUnpickler::set_items(std::vector<Value> items) {
  c10::IValue* target = stack_.empty() ? nullptr : std::get_if<c10::IValue>(&stack_.back());
  if (!target || !target->isGenericDict() || items.size() % 2) throw PickleNotUnderstood("SETITEMS without a dict");
  auto dict = target->toGenericDict();
  for (std::size_t i = 0; i < items.size(); i += 2) dict.insert_or_assign(ivalue(items[i]), ivalue(items[i + 1]));
}

void TorchSaveUnpickler::append_items(std::vector<Value> items) {
  c10::IValue* target = stack_.empty() ? nullptr : std::get_if<c10::IValue>(&stack_.back());
  if (!target || !target->isList()) throw PickleNotUnderstood("APPENDS without a list");
  auto list = target->toList();
  for (const Value& item : items) list.push_back(ivalue(item));
}

// torch.save's persistent id of a storage: ('storage', <storage class>, key, location, numel).
TorchSaveUnpickler::StorageRef TorchSaveUnpickler::persistent(const Value& pid) {
  const auto* tuple = std::get_if<std::shared_ptr<Tuple>>(&pid);
  if (!tuple || (*tuple)->items.size() < 3) throw PickleNotUnderstood("a persistent id that is not a storage");
  const auto& items = (*tuple)->items;
  const auto* kind = std::get_if<c10::IValue>(&items[0]);
  const auto* type = std::get_if<Global>(&items[1]);
  const auto* key = std::get_if<c10::IValue>(&items[2]);
  if (!kind || !kind->isString() || kind->toStringRef() != "storage" || !type || !key || !key->isString()) {
    throw PickleNotUnderstood("a persistent id that is not a storage");
  }
  StorageRef ref{key->toStringRef(), std::nullopt};
  if (type->name != "UntypedStorage") {
    ref.dtype = storage_dtype(type->name);
    if (!ref.dtype) throw PickleNotUnderstood("storage class " + type->name);
  }
  return ref;
}

TorchSaveUnpickler::Value TorchSaveUnpickler::reduce(const Value& callable, const Value& arguments) {
  const auto* global = std::get_if<Global>(&callable);
  const auto* tuple = std::get_if<std::shared_ptr<Tuple>>(&arguments);
  if (!global || !tuple) throw PickleNotUnderstood("REDUCE of something other than a named function");
  const std::vector<Value>& args = (*tuple)->items;
  const std::string name = global->module + "." + global->name;
  if (name == "torch._utils._rebuild_tensor_v2") return rebuild_tensor(args, std::nullopt);
  if (name == "torch._utils._rebuild_tensor_v3") {
    if (args.size() < 7) throw PickleNotUnderstood("_rebuild_tensor_v3 without a dtype");
    const auto* dtype = std::get_if<Global>(&args[6]);
    const auto parsed = dtype ? parse_dtype(dtype->name) : std::nullopt;
    if (!parsed) throw PickleNotUnderstood("_rebuild_tensor_v3 with an unknown dtype");
    return rebuild_tensor(args, parsed);
  }
  if (name == "collections.OrderedDict" && args.empty()) return empty_dict();
  if (name == "torch.Size" && args.size() == 1) return args[0];
  throw PickleNotUnderstood("an object of " + name);
}

// _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, ...]):
// a meta tensor of that shape and dtype, its slice of the storage noted for host_tensor().
TorchSaveUnpickler::Value TorchSaveUnpickler::rebuild_tensor(const std::vector<Value>& args, std::optional<DType> dtype) {
  if (args.size() < 4) throw PickleNotUnderstood("_rebuild_tensor with too few arguments");
  const auto* storage = std::get_if<StorageRef>(&args[0]);
  const c10::IValue offset = ivalue(args[1]), sizes = ivalue(args[2]), strides = ivalue(args[3]);
  if (!storage || !offset.isInt() || !sizes.isTuple() || !strides.isTuple()) {
    throw PickleNotUnderstood("_rebuild_tensor with unexpected arguments");
  }
  TorchSaveArchive::Slice slice{storage->key, offset.toInt(), {}, {}};
  for (const auto& size : sizes.toTupleRef().elements()) slice.sizes.push_back(size.toInt());
  for (const auto& stride : strides.toTupleRef().elements()) slice.strides.push_back(stride.toInt());
  const DType element = dtype ? *dtype : storage->dtype.value_or(DType::uint8);
  if (!dtype && !storage->dtype) throw PickleNotUnderstood("an untyped storage without a dtype");
  at::Tensor meta = at::empty_strided(slice.sizes, slice.strides,
                                      at::TensorOptions().dtype(torch_scalar_type(element)).device(at::kMeta));
  archive_.slices_[meta.unsafeGetTensorImpl()] = std::move(slice);
  return c10::IValue(meta);
}

TorchSaveArchive::TorchSaveArchive(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw_input_error(path_, "cannot open for reading: {}", std::strerror(errno));
  read_directory();
  const auto pickle = records_.find("data.pkl");
  if (pickle == records_.end()) throw_input_error(path_, "a zip without data.pkl: not a torch.save file");
  const auto bytes = read_record(pickle->second, 0, pickle->second.size);
  root_ = TorchSaveUnpickler(*this, *bytes).run();
}

TorchSaveArchive::~TorchSaveArchive() {
  if (fd_ >= 0) ::close(fd_);
}

std::shared_ptr<std::vector<std::byte>> TorchSaveArchive::read_record(const Record& record, std::uint64_t skip,
                                                                      std::uint64_t bytes) const {
  if (skip + bytes > record.size) throw_input_error(path_, "a tensor reaches past its storage's record");
  std::shared_ptr<std::vector<std::byte>> out = allocate_bytes(static_cast<std::size_t>(bytes));
  std::uint64_t done = 0;
  while (done < bytes) {
    const ssize_t got = ::pread(fd_, out->data() + done, bytes - done, static_cast<off_t>(record.offset + skip + done));
    if (got <= 0) throw_input_error(path_, "truncated: a record ends past the end of the file");
    done += static_cast<std::uint64_t>(got);
  }
  return out;
}

// The zip's directory through caffe2's reader, the one torch.load uses: each record's offset in
// the file and its size (torch.save stores records uncompressed); the bytes are read here, straight
// into memory, when a tensor is asked for.
void TorchSaveArchive::read_directory() {
  try {
    caffe2::serialize::PyTorchStreamReader reader(path_);
    for (const std::string& name : reader.getAllRecords()) {
      records_[name] = Record{reader.getRecordOffset(name), reader.getRecordSize(name)};
    }
  } catch (const c10::Error& error) {
    throw_input_error(path_, "not a zip that torch.save wrote, or a damaged one: {}", error.what_without_backtrace());
  }
  struct stat info{};
  if (fstat(fd_, &info) != 0) throw_input_error(path_, "cannot stat: {}", std::strerror(errno));
  for (const auto& [name, record] : records_) {
    if (record.offset + record.size > static_cast<std::uint64_t>(info.st_size)) {
      throw_input_error(path_, "truncated: record '{}' ends past the end of the file", name);
    }
  }
}

HostTensor TorchSaveArchive::host_tensor(const at::Tensor& tensor, bool with_data) const {
  const auto found = slices_.find(tensor.unsafeGetTensorImpl());
  if (found == slices_.end()) throw_input_error(path_, "a tensor that is not this file's");
  const Slice& slice = found->second;
  HostTensor host;
  host.dtype = dtype_from_torch(tensor.scalar_type());
  host.shape = slice.sizes;
  host.captured_strides = slice.strides;
  if (!with_data) return host;
  const auto record = records_.find("data/" + slice.storage_key);
  if (record == records_.end()) throw_input_error(path_, "storage '{}' has no record", slice.storage_key);
  const std::size_t element = dtype_size(host.dtype);
  // The elements the view reaches, from its first to its last.
  std::int64_t span = 1;
  for (std::size_t d = 0; d < slice.sizes.size(); ++d) {
    if (slice.sizes[d] == 0) span = 0;
    else span += (slice.sizes[d] - 1) * slice.strides[d];
  }
  if (span == 0 || host.numel() == 0) {
    host.bytes = std::make_shared<const std::vector<std::byte>>();
    return host;
  }
  auto bytes = read_record(record->second, static_cast<std::uint64_t>(slice.storage_offset) * element,
                           static_cast<std::uint64_t>(span) * element);
  if (host.captured_contiguous() && static_cast<std::int64_t>(bytes->size()) == host.numel() * static_cast<std::int64_t>(element)) {
    host.bytes = std::move(bytes);
    return host;
  }
  // A strided view (a transposed or expanded tensor): its elements gathered in row-major order.
  std::shared_ptr<std::vector<std::byte>> holder = std::move(bytes);
  const at::Tensor view = at::from_blob(holder->data(), slice.sizes, slice.strides,
                                        [holder](void*) mutable { holder.reset(); },
                                        at::TensorOptions().dtype(tensor.scalar_type()));
  HostTensor gathered = host_tensor_from_torch(view);
  gathered.device = host.device;
  return gathered;
}

}  // namespace attnreplay
