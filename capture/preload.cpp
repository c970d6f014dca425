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
#include <string>

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

// Opens `file` as glibc would for `caller`. A wrapper's own dlopen call makes glibc search with the
// wrapper's RPATH/RUNPATH instead of the real caller's, and bare-name loads (cuDNN's and torch's
// NVRTC sub-libraries) then fail. So bare names are first looked up in the caller's own search
// path list (its RPATH/RUNPATH and LD_LIBRARY_PATH, $ORIGIN expanded), as glibc reports it.
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
  Dl_serinfo size{};
  if (dlinfo(caller_map, RTLD_DI_SERINFOSIZE, &size) != 0 || size.dls_size == 0) return plain();
  auto* paths = static_cast<Dl_serinfo*>(std::malloc(size.dls_size));
  if (!paths) return plain();
  *paths = size;
  void* handle = nullptr;
  if (dlinfo(caller_map, RTLD_DI_SERINFO, paths) == 0) {
    for (unsigned i = 0; i < paths->dls_cnt && !handle; ++i) {
      const Dl_serpath& entry = paths->dls_serpath[i];
      // System folders and ld.so.cache are left to glibc, in glibc's order.
      if (!(entry.dls_flags & (LA_SER_RUNPATH | LA_SER_LIBPATH))) continue;
      std::string candidate = std::string(entry.dls_name) + "/" + file;
      if (access(candidate.c_str(), F_OK) == 0) {
        dlerror();
        handle = real(candidate.c_str(), mode);
      }
    }
  }
  std::free(paths);
  return handle ? handle : plain();
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
