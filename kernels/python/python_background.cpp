// The thread that does Python work beside the replay (python_host.h: BackgroundPython).
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/GradMode.h>
#include <fmt/format.h>

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <iostream>
#include <thread>

#include "kernels/python/python_host.h"

namespace attnreplay {
namespace python_host __attribute__((visibility("hidden"))) {

namespace {

// Below the replay's threads: nice 10 lets the timing thread take a core whenever it wants one.
constexpr int kNiceness = 10;

}  // namespace

BackgroundPython& BackgroundPython::instance() {
  // Never destroyed: its thread may be inside Python when the process ends.
  static auto* background = new BackgroundPython;
  return *background;
}

void BackgroundPython::post(std::function<void()> task) {
  std::unique_lock lock(mutex_);
  tasks_.push_back(std::move(task));
  if (!started_) {
    started_ = true;
    // The GPU the replay works on is made current on the thread too: torch's per-thread default is
    // device 0, which under a launcher is another rank's.
    if (at::detail::getCUDAHooks().hasCUDA()) gpu_ = at::detail::getCUDAHooks().current_device();
    std::thread([this] { loop(); }).detach();
  }
  changed_.notify_all();
}

bool BackgroundPython::idle() const {
  const std::lock_guard lock(mutex_);
  return tasks_.empty() && !running_;
}

void BackgroundPython::wait_idle() const {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return tasks_.empty() && !running_; });
}

void BackgroundPython::loop() {
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kNiceness);
  // Without autograd, as the replay runs Python kernels (python_kernels.cpp): torch.compile guards
  // on it, and a compilation ahead under the other mode would be compiled again in the call.
  const c10::AutoGradMode no_grad(false);
  if (gpu_ >= 0) {
    py::gil_scoped_acquire gil;
    try {
      ensure_torch();
      py::module_::import("torch").attr("cuda").attr("set_device")(gpu_);
    } catch (py::error_already_set& error) {
      std::cerr << fmt::format("attnreplay: warning: Python beside the replay: {}\n", error.what());
    }
  }
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [this] { return !tasks_.empty(); });
      task = std::move(tasks_.front());
      tasks_.pop_front();
      running_ = true;
    }
    {
      py::gil_scoped_acquire gil;
      try {
        task();
      } catch (const std::exception& error) {
        std::cerr << fmt::format("attnreplay: warning: Python work beside the replay failed: {}\n", error.what());
      }
    }
    {
      const std::lock_guard lock(mutex_);
      running_ = false;
    }
    changed_.notify_all();
  }
}

}  // namespace python_host
}  // namespace attnreplay
