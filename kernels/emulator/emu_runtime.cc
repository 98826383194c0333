// The host emulator's machine model and runtime: device memory registry, on-chip
// arenas, task threads, barriers, rule checks and queues. See bang_emu.h and
// kernels/README.md for what is modelled and what is not.
#include "emu_runtime.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <pthread.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#define BANG_EMU_RUNTIME
#include "bang_emu.h"

// scripts/sanitize.sh builds with -DMLU_EMU_SANITIZE. Under -fsanitize=address the header's
// macros poison memory (Core::poison_onchip); under any other build they do nothing.
#ifdef MLU_EMU_SANITIZE
#include <sanitizer/asan_interface.h>
#else
#define ASAN_POISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#define ASAN_UNPOISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#endif
// Under ThreadSanitizer the script ignores the accesses made inside intercepted library calls
// (memcpy, memcmp, free, ...: TSAN_OPTIONS ignore_interceptors_accesses=1), because the Rust
// code making most of them is not instrumented and synchronises with atomics TSan cannot see.
// The emulator's own copies of device memory (DMA, host transfers) are declared to TSan here
// instead (copy_bytes, fill_bytes), so a race on device memory between cores still shows.
#if defined(MLU_EMU_SANITIZE) && defined(__SANITIZE_THREAD__)
#define MLU_EMU_TSAN 1
#elif defined(MLU_EMU_SANITIZE) && defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define MLU_EMU_TSAN 1
#endif
#endif
#ifdef MLU_EMU_TSAN
extern "C" void __tsan_read_range(void *addr, unsigned long size);
extern "C" void __tsan_write_range(void *addr, unsigned long size);
#endif

namespace bang_emu {
namespace {

void copy_bytes(void *dst, const void *src, size_t bytes) {
#ifdef MLU_EMU_TSAN
  __tsan_read_range(const_cast<void *>(src), bytes);
  __tsan_write_range(dst, bytes);
#endif
  std::memmove(dst, src, bytes);
}

void fill_bytes(void *dst, int value, size_t bytes) {
#ifdef MLU_EMU_TSAN
  __tsan_write_range(dst, bytes);
#endif
  std::memset(dst, value, bytes);
}

// ---- the architecture ---------------------------------------------------------------
// MLU370 (mtp_372): 768 KB NRAM per core of which 128 KB hold the stack, 1 MB WRAM per
// core, 2 MB SRAM per cluster, 4 cores per cluster.
constexpr const char *kArch = "MLU370 (mtp_372)";
constexpr size_t kNram = 768 * 1024;
constexpr size_t kNramReserved = 128 * 1024;
constexpr size_t kWram = 1024 * 1024;
constexpr size_t kSram = 2048 * 1024;
constexpr int kCoresPerCluster = 4;
constexpr size_t kOnchipAlign = 64;

int clusters() {
  static const int n = [] {
    const char *s = std::getenv("MLU_EMU_CLUSTERS");
    int v = s ? std::atoi(s) : 2;
    return v >= 1 && v <= 16 ? v : 2;
  }();
  return n;
}
int total_cores() { return clusters() * kCoresPerCluster; }

// What a card may do differently from the host, one mode each (kernels/README.md, "Modes";
// scripts/test.sh runs the kernel tests in each), read once from the environment:
//   MLU_EMU_FTZ=1          float denormals flushed to zero, as inputs and as results;
//   MLU_EMU_ASYNC=early    __memcpy_async lands when issued (default: at the next sync);
//   MLU_EMU_ORDER=serial   a launch's clusters (UNION) or tasks (BLOCK) one at a time, last first.
struct Modes {
  bool ftz = false, async_early = false, serial = false;
};
const Modes &modes() {
  static const Modes m = [] {
    auto is = [](const char *name, const char *value) {
      const char *s = std::getenv(name);
      return s && std::string(s) == value;
    };
    return Modes{is("MLU_EMU_FTZ", "1"), is("MLU_EMU_ASYNC", "early"), is("MLU_EMU_ORDER", "serial")};
  }();
  return m;
}

#if defined(__x86_64__) || defined(__i386__)
constexpr bool kFtzHost = true;
#else
constexpr bool kFtzHost = false;
#endif

// Sets the calling (task) thread's float mode for MLU_EMU_FTZ: MXCSR's flush-to-zero (bit 15)
// and denormals-are-zero (bit 6). The emulator's own arithmetic runs on these threads too.
// (On another host `execute` fails the launch instead.)
void enter_float_mode() {
#if defined(__x86_64__) || defined(__i386__)
  if (modes().ftz) _mm_setcsr(_mm_getcsr() | 0x8040);
#endif
}

thread_local std::string t_last_error;

int fail(int code, std::string msg) {
  t_last_error = std::move(msg);
  return code;
}

struct Violation : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Thrown in the other tasks of a launch once one task failed.
struct Aborted {};

// ---- GDRAM ----------------------------------------------------------------------------
std::shared_mutex g_mem_mutex;
std::map<uintptr_t, size_t> g_allocations;

// The allocation holding [p, p + bytes), or false.
bool gdram_contains(const void *p, size_t bytes) {
  auto a = reinterpret_cast<uintptr_t>(p);
  std::shared_lock lock(g_mem_mutex);
  auto it = g_allocations.upper_bound(a);
  if (it == g_allocations.begin()) return false;
  --it;
  return a >= it->first && bytes <= it->second && a - it->first <= it->second - bytes;
}

// ---- barriers -------------------------------------------------------------------------
class Barrier {
 public:
  explicit Barrier(int n) : count_(n) {}
  // Blocks until all `count_` tasks arrive; throws Aborted when the launch failed.
  void wait(Loc at, const char *what) {
    std::unique_lock lock(m_);
    if (poisoned_) throw Aborted{};
    if (exited_ > 0) {
      lock.unlock();
      violation(at, "%s can never complete: %d of the %d tasks it waits for already returned", what, exited_, count_);
    }
    uint64_t gen = gen_;
    if (++waiting_ == count_) {
      waiting_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return gen_ != gen || poisoned_; });
    if (gen_ == gen) throw Aborted{};
  }
  // A task returned: if others wait at this barrier they would wait forever on a card.
  bool leave() {
    std::lock_guard lock(m_);
    ++exited_;
    return waiting_ > 0;
  }
  void poison() {
    std::lock_guard lock(m_);
    poisoned_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int count_, waiting_ = 0, exited_ = 0;
  uint64_t gen_ = 0;
  bool poisoned_ = false;
};

// ---- launches and cores ---------------------------------------------------------------
struct Region {
  uintptr_t base;
  size_t size;
  Space space;
  const char *name;
};

// 0xFF: NaN as float, -1 as int: reading on-chip memory nobody wrote shows.
constexpr int kPoison = 0xFF;

// On-chip memory, 64-byte aligned like the card's address spaces, allocated once per
// emulated card and poisoned (kPoison) in full once; afterwards each task or launch
// re-poisons only what it touched (Card, run_task), so it is all poison between uses.
class Arena {
 public:
  // n = 0: no memory (the memory core has no NRAM or WRAM).
  explicit Arena(size_t n) : n_(n), p_(n ? static_cast<uint8_t *>(std::aligned_alloc(64, (n + 63) / 64 * 64)) : nullptr) {
    if (n && !p_) throw std::bad_alloc();
    if (n) fill_bytes(p_, kPoison, n);
  }
  ~Arena() { std::free(p_); }
  Arena(const Arena &) = delete;
  Arena &operator=(const Arena &) = delete;
  uint8_t *data() { return p_; }
  size_t size() const { return n_; }
  // Poisons [data(), end): `end` is the high-water mark of what a task or launch touched.
  void repoison(uintptr_t end) {
    const auto base = reinterpret_cast<uintptr_t>(p_);
    if (end > base) fill_bytes(p_, kPoison, std::min<size_t>(end - base, n_));
  }

