// The stand-in toolkit's lib64/libcnrt.so (scripts/rehearse_card.sh): the Cambricon runtime
// calls the provider makes through src/mlu/cnrt.rs, and exactly those, backed by the host
// emulator (kernels/emulator/emu_runtime.cc, linked into this library and exported, so that
// the kernel library the stand-in cncc builds resolves its launches here, as a real kernel
// library resolves its CNRT calls in the real libcnrt).
//
// Names, signatures and values are CNRT 6.x cnrt.h's (6.14.1 and 6.0.2, vendored in public
// repositories; docs/MLU_EVIDENCE facts in src/mlu/cnrt.rs): cnrtRet_t (cnrtSuccess 0,
// cnrtErrorDeviceInvalid 100005, cnrtErrorArgsInvalid 100006, cnrtErrorInvalidResourceHandle
// 100014, cnrtErrorNoMem 100100, cnrtErrorKernelTrap 100132, cnrtErrorDevice 632006,
// cnrtErrorNoAttribute 632009, cnrtErrorMemcpyDirectionInvalid 632013), cnrtMemTransDir_t
// (HostToDev 0, DevToDev 1, DevToHost 2), cnrtDeviceAttr_t (ClusterCount 0x205,
// McorePerCluster 0x206, NramSizePerMcore 0x302).
//
// Cards: MLU_STANDIN_CARDS (1 to 8, default 2) emulated MLU370s, each with the emulator's
// topology (MLU_EMU_CLUSTERS clusters of 4 cores, 768 KB NRAM per core). At least as strict as
// CNRT where this can tell: a device index out of range, an unknown attribute, a null or
// unknown pointer, a range leaving its allocation, a host-side pointer inside device memory, a
// direction outside cnrtMemTransDir_t, memory or a queue of another card than the calling
// thread's current one (cnrtErrorDevice), an unknown or destroyed queue: each an error.
// What it cannot model: the cards share one host memory and one set of emulated cores (no
// per-card capacity or concurrency); a launch is not checked against the queue's card (the
// kernel library calls the emulator directly); cnrtGetLastError / cnrtPeekAtLastError are not
// exported, because the stand-in cncc compiles the host branch of kernels/common/kernel.h
// (see tests/standin_neuware/cncc), whose launches return the emulator's code (1 to 3) instead.
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <string>

#include "../../kernels/emulator/emu_runtime.h"

namespace {

enum : int {
  kSuccess = 0,
  kDeviceInvalid = 100005,
  kArgsInvalid = 100006,
  kInvalidResourceHandle = 100014,
  kNoMem = 100100,
  kKernelTrap = 100132,
  kDevice = 632006,
  kNoAttribute = 632009,
  kMemcpyDirectionInvalid = 632013,
};

int cards() {
  static const int n = [] {
    const char *s = std::getenv("MLU_STANDIN_CARDS");
    const int v = s ? std::atoi(s) : 2;
    return v >= 1 && v <= 8 ? v : 2;
  }();
  return n;
}

// CNRT's current device is per thread, 0 until cnrtSetDevice.
thread_local int t_device = 0;
// The message of the calling thread's last failure, for cnrtGetErrorStr of its code.
thread_local int t_code = kSuccess;
thread_local std::string t_message;

int fail(int code, std::string message) {
  t_code = code;
  t_message = "stand-in CNRT: " + std::move(message);
  return code;
}

struct Allocation {
  size_t bytes;
  int device;
};
std::mutex g_mutex;
std::map<uintptr_t, Allocation> g_allocations;  // by start address
std::map<void *, int> g_queues;                  // queue -> its card

// The allocation holding [p, p + bytes), or end() (called under g_mutex).
std::map<uintptr_t, Allocation>::const_iterator holding(const void *p, size_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = g_allocations.upper_bound(a);
  if (it == g_allocations.begin()) return g_allocations.end();
  --it;
  if (a - it->first > it->second.bytes || bytes > it->second.bytes - (a - it->first)) return g_allocations.end();
  return it;
}

// A device range of the current card: 0, or the failure.
int device_range(const char *call, const char *side, const void *p, size_t bytes) {
  if (!p) return fail(kArgsInvalid, std::string(call) + ": null " + side + " pointer");
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = holding(p, bytes);
  if (it == g_allocations.end())
    return fail(kArgsInvalid, std::string(call) + ": the " + side + " range of " + std::to_string(bytes) +
                                  " bytes is not inside one cnrtMalloc allocation");
  if (it->second.device != t_device)
    return fail(kDevice, std::string(call) + ": the " + side + " memory belongs to card " +
                             std::to_string(it->second.device) + ", the current card is " + std::to_string(t_device));
  return kSuccess;
}

int host_range(const char *call, const char *side, const void *p, size_t bytes) {
  if (!p) return fail(kArgsInvalid, std::string(call) + ": null " + side + " pointer");
  std::lock_guard<std::mutex> lock(g_mutex);
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = g_allocations.upper_bound(a + bytes - 1);
  if (it != g_allocations.begin() && std::prev(it)->first + std::prev(it)->second.bytes > a)
    return fail(kArgsInvalid, std::string(call) + ": the " + side + " (host) range overlaps device memory");
  return kSuccess;
}

// An emulator call's code as CNRT's.
int emulator(const char *call, int code) {
  if (code == MLU_EMU_SUCCESS) return kSuccess;
  const int cnrt = code == MLU_EMU_OUT_OF_MEMORY ? kNoMem : code == MLU_EMU_KERNEL_FAILED ? kKernelTrap : kArgsInvalid;
  return fail(cnrt, std::string(call) + ": " + mlu_emu_last_error());
}

// A live queue of this stand-in, or the failure.
int live_queue(const char *call, void *queue) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_queues.count(queue) == 0) return fail(kInvalidResourceHandle, std::string(call) + ": not a live queue");
  return kSuccess;
}

}  // namespace

