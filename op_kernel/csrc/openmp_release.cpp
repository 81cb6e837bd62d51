// Releasing torch's idle OpenMP threads (see openmp_release.h).

#include "openmp_release.h"

#include <dlfcn.h>
#include <pthread.h>
#include <strings.h>

#include <atomic>
#include <cstdlib>

namespace attnres {
namespace {

using PauseAll = int (*)(int kind);
constexpr int kOmpPauseSoft = 1;  // omp_pause_soft: the runtime may let threads go and start them again

std::atomic<bool> g_team_may_be_inherited{false};
std::atomic<int64_t> g_releases{0};

// Registered when the library is loaded: a fork after that marks the child.
[[maybe_unused]] const int g_fork_watch = pthread_atfork(nullptr, nullptr, [] { g_team_may_be_inherited.store(true); });

// omp_pause_resource_all of the OpenMP runtime torch's CPU library was linked with (GNU libgomp in
// torch's wheels; another runtime where torch was built with one), or null.
PauseAll torch_pause_all() {
  static PauseAll pause = [] {
    void* torch = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
    if (torch == nullptr) return PauseAll{nullptr};
    auto found = reinterpret_cast<PauseAll>(dlsym(torch, "omp_pause_resource_all"));  // the library or its needs
    dlclose(torch);  // drops the reference RTLD_NOLOAD took; torch stays loaded
    return found;
  }();
  return pause;
}

bool threads_wait_passively() {
  static const bool passive = [] {
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    return policy != nullptr && strcasecmp(policy, "passive") == 0;
  }();
  return passive;
}

}  // namespace

void release_openmp_threads_before(int64_t bytes, int threads) {
  if (threads < 2 || bytes < openmp_release_min_bytes(threads)) return;
  if (g_team_may_be_inherited.load() || threads_wait_passively()) return;
  const PauseAll pause = torch_pause_all();
  if (pause == nullptr) return;
  if (pause(kOmpPauseSoft) == 0) g_releases.fetch_add(1);
}

void openmp_team_may_be_inherited() { g_team_may_be_inherited.store(true); }

int64_t openmp_releases() { return g_releases.load(); }

}  // namespace attnres