 private:
  size_t n_;
  uint8_t *p_;
};

// A cluster in one UNION launch: its compute cores and its memory core share the card's
// SRAM of that cluster and __sync_cluster.
struct Cluster {
  explicit Cluster(Arena &s) : barrier(kCoresPerCluster + 1), sram(s) {}
  Barrier barrier;
  Arena &sram;
};

// The clusters one UnionN task occupies: the reach of __sync_all (every core, memory
// cores included) and of __sync_all_ipu (the compute cores). A UNION1 launch over several
// clusters is several such tasks, and nothing synchronises across them.
struct Group {
  explicit Group(int clusters) : all(clusters * (kCoresPerCluster + 1)), ipu(clusters * kCoresPerCluster) {}
  Barrier all, ipu;
};

struct Launch {
  std::string kernel;
  cnrtDim3_t dim;
  int type;
  int task_dim;
  std::vector<std::unique_ptr<Group>> groups;
  std::vector<std::unique_ptr<Cluster>> clusters;
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::string error;

  void record(const std::string &msg) {
    {
      std::lock_guard lock(error_mutex);
      if (error.empty()) error = msg;
    }
    failed = true;
    for (auto &g : groups) {
      g->all.poison();
      g->ipu.poison();
    }
    for (auto &c : clusters) c->barrier.poison();
  }
};

struct Pending {
  void *dst;
  const void *src;
  size_t bytes;
  long dst_stride, src_stride, segments;
};

struct Core {
  explicit Core(bool memory_core = false)
      : mpu(memory_core), nram(memory_core ? 0 : kNram - kNramReserved), wram(memory_core ? 0 : kWram) {}
  Launch *launch = nullptr;
  Cluster *cluster = nullptr;
  Group *group = nullptr;
  bool mpu;
  Builtins b{};
  Arena nram;
  Arena wram;
  size_t used[4] = {0, 0, 0, 0};  // indexed by Space
  // The end of the on-chip bytes this task may have written, per Space: every buffer it
  // allocated, tile it carved and operand or copy range it named (touch). Scalar stores
  // land inside those tiles; one outside every tile (into the uncarved file-scope buffer or
  // an alignment pad) is what the ASan build reports (poison_onchip).
  uintptr_t touched[4] = {0, 0, 0, 0};
  std::vector<Region> regions;
  std::vector<Pending> pending;