extern "C" {

const char *cnrtGetErrorStr(int code) {
  if (code == kSuccess) return "stand-in CNRT: success";
  if (code == t_code) return t_message.c_str();
  // A launch entry of the kernel library returns the emulator's own code (see the top).
  if (code >= MLU_EMU_INVALID_ARGUMENT && code <= MLU_EMU_OUT_OF_MEMORY) {
    t_message = std::string("stand-in CNRT: emulated launch failed: ") + mlu_emu_last_error();
    return t_message.c_str();
  }
  return "stand-in CNRT: an error code this stand-in does not return";
}

int cnrtGetDeviceCount(unsigned int *count) {
  if (!count) return fail(kArgsInvalid, "cnrtGetDeviceCount: null pointer");
  *count = static_cast<unsigned>(cards());
  return kSuccess;
}

int cnrtSetDevice(int device) {
  if (device < 0 || device >= cards())
    return fail(kDeviceInvalid, "cnrtSetDevice: no card " + std::to_string(device) + " of " + std::to_string(cards()));
  t_device = device;
  return kSuccess;
}

int cnrtDeviceGetAttribute(int *value, int attr, int device) {
  if (!value) return fail(kArgsInvalid, "cnrtDeviceGetAttribute: null pointer");
  if (device < 0 || device >= cards())
    return fail(kDeviceInvalid, "cnrtDeviceGetAttribute: no card " + std::to_string(device));
  MluEmuDeviceInfo info;
  if (int code = emulator("cnrtDeviceGetAttribute", mlu_emu_device_info(0, &info))) return code;
  switch (attr) {
    case 0x205: *value = info.clusters; return kSuccess;
    case 0x206: *value = info.cores_per_cluster; return kSuccess;
    case 0x302: *value = static_cast<int>(info.nram_bytes); return kSuccess;
    default: return fail(kNoAttribute, "cnrtDeviceGetAttribute: attribute " + std::to_string(attr) + " is not modelled");
  }
}

int cnrtMalloc(void **ptr, size_t bytes) {
  if (!ptr || bytes == 0) return fail(kArgsInvalid, "cnrtMalloc: null pointer or zero size");
  if (int code = emulator("cnrtMalloc", mlu_emu_malloc(ptr, bytes))) return code;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_allocations[reinterpret_cast<uintptr_t>(*ptr)] = Allocation{bytes, t_device};
  return kSuccess;
}

int cnrtFree(void *ptr) {
  if (!ptr) return fail(kArgsInvalid, "cnrtFree: null pointer");
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == g_allocations.end()) return fail(kArgsInvalid, "cnrtFree: not a live cnrtMalloc pointer");
    if (it->second.device != t_device)
      return fail(kDevice, "cnrtFree: memory of card " + std::to_string(it->second.device) + " freed on card " +
                               std::to_string(t_device));
    g_allocations.erase(it);
  }
  return emulator("cnrtFree", mlu_emu_free(ptr));
}

int cnrtMemcpy(void *dst, void *src, size_t bytes, int dir) {
  int kind;
  switch (dir) {
    case 0: kind = MLU_EMU_HOST_TO_DEVICE; break;
    case 1: kind = MLU_EMU_DEVICE_TO_DEVICE; break;
    case 2: kind = MLU_EMU_DEVICE_TO_HOST; break;
    default: return fail(kMemcpyDirectionInvalid, "cnrtMemcpy: direction " + std::to_string(dir));
  }
  if (bytes == 0) return fail(kArgsInvalid, "cnrtMemcpy: zero bytes");
  const bool dst_dev = dir != 2, src_dev = dir != 0;
  if (int code = dst_dev ? device_range("cnrtMemcpy", "destination", dst, bytes)
                         : host_range("cnrtMemcpy", "destination", dst, bytes))
    return code;
  if (int code = src_dev ? device_range("cnrtMemcpy", "source", src, bytes)
                         : host_range("cnrtMemcpy", "source", src, bytes))
    return code;
  return emulator("cnrtMemcpy", mlu_emu_memcpy(dst, src, bytes, kind));
}

int cnrtMemset(void *ptr, int value, size_t bytes) {
  if (bytes == 0) return fail(kArgsInvalid, "cnrtMemset: zero bytes");
  if (int code = device_range("cnrtMemset", "destination", ptr, bytes)) return code;
  return emulator("cnrtMemset", mlu_emu_memset(ptr, value, bytes));
}

int cnrtQueueCreate(void **queue) {
  if (!queue) return fail(kArgsInvalid, "cnrtQueueCreate: null pointer");
  MluEmuQueue *q = nullptr;
  if (int code = emulator("cnrtQueueCreate", mlu_emu_queue_create(&q))) return code;
  std::lock_guard<std::mutex> lock(g_mutex);
  g_queues[q] = t_device;
  *queue = q;
  return kSuccess;
}

int cnrtQueueSync(void *queue) {
  if (int code = live_queue("cnrtQueueSync", queue)) return code;
  return emulator("cnrtQueueSync", mlu_emu_queue_sync(static_cast<MluEmuQueue *>(queue)));
}

int cnrtQueueDestroy(void *queue) {
  if (int code = live_queue("cnrtQueueDestroy", queue)) return code;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_queues.erase(queue);
  }
  return emulator("cnrtQueueDestroy", mlu_emu_queue_destroy(static_cast<MluEmuQueue *>(queue)));
}

}  // extern "C"
