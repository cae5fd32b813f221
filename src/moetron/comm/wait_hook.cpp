#include "moetron/comm/wait_hook.h"

#include <atomic>

namespace moetron::comm {

namespace {

std::atomic<WaitHook> g_hook{nullptr};

}  // namespace

void set_wait_hook(WaitHook hook) noexcept {
  g_hook.store(hook, std::memory_order_release);
}

WaitHook wait_hook() noexcept {
  return g_hook.load(std::memory_order_acquire);
}

}  // namespace moetron::comm