  void touch(Space s, uintptr_t end) {
    uintptr_t &t = touched[static_cast<int>(s)];
    t = std::max(t, end);
  }
  void reset_task() {
    std::fill(std::begin(used), std::end(used), 0);
    regions.clear();
    pending.clear();
    poison_onchip(true);
  }
  // Leaves NRAM and WRAM as the next task must find them: poison wherever this one wrote.
  // (SRAM is the cluster's: the launch re-poisons it once all its cores are done.)
  void end_task() {
    poison_onchip(false);
    nram.repoison(std::exchange(touched[static_cast<int>(Space::NRAM)], 0));
    wram.repoison(std::exchange(touched[static_cast<int>(Space::WRAM)], 0));
  }
  // Under ASan (MLU_EMU_SANITIZE) a task's NRAM and WRAM are poisoned from its start to its
  // end except the buffers it allocates (onchip_alloc) or carves (carve), so a scalar access
  // outside every tile, e.g. past a tile's end into its 64-byte alignment pad, is reported.
  // The file-scope NRAM buffer (nram_static) stays poisoned: kernels carve their tiles from it.
  void poison_onchip(bool poison) {
    for (Arena *a : {&nram, &wram}) {
      if (!a->size()) continue;
      if (poison)
        ASAN_POISON_MEMORY_REGION(a->data(), a->size());
      else
        ASAN_UNPOISON_MEMORY_REGION(a->data(), a->size());
    }
  }
};

thread_local Core *t_core = nullptr;

const Builtins kNoTask{};

void run_pending(Core &c) {
  for (const Pending &p : c.pending)
    for (long s = 0; s <= p.segments; ++s)
      copy_bytes(static_cast<char *>(p.dst) + s * p.dst_stride, static_cast<const char *>(p.src) + s * p.src_stride,
                 p.bytes);
  c.pending.clear();
}

// Runs one task of a launch on the calling thread; failures go to the launch.
void run_task(Launch &l, Core &core, int task, void (*body)(void *), void *args) {
  core.launch = &l;
  core.reset_task();
  int x = static_cast<int>(l.dim.x), y = static_cast<int>(l.dim.y);
  core.b.taskId = task;
  core.b.taskDim = l.task_dim;
  core.b.taskIdX = task % x;
  core.b.taskIdY = (task / x) % y;
  core.b.taskIdZ = task / (x * y);
  core.b.taskDimX = x;
  core.b.taskDimY = y;
  core.b.taskDimZ = static_cast<int>(l.dim.z);
  if (l.type == cnrtFuncTypeBlock) {
    core.b.coreId = 0;
    core.b.coreDim = 1;
    core.b.clusterId = 0;
    core.b.clusterDim = 1;
    core.cluster = nullptr;
    core.group = nullptr;
  } else {
    // A memory core runs with the task builtins of its cluster's first compute core (task
    // is that core's), so a kernel without the __is_mpu() guard does real work on it and
    // breaks a rule; its coreId is 0x80 (mlu-ops@v1.4.0 kernels/focal_loss_sigmoid/
    // focal_loss_sigmoid_backward_union1.mlu:495 tests `coreId == 0x80`).
    core.b.coreId = core.mpu ? 0x80 : task % kCoresPerCluster;
    core.b.coreDim = kCoresPerCluster;
    core.b.clusterId = task / kCoresPerCluster;
    core.b.clusterDim = l.task_dim / kCoresPerCluster;
    core.cluster = l.clusters[core.b.clusterId].get();
    core.group = l.groups[core.b.clusterId / (l.type / kCoresPerCluster)].get();
  }
  t_core = &core;
  try {
    body(args);
    run_pending(core);
  } catch (const Violation &v) {
    l.record(v.what());
  } catch (const Aborted &) {
  } catch (const std::exception &e) {
    l.record(std::string("kernel '") + l.kernel + "' task " + std::to_string(task) + ": " + e.what());
  } catch (...) {
    l.record(std::string("kernel '") + l.kernel + "' task " + std::to_string(task) + ": unknown exception");
  }
  if (l.type != cnrtFuncTypeBlock && !l.failed) {
    bool stuck = core.cluster->barrier.leave();
    stuck = core.group->all.leave() || stuck;
    if (!core.mpu) stuck = core.group->ipu.leave() || stuck;
    if (stuck)
      l.record(std::string("kernel '") + l.kernel + "' " + (core.mpu ? "memory core of the cluster of task " : "task ") +
               std::to_string(task) + " returned while other tasks wait at a barrier it never reaches (a card would hang)");
  }
  core.end_task();
  t_core = nullptr;
}

// Persistent worker threads of the emulated card. run(n, job) runs job(0) .. job(n - 1)
// at once, one index per thread, and returns when all have returned: with n at most the
// thread count every index has its own thread, so tasks that meet at barriers all run.
class Pool {
 public:
  explicit Pool(int threads) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
  }
  // No destructor joins the threads: the card is never destroyed (emulated_card).
  int size() const { return static_cast<int>(threads_.size()); }

  void run(int n, const std::function<void(int)> &job) {
    std::unique_lock lock(m_);
    job_ = &job;
    n_ = n;
    next_ = 0;
    done_ = 0;
    ++generation_;
    start_.notify_all();
    done_cv_.wait(lock, [&] { return done_ == n_; });
    job_ = nullptr;
  }

 private:
  void work() {
    // Every emulated core's arithmetic runs on these threads: their float mode is the card's.
    enter_float_mode();
    std::unique_lock lock(m_);
    for (uint64_t seen = 0;;) {
      start_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      while (next_ < n_) {
        const int i = next_++;
        lock.unlock();
        (*job_)(i);
        lock.lock();
        if (++done_ == n_) done_cv_.notify_all();
      }
    }
  }

