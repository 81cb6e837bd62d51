// torch's OpenMP team, on which long kernel calls run their tasks.
//
// With OpenMP's default wait policy, the threads of torch's parallel operators keep spinning for
// several milliseconds after each one (libgomp: GOMP_SPINCOUNT iterations), on the cores the
// kernels' threads need: a long kernel call right after a torch operator ran at about 60% of its
// speed on a 2-core host when the kernels' own pool (thread_pool.h) competed with them. The wait
// policy is read once, when torch's OpenMP runtime starts, so a library cannot change it. A long
// call therefore runs its tasks on that very team: through GOMP_parallel, what GCC compiles
// `#pragma omp parallel` to, of the OpenMP runtime torch's library was linked with. The spinning
// threads take the tasks at once, nothing competes, and the team is still there for torch's next
// operator. (Asking the runtime to let its idle threads go, omp_pause_resource_all, also ended the
// competition, but cost the call 0.1-0.5 ms and torch's next operator 0.12-0.14 ms to start its
// threads again, several ms each after an idle pause: docs/kernels.md, Threads.)
//
// Short calls (under openmp_team_min_bytes) stay on the kernels' own pool: a team thread asleep
// would hold a short call at the parallel region's closing barrier until it woke, whereas the pool
// never waits for a thread that wakes after the work is taken.
//
// Never on torch's team, always on the pool:
//   * in a process forked after this library was loaded: libgomp's team there is its parent's, whose
//     threads do not exist in the child, and a parallel region would wait for them forever. A child
//     forked before the library was loaded cannot be told from its parent here; the Python side
//     marks the multiprocessing children started by fork (openmp_team_may_be_inherited). In any
//     other such child whose parent had used torch's OpenMP threads, a long call would hang, as
//     torch's own parallel operators do there (docs/kernels.md, Threads).
//   * when torch's library holds no GOMP_parallel (built without OpenMP, or with a runtime that
//     lacks GNU's entry points).
#pragma once

#include <cstdint>

#include "thread_pool.h"

namespace attnres {

// The bytes a call on `threads` threads must move to run on torch's team: threads^2 * 4 MiB.
constexpr int64_t openmp_team_min_bytes(int threads) { return int64_t{threads} * threads * (int64_t{4} << 20); }

// While one lives, the calling thread's run_tasks calls (thread_pool.h) run on torch's team where
// they can, when it is made for a long call: `bytes` moved (inputs read, outputs written) on at most
// `threads` threads. Scopes nest; each restores what it found.
class TorchTeamScope {
 public:
  TorchTeamScope(int64_t bytes, int threads);
  ~TorchTeamScope();
  TorchTeamScope(const TorchTeamScope&) = delete;
  TorchTeamScope& operator=(const TorchTeamScope&) = delete;

 private:
  bool previous_;
};

// Runs task(context, i) for every i in [0, tasks) on torch's team of at most `threads` (>= 2) threads,
// the caller among them, when the calling thread is inside a long call's TorchTeamScope and the rules
// above allow it; sets *used to the team's size then. False (nothing run) otherwise.
bool run_on_torch_team(int64_t tasks, int threads, TaskFunction task, void* context, int* used);

// Never use torch's team in this process: it may be a forked parent's.
void openmp_team_may_be_inherited();

// How many run_tasks calls of this process ran on torch's team (tests).
int64_t torch_team_calls();

}  // namespace attnres
