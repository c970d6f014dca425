#include "capture/call_site.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <fmt/format.h>

#include <cstring>
#include <functional>

#include "capture/python_api.h"

namespace attnreplay::capture {
namespace {

// The folder of the torch package the job imported ("…/site-packages/torch/"), from torch.__file__
// as sys.modules holds it (never importing anything); empty until torch is imported. Taken from
// the interpreter, not guessed from paths: a venv under /opt/torch/ has "/torch/" in every path.
const std::string& torch_package_dir(const Python& py) {
  static std::string dir;
  if (!dir.empty() || !py.sys_object || !py.dict_item) return dir;
  Python::Object modules = py.sys_object("modules");
  Python::Object torch = modules ? py.dict_item(modules, "torch") : nullptr;
  if (!torch) return dir;
  const std::string file = py.attribute_text(torch, "__file__");
  const auto slash = file.rfind('/');
  if (slash != std::string::npos) dir = file.substr(0, slash + 1);
  return dir;
}

// Frames of torch's own Python code (torch/nn/functional.py) are not the call site the user
// cares about, nor are the interpreter's frozen modules, nor capture's own wrappers of Python entry
// points (python_entry_points.py, compiled under the name <attncap>/...).
bool is_library_frame(const std::string& file, const std::string& torch_dir) {
  if (file.find("<frozen") != std::string::npos || file.rfind("<attncap>", 0) == 0) return true;
  // Without torch's folder (a Python without PySys_GetObject), the folder name is the best guess.
  return torch_dir.empty() ? file.find("/torch/") != std::string::npos : file.rfind(torch_dir, 0) == 0;
}

bool python_call_site(CallSite& site) {
  const Python& py = python();
  if (!py.usable || !py.is_initialized()) return false;
  const int gil = py.gil_ensure();
  Python::Object frame = py.current_frame();  // borrowed
  bool found_location = false, found_caller = false;
  Python::Object owned = nullptr;
  const std::string& torch_dir = torch_package_dir(py);
  for (int depth = 0; frame && depth < 32 && !(found_location && found_caller); ++depth) {
    Python::Object code = py.frame_code(frame);
    const std::string file = code ? py.attribute_text(code, "co_filename") : "";
    const std::string function = code ? py.attribute_text(code, "co_name") : "";
    if (code) py.decref(code);
    if (!is_library_frame(file, torch_dir)) {
      if (!found_location) {
        site.location = fmt::format("{}:{} in {}", file, py.frame_line(frame), function);
        found_location = true;
      }
      if (!found_caller && py.mapping_item) {
        // PyFrame_GetLocals is 3.11's; before it, the frame's f_locals attribute is the same mapping.
        Python::Object locals = py.frame_locals ? py.frame_locals(frame) : py.get_attr(frame, "f_locals");
        if (locals) {
          Python::Object self = py.mapping_item(locals, "self");
          if (self) {
            site.caller_id = reinterpret_cast<std::uintptr_t>(self);
            Python::Object type = py.get_attr(self, "__class__");
            if (type) {
              site.caller_class = py.attribute_text(type, "__qualname__");
              py.decref(type);
            } else {
              py.clear_error();
            }
            py.decref(self);
            found_caller = true;
          } else {
            py.clear_error();
          }
          py.decref(locals);
        } else {
          py.clear_error();
        }
      }
    }
    Python::Object back = py.frame_back(frame);  // new reference
    if (owned) py.decref(owned);
    owned = back;
    frame = back;
  }
  if (owned) py.decref(owned);
  py.gil_release(gil);
  return found_location;
}

bool is_library_object(const char* path) {
  if (!path) return true;
  for (const char* skip : {"libtorch", "libc10", "libattncap", "libc.so", "libstdc++", "libgomp"}) {
    if (std::strstr(path, skip)) return true;
  }
  return false;
}

void cpp_call_site(CallSite& site) {
  void* frames[48];
  const int count = backtrace(frames, 48);
  for (int i = 1; i < count; ++i) {
    Dl_info info{};
    if (!dladdr(frames[i], &info) || is_library_object(info.dli_fname)) continue;
    const char* base = std::strrchr(info.dli_fname, '/');
    const auto offset = reinterpret_cast<std::uintptr_t>(frames[i]) - reinterpret_cast<std::uintptr_t>(info.dli_fbase);
    site.location = fmt::format("{}+{:#x}{}", base ? base + 1 : info.dli_fname, offset,
                                info.dli_sname ? fmt::format(" ({})", info.dli_sname) : "");
    site.caller_id = std::hash<std::string>{}(site.location);
    return;
  }
}

}  // namespace

CallSite current_call_site() {
  CallSite site;
  if (!python_call_site(site)) cpp_call_site(site);
  if (site.caller_id == 0) site.caller_id = std::hash<std::string>{}(site.location);
  return site;
}

PositionTracker::Position PositionTracker::next(std::uintptr_t caller_id) {
  const std::int64_t index = calls_++;
  if (calls_per_step_ > 0) return {index / calls_per_step_, index % calls_per_step_};
  if (layer_of_.empty()) first_caller_ = caller_id;
  else if (caller_id == first_caller_) ++step_;
  auto [entry, inserted] = layer_of_.emplace(caller_id, static_cast<std::int64_t>(layer_of_.size()));
  return {step_, entry->second};
}

}  // namespace attnreplay::capture