  std::mutex m_;
  std::condition_variable start_, done_cv_;
  const std::function<void(int)> *job_ = nullptr;
  int n_ = 0, next_ = 0, done_ = 0;
  uint64_t generation_ = 0;
  std::vector<std::thread> threads_;
};

// The emulated card: its cores (compute cores, then one memory core per cluster), each
// cluster's SRAM and a thread per core, made once and reused by every launch. Launches
// take the card one at a time (g_card_mutex), as a card's queues share its cores.
struct Card {
  Card() : pool(total_cores() + clusters()) {
    for (int t = 0; t < total_cores(); ++t) cores.push_back(std::make_unique<Core>());
    for (int c = 0; c < clusters(); ++c) cores.push_back(std::make_unique<Core>(true));
    for (int c = 0; c < clusters(); ++c) sram.push_back(std::make_unique<Arena>(kSram));
  }
  Core &memory_core(int cluster) { return *cores[total_cores() + cluster]; }
  // After a UNION launch: poison the SRAM its clusters' cores touched.
  void end_union(int clusters) {
    for (int c = 0; c < clusters; ++c) {
      uintptr_t end = std::exchange(memory_core(c).touched[static_cast<int>(Space::SRAM)], 0);
      for (int k = 0; k < kCoresPerCluster; ++k)
        end = std::max(end, std::exchange(cores[c * kCoresPerCluster + k]->touched[static_cast<int>(Space::SRAM)], 0));
      sram[c]->repoison(end);
    }
  }
  std::vector<std::unique_ptr<Core>> cores;
  std::vector<std::unique_ptr<Arena>> sram;
  Pool pool;
};

std::mutex g_card_mutex;
Card *g_card = nullptr;

// The card, made at the first launch; the caller holds g_card_mutex. A forked child has
// none of the parent's threads: it makes its own card (the parent's is left unreleased).
Card &emulated_card() {
  static const int fork_handlers = pthread_atfork([] { g_card_mutex.lock(); }, [] { g_card_mutex.unlock(); },
                                                  [] {
                                                    g_card = nullptr;
                                                    g_card_mutex.unlock();
                                                  });
  (void)fork_handlers;
  if (!g_card) g_card = new Card();
  return *g_card;
}

void execute(Launch &l, void (*body)(void *), void *args) {
  if (modes().ftz && !kFtzHost) {
    l.record("MLU_EMU_FTZ=1 needs an x86 host (the mode sets MXCSR)");
    return;
  }
  std::lock_guard lock(g_card_mutex);
  Card &card = emulated_card();
  if (l.type == cnrtFuncTypeBlock) {
    // BLOCK tasks are independent: the card's cores take them one after another.
    if (modes().serial) {
      card.pool.run(1, [&](int) {
        for (int t = l.task_dim - 1; t >= 0 && !l.failed; --t) run_task(l, *card.cores[0], t, body, args);
      });
      return;
    }
    std::atomic<int> next{0};
    card.pool.run(std::min(l.task_dim, total_cores()), [&](int w) {
      for (int t; !l.failed && (t = next++) < l.task_dim;) run_task(l, *card.cores[w], t, body, args);
    });
  } else {
    // UNION tasks are resident together: a thread per compute core and per cluster's
    // memory core, which runs the kernel too; barriers are real. The groups (UnionN: N
    // clusters) share nothing, so MLU_EMU_ORDER=serial runs one at a time.
    const int clusters = l.task_dim / kCoresPerCluster, per_group = l.type / kCoresPerCluster;
    for (int c = 0; c < clusters; ++c) l.clusters.push_back(std::make_unique<Cluster>(*card.sram[c]));
    for (int g = 0; g < clusters / per_group; ++g) l.groups.push_back(std::make_unique<Group>(per_group));
    // The cores of clusters [first, first + count): index i < 4 * count is compute core
    // (and task) 4 * first + i, the rest the clusters' memory cores.
    auto run_clusters = [&](int first, int count) {
      card.pool.run(count * (kCoresPerCluster + 1), [&](int i) {
        if (i < count * kCoresPerCluster) {
          const int t = first * kCoresPerCluster + i;
          run_task(l, *card.cores[t], t, body, args);
        } else {
          const int c = first + i - count * kCoresPerCluster;
          run_task(l, card.memory_core(c), c * kCoresPerCluster, body, args);
        }
      });
    };
    if (modes().serial) {
      for (int g = clusters / per_group - 1; g >= 0; --g) run_clusters(g * per_group, per_group);
    } else {
      run_clusters(0, clusters);
    }
    card.end_union(clusters);
  }
}

Core &core_at(Loc at) {
  if (!t_core) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%s:%d: a device intrinsic was called outside a kernel launch", at.file, at.line);
    throw Violation(buf);
  }
  return *t_core;
}

}  // namespace

// ---- device-side API ------------------------------------------------------------------
const char *space_name(Space s) {
  switch (s) {
    case Space::GDRAM: return "GDRAM";
    case Space::NRAM: return "NRAM";
    case Space::SRAM: return "SRAM";
    case Space::WRAM: return "WRAM";
    default: return "no device memory";
  }
}

const Builtins &builtins() { return t_core ? t_core->b : kNoTask; }

bool is_mpu() { return t_core && t_core->mpu; }

namespace {
// The memory core has no NRAM or WRAM, no vector unit, and (in this model) stores nothing
// to GDRAM: mlu-ops guards such work with __is_mpu().
void memory_core_breach(Loc at, const char *what) {
  violation(at, "%s on the memory core, which has no NRAM or vector unit: the kernel needs `if (__is_mpu()) return;` "
                "or a guard around this work",
            what);
}

std::map<std::string, size_t> &static_nram() {
  static std::map<std::string, size_t> totals;
  return totals;
}
}  // namespace

NramBuffer::NramBuffer(Loc decl, size_t bytes, const char *name) : decl_(decl), bytes_(bytes), name_(name) {
  size_t &total = static_nram()[decl.file];
  offset_ = (total + kOnchipAlign - 1) / kOnchipAlign * kOnchipAlign;
  total = offset_ + bytes;
}

void *nram_static(Loc decl, size_t offset, size_t bytes, const char *name) {
  Core &c = core_at(decl);
  if (c.mpu) memory_core_breach(decl, (std::string("use of NRAM buffer '") + name + "'").c_str());
  const size_t total = static_nram()[decl.file];
  if (total > c.nram.size())
    violation(decl, "the file-scope NRAM of this file totals %zu bytes, beyond the %zu bytes of %s NRAM less the stack",
              total, c.nram.size(), kArch);
  uint8_t *p = c.nram.data() + offset;
  const auto base = reinterpret_cast<uintptr_t>(p);
  for (const Region &r : c.regions)
    if (r.base == base && r.size == bytes && r.name == name) return p;
  c.regions.push_back(Region{base, bytes, Space::NRAM, name});
  size_t &used = c.used[static_cast<int>(Space::NRAM)];
  used = std::max(used, offset + bytes);
  return p;
}

void violation(Loc at, const char *fmt, ...) {
  char rule[768];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(rule, sizeof rule, fmt, ap);
  va_end(ap);
  char buf[1200];
  const char *file = std::strrchr(at.file, '/');
  file = file ? file + 1 : at.file;
  if (t_core && t_core->launch) {
    const Builtins &b = t_core->b;
    std::snprintf(buf, sizeof buf, "kernel '%s' task %d (cluster %d, core %d) at %s:%d: %s", t_core->launch->kernel.c_str(),
                  b.taskId, b.clusterId, b.coreId, file, at.line, rule);
  } else {
    std::snprintf(buf, sizeof buf, "%s:%d: %s", file, at.line, rule);
  }
  throw Violation(buf);
}

