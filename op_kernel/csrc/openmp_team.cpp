// Long kernel calls on torch's OpenMP team (see openmp_team.h).

#include "openmp_team.h"

#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cfenv>

namespace attnres {
namespace {

// libgomp's entry for `#pragma omp parallel num_threads(n)`: fn(data) on every thread of the team.
using GompParallel = void (*)(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);

std::atomic<bool> g_team_may_be_inherited{false};
std::atomic<int64_t> g_team_calls{0};
thread_local bool g_long_call = false;

// Registered when the library is loaded: a fork after that marks the child.
[[maybe_unused]] const int g_fork_watch = pthread_atfork(nullptr, nullptr, [] { g_team_may_be_inherited.store(true); });

// GOMP_parallel of the OpenMP runtime torch's CPU library was linked with (GNU libgomp in torch's
// Linux wheels), or null: torch built without OpenMP, or a runtime without GNU's entry points.
GompParallel torch_gomp_parallel() {
  static const GompParallel parallel = [] {
    void* torch = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
    if (torch == nullptr) return GompParallel{nullptr};
    auto found = reinterpret_cast<GompParallel>(dlsym(torch, "GOMP_parallel"));  // the library or its needs
    dlclose(torch);  // drops the reference RTLD_NOLOAD took; torch stays loaded
    return found;
  }();
  return parallel;
}

// One call's tasks, dealt in increasing order to whichever team thread is free.
struct TeamCall {
  TaskFunction task;
  void* context;
  int64_t tasks;
  std::fenv_t caller_fenv;
  std::atomic<int64_t> next{0};
  std::atomic<int> threads{0};
};

void run_team_share(void* data) {
  auto& call = *static_cast<TeamCall*>(data);
  call.threads.fetch_add(1, std::memory_order_relaxed);
  // The caller's floating-point environment (rounding, flush-to-zero) while this thread runs tasks:
  // a task's bits must not depend on the thread that runs it. torch's thread gets its own back.
  std::fenv_t own;
  std::fegetenv(&own);
  std::fesetenv(&call.caller_fenv);
  run_dealt_tasks(call.next, call.tasks, call.task, call.context);
  std::fesetenv(&own);
}

}  // namespace

TorchTeamScope::TorchTeamScope(int64_t bytes, int threads) : previous_(g_long_call) {
  g_long_call = threads >= 2 && bytes >= openmp_team_min_bytes(threads);
}

TorchTeamScope::~TorchTeamScope() { g_long_call = previous_; }

bool run_on_torch_team(int64_t tasks, int threads, TaskFunction task, void* context, int* used) {
  if (!g_long_call || g_team_may_be_inherited.load()) return false;
  const GompParallel parallel = torch_gomp_parallel();
  if (parallel == nullptr) return false;
  TeamCall call{task, context, tasks, {}};
  std::fegetenv(&call.caller_fenv);
  parallel(run_team_share, &call, static_cast<unsigned>(threads), 0);  // returns when every thread is done
  g_team_calls.fetch_add(1);
  *used = call.threads.load(std::memory_order_relaxed);
  return true;
}

void openmp_team_may_be_inherited() { g_team_may_be_inherited.store(true); }

int64_t torch_team_calls() { return g_team_calls.load(); }

}  // namespace attnres
