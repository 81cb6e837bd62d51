// The kernels' thread pool (see thread_pool.h).

#include "thread_pool.h"

#include "openmp_team.h"

#include <pthread.h>

#include <cfenv>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>

namespace attnres {
namespace {

thread_local int g_last_call_threads = 0;

class Pool {
 public:
  // Runs the call on the caller and up to `helpers` workers; the threads it was dealt to, or 0
  // (nothing run) when the pool is busy.
  //
  // The caller starts on the tasks at once and never waits for a worker to wake: a worker joins
  // only while tasks may be left (open_), and the caller, once it has run out of tasks, closes the
  // call and waits for the workers that joined. Waking a sleeping thread can cost more than a small
  // call (tens of microseconds on a virtual machine whose other cores are idle); such a call then
  // runs on the caller alone instead of waiting for helpers that would find nothing left to do.
  int try_run(int64_t tasks, int helpers, TaskFunction task, void* context) {
    std::unique_lock<std::mutex> busy(call_mutex_, std::try_to_lock);
    if (!busy.owns_lock()) return 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (started_ < helpers) {  // workers are started on first need and then kept
        try {
          std::thread(&Pool::work, this, started_).detach();
        } catch (const std::system_error&) {  // no more threads to be had: run with those there are
          break;
        }
        ++started_;
      }
      helpers = std::min(helpers, started_);
      std::fegetenv(&caller_fenv_);
      task_ = task;
      context_ = context;
      tasks_ = tasks;
      next_.store(0, std::memory_order_relaxed);
      helpers_ = helpers;
      open_ = true;
      ++generation_;
    }
    wake_.notify_all();
    run_dealt_tasks(next_, tasks_, task_, context_);
    std::unique_lock<std::mutex> lock(mutex_);
    open_ = false;  // every task is taken: a worker waking from now on has nothing to join
    if (joined_.load(std::memory_order_acquire) != 0) {
      // The joined workers are running their last tasks: wait for them awake a while (they are about
      // as long as the caller's), then asleep.
      lock.unlock();
      const auto give_up = std::chrono::steady_clock::now() + kAwakeWait;
      while (joined_.load(std::memory_order_acquire) != 0 && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::yield();
      }
      lock.lock();
      done_.wait(lock, [this] { return joined_.load(std::memory_order_acquire) == 0; });
    }
    return helpers + 1;
  }

 private:
  // How long the caller waits awake for joined workers before it sleeps: about what waking it would cost.
  static constexpr std::chrono::microseconds kAwakeWait{100};

  void work(int index) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      // Sleep until a call that wants this worker: workers past `helpers_` stay asleep.
      wake_.wait(lock, [&] { return generation_ != seen && index < helpers_; });
      seen = generation_;
      if (!open_) continue;  // the caller ran every task before this worker woke
      joined_.fetch_add(1, std::memory_order_relaxed);
      // The caller's floating-point environment (rounding, flush-to-zero): a task's bits
      // must not depend on the thread that runs it.
      std::fesetenv(&caller_fenv_);
      lock.unlock();
      run_dealt_tasks(next_, tasks_, task_, context_);
      lock.lock();
      // Release: the caller that reads 0 (acquire) sees every output this worker wrote.
      if (joined_.fetch_sub(1, std::memory_order_release) == 1) done_.notify_one();
    }
  }

  std::mutex call_mutex_;  // one call at a time
  std::mutex mutex_;       // guards everything below but next_ (joined_ changes under it too)
  std::condition_variable wake_, done_;
  int started_ = 0;
  uint64_t generation_ = 0;
  int helpers_ = 0;
  bool open_ = false;              // workers may still join the current call
  std::atomic<int> joined_{0};     // workers running the current call
  std::fenv_t caller_fenv_{};
  TaskFunction task_ = nullptr;
  void* context_ = nullptr;
  int64_t tasks_ = 0;
  std::atomic<int64_t> next_{0};
};

Pool* g_pool = nullptr;
std::once_flag g_pool_once;

// In a forked child only the forking thread exists: the parent's workers are gone and the
// pool's state may be mid-call. The child starts a new, empty pool; the old one is left
// alone (destroying its mutexes or condition variables would be undefined).
void start_new_pool_in_child() { g_pool = new Pool(); }

Pool& pool() {
  std::call_once(g_pool_once, [] {
    g_pool = new Pool();
    pthread_atfork(nullptr, nullptr, start_new_pool_in_child);
  });
  return *g_pool;
}

}  // namespace

void run_tasks(int64_t tasks, int max_threads, TaskFunction task, void* context) {
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(tasks, max_threads)));
  if (threads > 1) {
    int team_threads = 0;
    if (run_on_torch_team(tasks, threads, task, context, &team_threads)) {
      g_last_call_threads = team_threads;
      return;
    }
    const int used = pool().try_run(tasks, threads - 1, task, context);
    if (used > 0) {
      g_last_call_threads = used;
      return;
    }
  }
  for (int64_t i = 0; i < tasks; ++i) task(context, i);
  g_last_call_threads = 1;
}

int last_call_threads() { return g_last_call_threads; }

}  // namespace attnres