namespace {
// space_of with the subject of its messages in up to four parts, joined only when a violation
// is reported: formatting every copy's and tile's name up front was half of a small launch.
Space space_named(Loc at, const void *p, size_t bytes, const char *w0, const char *w1 = "", const char *w2 = "",
                  const char *w3 = "") {
  Core &c = core_at(at);
  auto a = reinterpret_cast<uintptr_t>(p);
  // Newest first: a carved sub-buffer is found before the buffer it was carved from.
  for (auto it = c.regions.rbegin(); it != c.regions.rend(); ++it) {
    const Region &r = *it;
    if (a >= r.base && a < r.base + r.size) {
      if (bytes > r.size - (a - r.base))
        violation(at, "%s%s%s%s: %zu bytes at offset %zu leave %s buffer '%s' of %zu bytes", w0, w1, w2, w3, bytes,
                  static_cast<size_t>(a - r.base), space_name(r.space), r.name, r.size);
      c.touch(r.space, a + bytes);
      return r.space;
    }
  }
  if (gdram_contains(p, bytes)) return Space::GDRAM;
  if (gdram_contains(p, 1))
    violation(at, "%s%s%s%s: %zu bytes at %p leave the allocated GDRAM buffer", w0, w1, w2, w3, bytes, p);
  violation(at, "%s%s%s%s: address %p is in no allocated device buffer or on-chip buffer", w0, w1, w2, w3, p);
}
}  // namespace

Space space_of(Loc at, const void *p, size_t bytes, const char *what) { return space_named(at, p, bytes, what); }

void *onchip_alloc(Loc at, Space s, size_t bytes, const char *name) {
  Core &c = core_at(at);
  size_t cap = 0;
  uint8_t *base = nullptr;
  if (c.mpu && s != Space::SRAM) memory_core_breach(at, "an NRAM or WRAM buffer");
  switch (s) {
    case Space::NRAM: cap = c.nram.size(); base = c.nram.data(); break;
    case Space::WRAM: cap = c.wram.size(); base = c.wram.data(); break;
    case Space::SRAM:
      if (!c.cluster) violation(at, "SRAM buffer '%s': BLOCK tasks have no cluster SRAM (launch as UNION1)", name);
      cap = c.cluster->sram.size();
      base = c.cluster->sram.data();
      break;
    default: violation(at, "on-chip buffer '%s' in an unknown space", name);
  }
  size_t &used = c.used[static_cast<int>(s)];
  size_t start = (used + kOnchipAlign - 1) / kOnchipAlign * kOnchipAlign;
  if (bytes == 0 || start > cap || bytes > cap - start)
    violation(at, "%s buffer '%s' of %zu bytes does not fit: %zu of %zu bytes of %s %s are already used", space_name(s),
              name, bytes, used, cap, kArch,
              s == Space::NRAM ? "NRAM (768 KB less 128 KB for the stack)" : space_name(s));
  used = start + bytes;
  void *p = base + start;
  c.regions.push_back(Region{reinterpret_cast<uintptr_t>(p), bytes, s, name});
  c.touch(s, reinterpret_cast<uintptr_t>(p) + bytes);
  ASAN_UNPOISON_MEMORY_REGION(p, bytes);
  return p;
}

void carve(Loc at, const void *p, size_t bytes, const char *name) {
  Core &c = core_at(at);
  if (bytes == 0) violation(at, "on-chip tile '%s' is empty", name);
  Space s = space_named(at, p, bytes, "on-chip tile '", name, "'");
  if (s == Space::GDRAM) violation(at, "on-chip tile '%s' is carved from GDRAM", name);
  c.regions.push_back(Region{reinterpret_cast<uintptr_t>(p), bytes, s, name});
  ASAN_UNPOISON_MEMORY_REGION(p, bytes);
}

void vector_count(Loc at, const char *op, long count, size_t elem) {
  if (count <= 0 || (static_cast<size_t>(count) * elem) % 128 != 0)
    violation(at, "%s: element count %ld (%ld bytes) must be positive and a multiple of 128 bytes", op, count,
              count * static_cast<long>(elem));
}

void vector_operand(Loc at, const char *op, const void *p, size_t count, size_t elem) {
  if (core_at(at).mpu) memory_core_breach(at, op);
  Space s = space_of(at, p, count * elem, op);
  if (s != Space::NRAM) violation(at, "%s: operand %p is in %s, vector operands must be in NRAM", op, p, space_name(s));
  if (reinterpret_cast<uintptr_t>(p) % 64 != 0) violation(at, "%s: operand %p is not 64-byte aligned", op, p);
}

namespace {
struct DirSpaces {
  Space dst, src;
  const char *name;
};
DirSpaces dir_spaces(Loc at, int dir) {
  switch (dir) {
    case GDRAM2NRAM: return {Space::NRAM, Space::GDRAM, "GDRAM2NRAM"};
    case NRAM2GDRAM: return {Space::GDRAM, Space::NRAM, "NRAM2GDRAM"};
    case NRAM2NRAM: return {Space::NRAM, Space::NRAM, "NRAM2NRAM"};
    case GDRAM2SRAM: return {Space::SRAM, Space::GDRAM, "GDRAM2SRAM"};
    case SRAM2GDRAM: return {Space::GDRAM, Space::SRAM, "SRAM2GDRAM"};
    case SRAM2NRAM: return {Space::NRAM, Space::SRAM, "SRAM2NRAM"};
    case NRAM2SRAM: return {Space::SRAM, Space::NRAM, "NRAM2SRAM"};
    case GDRAM2GDRAM: return {Space::GDRAM, Space::GDRAM, "GDRAM2GDRAM"};
    case SRAM2SRAM: return {Space::SRAM, Space::SRAM, "SRAM2SRAM"};
    case GDRAM2WRAM: return {Space::WRAM, Space::GDRAM, "GDRAM2WRAM"};
    case NRAM2WRAM: return {Space::WRAM, Space::NRAM, "NRAM2WRAM"};
    case SRAM2WRAM: return {Space::WRAM, Space::SRAM, "SRAM2WRAM"};
    case WRAM2NRAM: return {Space::NRAM, Space::WRAM, "WRAM2NRAM"};
    default: violation(at, "__memcpy: unknown direction %d", dir);
  }
}
}  // namespace

// GDRAM bytes kernels moved (the traffic counters of mlu_emu_traffic): every copy with a
// GDRAM end and every atomic add. Scalar GDRAM loads and stores are not counted.
std::atomic<uint64_t> g_gdram_read{0}, g_gdram_written{0};

