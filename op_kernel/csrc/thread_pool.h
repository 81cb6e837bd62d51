// The kernels' threads: a small pool of their own, or for long calls torch's OpenMP team.
//
// Why not an OpenMP team of the kernels' own: a parallel region's threads spin after the
// region (libgomp's default wait policy, fixed when libgomp starts, so a library cannot
// change it), competing for the cores with whatever the caller runs next; libgomp's pool
// is not reset in a forked child, whose next parallel region waits for threads that do
// not exist; and a num_threads clause taken from the tiling ignores
// torch.set_num_threads. This pool's workers sleep on a condition variable between
// calls, a fork child starts with an empty pool (pthread_atfork), and every call says how
// many threads it may use. A long call runs on torch's own team instead, whose threads
// spin after torch's operators anyway (openmp_team.h says why and when).

#pragma once

#include <atomic>
#include <cstdint>

namespace attnres {

using TaskFunction = void (*)(void* context, int64_t task);

// What every thread of a call runs, on the pool or on torch's team (openmp_team.h): task(context, i)
// for each i below `tasks` that `next`, the call's counter shared by its threads, deals it.
inline void run_dealt_tasks(std::atomic<int64_t>& next, int64_t tasks, TaskFunction task, void* context) {
  for (int64_t i = next.fetch_add(1); i < tasks; i = next.fetch_add(1)) task(context, i);
}

// Runs task(context, i) for every i in [0, tasks) on at most max_threads threads, the
// caller among them, and returns when all are done: on torch's OpenMP team inside a long
// call's TorchTeamScope (openmp_team.h), else on the pool. Tasks are dealt in increasing order
// to whichever thread is free, so a task must not depend on which thread runs it; a worker
// that wakes after the caller has taken the last task does not join (a short call is not
// held up by waking threads it does not need). When another call is already using the pool
// (two callers at once), this one runs its tasks on the calling thread alone.
void run_tasks(int64_t tasks, int max_threads, TaskFunction task, void* context);

// How many threads the calling thread's latest run_tasks was dealt to (the caller
// included): min(tasks, max_threads); 1 when it ran alone, fewer when the system would
// not start more threads or torch's OpenMP runtime gave a smaller team.
int last_call_threads();

}  // namespace attnres
