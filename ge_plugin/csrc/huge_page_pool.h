// Fresh outputs of eager calls that do not page-fault 4 KiB at a time. Included by cpp_entry.cpp.
//
// A freshly allocated large tensor is fresh anonymous memory: the OS maps it a 4 KiB page at a time
// as the kernel first writes it (about 73,700 faults for a 288 MB gradient), which costs more than
// the op. Large eager outputs therefore come from a HugePagePool: anonymous mappings advised
// MADV_HUGEPAGE (2 MiB pages) that the output's storage owns. The moment no tensor, view or storage
// uses a mapping any more, its deleter gives it back, and the next output of the same size gets it
// already mapped: no faults, no page compaction. Idle mappings beyond the pool's cap are unmapped,
// the least recently returned first, as soon as one comes back, but for the newest idle one larger than the
// whole cap. All of it runs without Python: from a cache flushed by the kernel, the Python pool this replaces
// took 200-300 us a large call.

#pragma once

#include <ATen/ops/from_blob.h>
#include <c10/util/Exception.h>

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace {

class HugePagePool : public std::enable_shared_from_this<HugePagePool> {
 public:
  static constexpr int64_t kHugePage = int64_t{2} << 20;

  explicit HugePagePool(int64_t max_idle_bytes) : max_idle_bytes_(max_idle_bytes) {}
  HugePagePool(const HugePagePool&) = delete;
  HugePagePool& operator=(const HugePagePool&) = delete;
  // Only once no tensor uses a mapping of it: each mapping's deleter holds the pool.
  ~HugePagePool() {
    for (const auto& [address, bytes] : idle_) munmap(address, static_cast<size_t>(bytes));
  }

  // An uninitialised contiguous CPU tensor [sizes] of `dtype` in a mapping of its own. The pool must be
  // owned by a shared_ptr.
  at::Tensor empty(const std::vector<int64_t>& sizes, at::ScalarType dtype) {
    int64_t numel = 1;
    for (int64_t size : sizes) numel *= size;
    const int64_t bytes = std::max<int64_t>(
        (numel * static_cast<int64_t>(c10::elementSize(dtype)) + kHugePage - 1) / kHugePage * kHugePage, kHugePage);
    void* address = take(bytes);
    auto* context = new Mapping{shared_from_this(), address, bytes};
    return at::from_blob(
        address, sizes, [context](void*) { context->pool->give_back(context); }, at::dtype(dtype));
  }

  int64_t idle_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return idle_bytes_locked();
  }

  int64_t in_use_bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    return in_use_bytes_;
  }

  int64_t mapped() {  // mappings created so far (tests watch reuse through it)
    std::lock_guard<std::mutex> lock(mutex_);
    return mapped_;
  }

 private:
  struct Mapping {
    std::shared_ptr<HugePagePool> pool;
    void* address;
    int64_t bytes;
  };

  // An idle mapping of exactly `bytes`, else a new one.
  void* take(int64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_use_bytes_ += bytes;
      for (auto idle = idle_.begin(); idle != idle_.end(); ++idle) {
        if (idle->second == bytes) {
          void* address = idle->first;
          idle_.erase(idle);
          return address;
        }
      }
      ++mapped_;
    }
    void* address = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (address == MAP_FAILED) {
      const int error = errno;
      std::lock_guard<std::mutex> lock(mutex_);
      in_use_bytes_ -= bytes;
      --mapped_;
      TORCH_CHECK(false, "attnres-ge: cannot map ", bytes, " bytes for an output: ", std::strerror(error));
    }
    madvise(address, static_cast<size_t>(bytes), MADV_HUGEPAGE);  // advice only: THP may say no
    return address;
  }

  // The deleter: the mapping becomes idle (the most recently returned), and the idle set is trimmed to the
  // cap, oldest first. The newest idle mapping larger than the whole cap is exempt, so that a loop whose
  // output is that large (prepare's numerator at T=4096, S=8, D=7168: 940 MB) reuses it call after call,
  // while the smaller outputs of the calls between (the updates' 117 MB) come and go under the cap, instead
  // of mapping and zeroing it afresh every call. So at most the cap plus one larger mapping stays idle.
  void give_back(Mapping* mapping) {
    std::vector<std::pair<void*, int64_t>> unmap;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      in_use_bytes_ -= mapping->bytes;
      idle_.emplace_back(mapping->address, mapping->bytes);
      auto exempt = idle_.end();
      for (auto idle = idle_.begin(); idle != idle_.end(); ++idle) {
        if (idle->second > max_idle_bytes_) exempt = idle;
      }
      int64_t counted = idle_bytes_locked() - (exempt == idle_.end() ? 0 : exempt->second);
      for (auto idle = idle_.begin(); counted > max_idle_bytes_ && idle != idle_.end();) {
        if (idle == exempt) {
          ++idle;
          continue;
        }
        counted -= idle->second;
        unmap.push_back(*idle);
        idle = idle_.erase(idle);
      }
    }
    for (const auto& [address, bytes] : unmap) munmap(address, static_cast<size_t>(bytes));
    delete mapping;  // last: it may hold the last reference to this pool
  }

  int64_t idle_bytes_locked() const {
    int64_t total = 0;
    for (const auto& idle : idle_) total += idle.second;
    return total;
  }

  const int64_t max_idle_bytes_;
  std::mutex mutex_;
  std::list<std::pair<void*, int64_t>> idle_;  // (address, bytes), least recently returned first
  int64_t in_use_bytes_ = 0;
  int64_t mapped_ = 0;
};

}  // namespace