void memcpy_(Loc at, bool async, void *dst, const void *src, long bytes, int dir, long dst_stride, long src_stride,
             long segnum) {
  Core &c = core_at(at);
  const char *op = async ? "__memcpy_async" : "__memcpy";
  DirSpaces d = dir_spaces(at, dir);
  if (bytes <= 0) violation(at, "%s %s: size %ld must be positive", op, d.name, bytes);
  if (segnum < 0 || dst_stride < 0 || src_stride < 0)
    violation(at, "%s %s: strides (%ld, %ld) and segnum %ld must be >= 0", op, d.name, dst_stride, src_stride, segnum);
  // The segment argument's range is [0, 65535] (mlu-ops@v1.4.0
  // kernels/tensor_stride_process/tensor_stride_process_common.h:378).
  if (segnum > 65535) violation(at, "%s %s: segnum %ld beyond 65535", op, d.name, segnum);
  // The size and strides are int on the card: mlu-ops checks a GDRAM stride against INT32_MAX
  // and copies another way beyond it (mlu-ops@v1.4.0 kernels/three_interpolate/
  // three_interpolate_union1.mlu:344-356).
  if (bytes > INT32_MAX || dst_stride > INT32_MAX || src_stride > INT32_MAX)
    violation(at, "%s %s: size %ld or strides (%ld, %ld) beyond the int range of the card's copy", op, d.name, bytes,
              dst_stride, src_stride);
  Space ds = space_named(at, dst, segnum * dst_stride + bytes, op, " ", d.name, " destination");
  Space ss = space_named(at, src, segnum * src_stride + bytes, op, " ", d.name, " source");
  if (ds != d.dst || ss != d.src)
    violation(at, "%s: direction %s copies %s to %s, but the source is in %s and the destination in %s", op, d.name,
              space_name(d.src), space_name(d.dst), space_name(ss), space_name(ds));
  if (c.mpu && (d.dst != Space::SRAM || d.src != Space::GDRAM) && (d.dst != Space::GDRAM || d.src != Space::SRAM))
    memory_core_breach(at, (std::string(op) + " " + d.name).c_str());
  const uint64_t moved = static_cast<uint64_t>(bytes) * static_cast<uint64_t>(segnum + 1);
  if (d.src == Space::GDRAM) g_gdram_read.fetch_add(moved, std::memory_order_relaxed);
  if (d.dst == Space::GDRAM) g_gdram_written.fetch_add(moved, std::memory_order_relaxed);
  Pending p{dst, src, static_cast<size_t>(bytes), dst_stride, src_stride, segnum};
  c.pending.push_back(p);
  if (!async || modes().async_early) run_pending(c);
}

void memcpy_(Loc at, bool async, void *dst, const void *src, long bytes, int dir) {
  memcpy_(at, async, dst, src, bytes, dir, 0, 0, 0);
}

void sync_io(Loc at) { run_pending(core_at(at)); }

// The core's pipelines drained: pending async copies land (scalar stores are in program
// order on the host, so their hazard is checked by the lint of tests/bang_allow_list.rs).
void sync_core(Loc at) { run_pending(core_at(at)); }

void sync_cluster(Loc at) {
  Core &c = core_at(at);
  run_pending(c);
  if (!c.cluster) violation(at, "__sync_cluster in a BLOCK task (only UNION tasks have clusters)");
  c.cluster->barrier.wait(at, "__sync_cluster");
}

void sync_all(Loc at) {
  Core &c = core_at(at);
  run_pending(c);
  if (!c.group) violation(at, "__sync_all in a BLOCK task (only UNION tasks are resident together)");
  c.group->all.wait(at, "__sync_all");
}

void sync_all_ipu(Loc at) {
  Core &c = core_at(at);
  run_pending(c);
  if (!c.group) violation(at, "__sync_all_ipu in a BLOCK task (only UNION tasks are resident together)");
  if (c.mpu) memory_core_breach(at, "__sync_all_ipu");
  c.group->ipu.wait(at, "__sync_all_ipu");
}

namespace {
// binary16 <-> binary32 in software (the emulator's half is its bits, see bang_emu.h), to
// the results GCC's _Float16 conversions gave before (libgcc's soft-fp): round to nearest
// even, subnormal halves produced and read, overflow to infinity, NaN kept with its sign and
// the top 10 payload bits and made quiet.
uint16_t half_bits_rn(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((a >> 13) & 0x3ffu);  // NaN
  // 65520 and above (the tie between 65504 and 2^16 goes to the even side, infinity).
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  const uint32_t e = a >> 23;
  // Below 2^-14: a subnormal half, the significand in units of 2^-24; under 2^-25 (every
  // float subnormal included) that is zero, and shift 24 puts the 2^-25 tie on even zero.
  // From 2^-14 on: a normal half. Rounding up may carry into the exponent field (which is
  // the next binade's encoding); below 65520 it never reaches infinity.
  uint32_t m, shift, q;
  if (e < 113) {
    if (e < 102) return sign;
    m = (a & 0x7fffffu) | 0x800000u;
    shift = 126 - e;
    q = m >> shift;
  } else {
    m = a;
    shift = 13;
    q = (a >> 13) - (112u << 10);
  }
  const uint32_t rem = m & ((1u << shift) - 1), tie = 1u << (shift - 1);
  if (rem > tie || (rem == tie && (q & 1u))) ++q;
  return sign | static_cast<uint16_t>(q);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t x;
  if (e == 0x1f) {
    x = sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0);  // infinity, or NaN made quiet
  } else if (e != 0) {
    x = sign | ((e + 112) << 23) | (m << 13);
  } else {
    // Zero or subnormal: m * 2^-24, exact in a float.
    const float v = static_cast<float>(m) * (1.0f / 16777216.0f);
    std::memcpy(&x, &v, sizeof x);
    x |= sign;
  }
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
}
}  // namespace

void half2float(Loc at, float *d, const half *s, long n) {
  vector_count(at, "__bang_half2float", n, sizeof(half));
  vector_count(at, "__bang_half2float", n, sizeof(float));
  vector_operand(at, "__bang_half2float", d, n, sizeof(float));
  vector_operand(at, "__bang_half2float", s, n, sizeof(half));
  for (long i = 0; i < n; ++i) d[i] = half_to_float(s[i].bits);
}

