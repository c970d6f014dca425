// libattncap.so, the library users LD_PRELOAD. It depends on nothing heavy, so any process it
// lands in (shells, launchers, compiler children) runs as before. Once libtorch is in the process
// it loads the torch part (libattncap_torch.so), and only from a safe point: after the outermost
// dlopen has returned, or before main() of a program linked to libtorch. Loading from inside
// another library's constructor is unsafe: cuBLASLt's constructor calls dlopen while libtorch is
// mapped but not yet initialised.
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <string>
#include <vector>

namespace {

using DlopenFn = void* (*)(const char*, int);
using MainFn = int (*)(int, char**, char**);

thread_local int dlopen_depth = 0;
// 0: torch part not loaded, 1: loading or loaded, 2: given up. Not std::call_once: the torch
// part's own loading may call dlopen on this thread again.
std::atomic<int> torch_stage{0};
MainFn program_main = nullptr;

DlopenFn real_dlopen() {
  static DlopenFn real = reinterpret_cast<DlopenFn>(dlsym(RTLD_NEXT, "dlopen"));
  return real;
}

bool disabled() {
  const char* value = std::getenv("ATTNCAP_ENABLE");
  return value && std::strcmp(value, "0") == 0;
}

int find_libtorch(struct dl_phdr_info* info, size_t, void* found) {
  if (info->dlpi_name && std::strstr(info->dlpi_name, "libtorch_cpu.so")) {
    *static_cast<bool*>(found) = true;
    return 1;
  }
  return 0;
}

bool libtorch_loaded() {
  bool found = false;
  dl_iterate_phdr(find_libtorch, &found);
  return found;
}

// The torch part sits beside this library unless ATTNCAP_TORCH_LIB names it.
std::string torch_part_path() {
  if (const char* path = std::getenv("ATTNCAP_TORCH_LIB")) return path;
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&torch_part_path), &info) || !info.dli_fname) return "libattncap_torch.so";
  std::string self = info.dli_fname;
  const auto slash = self.rfind('/');
  return (slash == std::string::npos ? std::string() : self.substr(0, slash + 1)) + "libattncap_torch.so";
}

void load_torch_part() {
  if (torch_stage.load(std::memory_order_acquire) != 0 || !libtorch_loaded() || disabled()) return;
  int expected = 0;
  if (!torch_stage.compare_exchange_strong(expected, 1)) return;
  const std::string path = torch_part_path();
  void* handle = real_dlopen()(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    std::fprintf(stderr, "[attncap] capture is off: cannot load %s: %s\n", path.c_str(), dlerror());
    torch_stage.store(2);
    return;
  }
  using StartFn = void (*)();
  auto start = reinterpret_cast<StartFn>(dlsym(handle, "attncap_start"));
  if (!start) {
    std::fprintf(stderr, "[attncap] capture is off: %s has no attncap_start\n", path.c_str());
    torch_stage.store(2);
    return;
  }
  start();
}

// The folders glibc lists for `object` with RTLD_DI_SERINFO, in search order: its RPATH,
// LD_LIBRARY_PATH, its RUNPATH ($ORIGIN expanded), then the system folders.
std::vector<std::string> search_folders(void* object) {
  std::vector<std::string> folders;
  Dl_serinfo size{};
  if (dlinfo(object, RTLD_DI_SERINFOSIZE, &size) != 0 || size.dls_size == 0) return folders;
  auto* paths = static_cast<Dl_serinfo*>(std::malloc(size.dls_size));
  if (!paths) return folders;
  *paths = size;
  if (dlinfo(object, RTLD_DI_SERINFO, paths) == 0) {
    for (unsigned i = 0; i < paths->dls_cnt; ++i) folders.emplace_back(paths->dls_serpath[i].dls_name);
  }
  std::free(paths);
  return folders;
}

// The system folders: what this library (which has no RPATH or RUNPATH) is given beyond
// LD_LIBRARY_PATH. glibc leaves them, and its ld.so.cache, for last.
const std::vector<std::string>& system_folders() {
  static const std::vector<std::string> folders = [] {
    std::vector<std::string> result;
    Dl_info info{};
    struct link_map* self = nullptr;
    if (!dladdr1(reinterpret_cast<void*>(&torch_part_path), &info, reinterpret_cast<void**>(&self),
                 RTLD_DL_LINKMAP) || !self) {
      return result;
    }
    const char* env = std::getenv("LD_LIBRARY_PATH");
    const std::string library_path = env ? std::string(":") + env + ":" : "";
    for (const std::string& folder : search_folders(self)) {
      if (library_path.find(":" + folder + ":") == std::string::npos) result.push_back(folder);
    }
    return result;
  }();
  return folders;
}

// Opens `file` as glibc would for `caller`. A wrapper's own dlopen call makes glibc search with the
// wrapper's RPATH/RUNPATH instead of the real caller's, and bare-name loads (cuDNN's and torch's
// NVRTC sub-libraries) then fail. So a bare name is first looked for in the caller's own search
// folders, in glibc's order, up to the system folders, which glibc itself then searches.
void* open_as(const char* file, int mode, void* caller) {
  DlopenFn real = real_dlopen();
  if (!file || std::strchr(file, '/')) return real(file, mode);
  // Our probes must not leave an error behind for a caller that checks dlerror() after success.
  auto plain = [&] {
    dlerror();
    return real(file, mode);
  };
  // Already loaded under that name: a repeated dlopen returns it, whoever calls.
  if (void* loaded = real(file, mode | RTLD_NOLOAD)) return loaded;
  Dl_info info{};
  struct link_map* caller_map = nullptr;
  if (!dladdr1(caller, &info, reinterpret_cast<void**>(&caller_map), RTLD_DL_LINKMAP) || !caller_map) {
    return plain();
  }
  const std::vector<std::string>& system = system_folders();
  for (const std::string& folder : search_folders(caller_map)) {
    if (std::find(system.begin(), system.end(), folder) != system.end()) break;
    const std::string candidate = folder + "/" + file;
    if (access(candidate.c_str(), F_OK) != 0) continue;
    dlerror();
    if (void* handle = real(candidate.c_str(), mode)) return handle;
  }
  return plain();
}

int main_with_capture(int argc, char** argv, char** envp) {
  // A program linked to libtorch: every library is initialised by now.
  load_torch_part();
  return program_main(argc, argv, envp);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* dlopen(const char* file, int mode) {
  void* caller = __builtin_return_address(0);
  ++dlopen_depth;
  void* handle = open_as(file, mode, caller);
  --dlopen_depth;
  // Python loads libtorch as a dependency of torch/_C*.so, never by name: look after the
  // outermost load has returned, when every constructor it triggered has run.
  if (dlopen_depth == 0 && torch_stage.load(std::memory_order_relaxed) == 0) load_torch_part();
  return handle;
}

using StartMainFn = int (*)(MainFn, int, char**, void (*)(), void (*)(), void (*)(), void*);

__attribute__((visibility("default"))) int __libc_start_main(MainFn main, int argc, char** argv, void (*init)(),
                                                             void (*fini)(), void (*rtld_fini)(), void* stack_end) {
  auto real = reinterpret_cast<StartMainFn>(dlsym(RTLD_NEXT, "__libc_start_main"));
  program_main = main;
  return real(main_with_capture, argc, argv, init, fini, rtld_fini, stack_end);
}

}  // extern "C"
