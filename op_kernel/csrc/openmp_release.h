// torch's OpenMP threads, released before long kernel calls.
//
// With OpenMP's default wait policy, the threads of torch's parallel operators keep spinning for
// several milliseconds after each one (libgomp: GOMP_SPINCOUNT iterations), on the cores the
// kernels' own threads need: a long kernel call right after a torch operator lost about a fifth of
// its speed on a 2-core host. The wait policy is read once, when torch's OpenMP runtime starts, so a
// library cannot change it. It can ask the runtime to let its idle threads go (OpenMP 5.0's
// omp_pause_resource_all): they exit, and torch's next parallel operator starts new ones.
//
// That costs the release (joining the threads) and torch the new threads, each growing with the
// thread count, while the contention it removes lasts a few milliseconds at most; so only calls
// that move at least openmp_release_min_bytes(threads) release (16 MiB on 2 threads, 256 MiB on 8).
// Never released:
//   * when OMP_WAIT_POLICY is PASSIVE (the threads sleep: nothing spins);
//   * in a process forked after this library was loaded: libgomp's team there is its parent's, whose
//     threads do not exist in the child, and releasing it would wait for them forever. A child
//     forked before the library was loaded cannot be told from its parent here; the Python side
//     marks the multiprocessing children started by fork (openmp_team_may_be_inherited). In any
//     other such child whose parent had used torch's OpenMP threads, the release would hang, as
//     torch's own parallel operators do there (docs/kernels.md, Threads).
//   * when torch's library holds no omp_pause_resource_all (built without OpenMP).

#pragma once

#include <cstdint>

namespace attnres {

// The bytes a call on `threads` threads must move to release: threads^2 * 4 MiB.
constexpr int64_t openmp_release_min_bytes(int threads) { return int64_t{threads} * threads * (int64_t{4} << 20); }

// Before a call that moves `bytes` (inputs read and outputs written) on at most `threads`
// threads: releases the calling thread's OpenMP team when the rules above say so.
void release_openmp_threads_before(int64_t bytes, int threads);

// Never release in this process: its OpenMP team may be a forked parent's.
void openmp_team_may_be_inherited();

// How many times this process asked torch's OpenMP runtime to release its threads (tests).
int64_t openmp_releases();

}  // namespace attnres