void float2half_rn(Loc at, half *d, const float *s, long n) {
  vector_count(at, "__bang_float2half_rn", n, sizeof(half));
  vector_count(at, "__bang_float2half_rn", n, sizeof(float));
  vector_operand(at, "__bang_float2half_rn", d, n, sizeof(half));
  vector_operand(at, "__bang_float2half_rn", s, n, sizeof(float));
  for (long i = 0; i < n; ++i) d[i].bits = half_bits_rn(s[i]);
}

namespace {
// A relaxed atomic float add on device memory. C++17 has no std::atomic_ref (C++20), so it is
// the compare-exchange loop libstdc++'s atomic_ref<float>::fetch_add runs, written with the
// GCC/Clang __atomic builtins (lock-free on 4 bytes, seen by ThreadSanitizer).
void atomic_add_float(float *p, float v) {
  float old, next;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  do {
    next = old + v;
  } while (!__atomic_compare_exchange(p, &old, &next, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}

template <typename T>
void atomic_operands(Loc at, const char *op, T *gdram, const T *nram, long n) {
  if (core_at(at).mpu) memory_core_breach(at, op);
  if (n <= 0) violation(at, "%s: element count %ld must be positive", op, n);
  Space g = space_of(at, gdram, n * sizeof(T), op);
  if (g != Space::GDRAM) violation(at, "%s: destination is in %s, it must be in GDRAM", op, space_name(g));
  Space s = space_of(at, nram, n * sizeof(T), op);
  if (s != Space::NRAM) violation(at, "%s: source is in %s, it must be in NRAM", op, space_name(s));
}
}  // namespace

void atomic_reduce_add(Loc at, float *gdram, const float *nram, long n) {
  atomic_operands(at, "__bang_atomic_reduce_add", gdram, nram, n);
  g_gdram_read.fetch_add(n * sizeof(float), std::memory_order_relaxed);
  g_gdram_written.fetch_add(n * sizeof(float), std::memory_order_relaxed);
  for (long i = 0; i < n; ++i) atomic_add_float(gdram + i, nram[i]);
}

void atomic_reduce_add(Loc at, float *gdram, float value, long n) {
  const char *op = "__bang_atomic_reduce_add (one value)";
  if (core_at(at).mpu) memory_core_breach(at, op);
  // The precedents pass a count of 1 with a value; nothing shows what a larger count means.
  if (n != 1) violation(at, "%s: count %ld, the single-value form is used with count 1 only", op, n);
  Space g = space_of(at, gdram, sizeof(float), op);
  if (g != Space::GDRAM) violation(at, "%s: destination is in %s, it must be in GDRAM", op, space_name(g));
  g_gdram_read.fetch_add(sizeof(float), std::memory_order_relaxed);
  g_gdram_written.fetch_add(sizeof(float), std::memory_order_relaxed);
  atomic_add_float(gdram, value);
}

// ---- queues -----------------------------------------------------------------------------
}  // namespace bang_emu

struct MluEmuQueue {
  std::mutex m;
  std::condition_variable cv;
  std::deque<std::function<void()>> jobs;
  bool busy = false, stop = false;
  std::string error;
  std::thread worker;

  MluEmuQueue() {
    worker = std::thread([this] {
      std::unique_lock lock(m);
      for (;;) {
        cv.wait(lock, [&] { return stop || !jobs.empty(); });
        if (jobs.empty()) return;
        auto job = std::move(jobs.front());
        jobs.pop_front();
        busy = true;
        lock.unlock();
        job();
        lock.lock();
        busy = false;
        cv.notify_all();
      }
    });
  }
  ~MluEmuQueue() {
    {
      std::lock_guard lock(m);
      stop = true;
    }
    cv.notify_all();
    worker.join();
  }
  void push(std::function<void()> job) {
    {
      std::lock_guard lock(m);
      jobs.push_back(std::move(job));
    }
    cv.notify_all();
  }
  std::string sync() {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return jobs.empty() && !busy; });
    return std::exchange(error, std::string());
  }
  void record(const std::string &msg) {
    std::lock_guard lock(m);
    if (error.empty()) error = msg;
  }
};

namespace bang_emu {

int launch(const char *kernel, cnrtDim3_t dim, cnrtFunctionType_t type, cnrtQueue_t queue, void (*body)(void *),
           void *args, void (*drop)(void *)) {
  auto owned = std::shared_ptr<void>(args, drop);
  if (!queue) return fail(MLU_EMU_INVALID_ARGUMENT, std::string("launch of '") + kernel + "': null queue");
  long task_dim = static_cast<long>(dim.x) * dim.y * dim.z;
  if (dim.x == 0 || dim.y == 0 || dim.z == 0 || task_dim > (1L << 24))
    return fail(MLU_EMU_INVALID_ARGUMENT, std::string("launch of '") + kernel + "': task dimension (" +
                                              std::to_string(dim.x) + ", " + std::to_string(dim.y) + ", " +
                                              std::to_string(dim.z) + ") is empty or too large");
  if (type != cnrtFuncTypeBlock) {
    int per_job = static_cast<int>(type);
    if (type != cnrtFuncTypeUnion1 && type != cnrtFuncTypeUnion2 && type != cnrtFuncTypeUnion4 &&
        type != cnrtFuncTypeUnion8)
      return fail(MLU_EMU_INVALID_ARGUMENT, std::string("launch of '") + kernel + "': unknown task type");
    if (dim.x % per_job != 0 || task_dim > total_cores())
      return fail(MLU_EMU_INVALID_ARGUMENT,
                  std::string("launch of '") + kernel + "': a UNION" + std::to_string(per_job / kCoresPerCluster) +
                      " task needs dim.x a multiple of " + std::to_string(per_job) + " and at most " +
                      std::to_string(total_cores()) + " tasks (the card's cores), got (" + std::to_string(dim.x) + ", " +
                      std::to_string(dim.y) + ", " + std::to_string(dim.z) + ")");
  }
  std::string name = kernel;
  queue->push([=] {
    Launch l;
    l.kernel = name;
    l.dim = dim;
    l.type = type;
    l.task_dim = static_cast<int>(task_dim);
    execute(l, body, owned.get());
    if (l.failed) queue->record(l.error);
  });
  return MLU_EMU_SUCCESS;
}

}  // namespace bang_emu

// ---- the runtime surface ------------------------------------------------------------
using bang_emu::fail;

extern "C" {

const char *mlu_emu_last_error(void) { return bang_emu::t_last_error.c_str(); }

void mlu_emu_traffic(uint64_t *gdram_read, uint64_t *gdram_written) {
  *gdram_read = bang_emu::g_gdram_read.load(std::memory_order_relaxed);
  *gdram_written = bang_emu::g_gdram_written.load(std::memory_order_relaxed);
}

int mlu_emu_device_count(int32_t *count) {
  if (!count) return fail(MLU_EMU_INVALID_ARGUMENT, "device count: null pointer");
  *count = 1;
  return MLU_EMU_SUCCESS;
}

int mlu_emu_device_info(int32_t device, MluEmuDeviceInfo *info) {
  if (device != 0 || !info) return fail(MLU_EMU_INVALID_ARGUMENT, "device info: the emulator has device 0 only");
  std::memset(info, 0, sizeof *info);
  std::snprintf(info->arch, sizeof info->arch, "%s", bang_emu::kArch);
  info->clusters = bang_emu::clusters();
  info->cores_per_cluster = bang_emu::kCoresPerCluster;
  info->nram_bytes = bang_emu::kNram;
  info->nram_reserved_bytes = bang_emu::kNramReserved;
  info->sram_bytes = bang_emu::kSram;
  info->wram_bytes = bang_emu::kWram;
  return MLU_EMU_SUCCESS;
}

int mlu_emu_malloc(void **ptr, size_t bytes) {
  if (!ptr || bytes == 0) return fail(MLU_EMU_INVALID_ARGUMENT, "malloc: null pointer or zero size");
  // Exactly `bytes` (posix_memalign, unlike aligned_alloc, takes any size), so under ASan an
  // access past the end is reported instead of landing in slack; 64-byte aligned as before,
  // though no rule needs it: GDRAM is never a vector operand.
  void *p = nullptr;
  if (posix_memalign(&p, 64, bytes) != 0)
    return fail(MLU_EMU_OUT_OF_MEMORY, "malloc: out of memory for " + std::to_string(bytes) + " bytes");
  // Fresh device memory is not zero on a card either: 0xFF reads as NaN / -1.
  std::memset(p, 0xFF, bytes);
  std::unique_lock lock(bang_emu::g_mem_mutex);
  bang_emu::g_allocations[reinterpret_cast<uintptr_t>(p)] = bytes;
  *ptr = p;
  return MLU_EMU_SUCCESS;
}

int mlu_emu_free(void *ptr) {
  if (!ptr) return MLU_EMU_SUCCESS;
  {
    std::unique_lock lock(bang_emu::g_mem_mutex);
    if (bang_emu::g_allocations.erase(reinterpret_cast<uintptr_t>(ptr)) == 0)
      return fail(MLU_EMU_INVALID_ARGUMENT, "free: pointer was not returned by malloc or was already freed");
  }
  std::free(ptr);
  return MLU_EMU_SUCCESS;
}

int mlu_emu_memcpy(void *dst, const void *src, size_t bytes, int32_t kind) {
  if (bytes == 0) return MLU_EMU_SUCCESS;
  bool dst_dev = kind == MLU_EMU_HOST_TO_DEVICE || kind == MLU_EMU_DEVICE_TO_DEVICE;
  bool src_dev = kind == MLU_EMU_DEVICE_TO_HOST || kind == MLU_EMU_DEVICE_TO_DEVICE;
  if (!dst_dev && !src_dev) return fail(MLU_EMU_INVALID_ARGUMENT, "memcpy: unknown direction");
  if (!dst || !src) return fail(MLU_EMU_INVALID_ARGUMENT, "memcpy: null pointer");
  if (dst_dev && !bang_emu::gdram_contains(dst, bytes))
    return fail(MLU_EMU_INVALID_ARGUMENT, "memcpy: destination range is not inside one device allocation");
  if (src_dev && !bang_emu::gdram_contains(src, bytes))
    return fail(MLU_EMU_INVALID_ARGUMENT, "memcpy: source range is not inside one device allocation");
  bang_emu::copy_bytes(dst, src, bytes);
  return MLU_EMU_SUCCESS;
}

int mlu_emu_memset(void *dst, int32_t value, size_t bytes) {
  if (bytes == 0) return MLU_EMU_SUCCESS;
  if (!bang_emu::gdram_contains(dst, bytes))
    return fail(MLU_EMU_INVALID_ARGUMENT, "memset: range is not inside one device allocation");
  bang_emu::fill_bytes(dst, value, bytes);
  return MLU_EMU_SUCCESS;
}

int mlu_emu_queue_create(MluEmuQueue **queue) {
  if (!queue) return fail(MLU_EMU_INVALID_ARGUMENT, "queue create: null pointer");
  try {
    *queue = new MluEmuQueue();
  } catch (const std::exception &e) {
    return fail(MLU_EMU_OUT_OF_MEMORY, std::string("queue create: ") + e.what());
  }
  return MLU_EMU_SUCCESS;
}

int mlu_emu_queue_sync(MluEmuQueue *queue) {
  if (!queue) return fail(MLU_EMU_INVALID_ARGUMENT, "queue sync: null queue");
  std::string err = queue->sync();
  if (!err.empty()) return fail(MLU_EMU_KERNEL_FAILED, err);
  return MLU_EMU_SUCCESS;
}

int mlu_emu_queue_destroy(MluEmuQueue *queue) {
  if (!queue) return MLU_EMU_SUCCESS;
  queue->sync();
  delete queue;
  return MLU_EMU_SUCCESS;
}

}  // extern "C"
