// Shared by every kernel of kernels/: the BANG surface (the toolkit's <bang.h> under
// cncc, the host emulator otherwise), the on-chip budget, tiling helpers and the launch
// macro, so one .mlu source builds for a card and for the emulator.
#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(__BANG__)
#include <bang.h>
#include <cnrt.h>
#else
#include "../emulator/bang_emu.h"
#endif

// ---- the NRAM budget: the one place it is computed ----------------------------------
// MLU370 (mtp_372): 768 KB NRAM per core, 128 KB of it reserved for the stack. The host
// policy (src/ops/*/mlu.rs) splits exactly this many bytes into tiles; mluops_nram_budget()
// exports it so a test pins the Rust copy to this one.
#define MLUOPS_NRAM_BYTES (768 * 1024)
#define MLUOPS_NRAM_STACK_BYTES (128 * 1024)
#define MLUOPS_NRAM_BUDGET (MLUOPS_NRAM_BYTES - MLUOPS_NRAM_STACK_BYTES)
// Vector operands: 64-byte aligned addresses, element counts of 128 bytes.
#define MLUOPS_ALIGN_BYTES 64
#define MLUOPS_VECTOR_BYTES 128

// The kernel's NRAM: one buffer of the whole budget per core.
#if defined(__BANG__)
#define MLUOPS_NRAM(name) __nram__ int8_t name[MLUOPS_NRAM_BUDGET]
#else
#define MLUOPS_NRAM(name)                                                                \
  int8_t *name = static_cast<int8_t *>(                                                  \
      ::bang_emu::onchip_alloc(BANG_EMU_LOC, ::bang_emu::Space::NRAM, MLUOPS_NRAM_BUDGET, #name))
#endif

// Takes `count` elements of T from the NRAM cursor, 64-byte aligned. Under the emulator
// the tile becomes its own checked buffer, so overrunning a tile is caught even when
// the next tile follows it.
#if defined(__BANG__)
#define MLUOPS_CARVE(T, name, cursor, count) T *name = mluops_carve<T>(cursor, count)
#else
#define MLUOPS_CARVE(T, name, cursor, count)                                             \
  T *name = mluops_carve<T>(cursor, count);                                              \
  ::bang_emu::carve(BANG_EMU_LOC, name, (count) * sizeof(T), #name)
#endif

template <typename T>
__mlu_func__ T *mluops_carve(int8_t *&cursor, long count) {
  T *p = reinterpret_cast<T *>(cursor);
  long bytes = (count * static_cast<long>(sizeof(T)) + MLUOPS_ALIGN_BYTES - 1) / MLUOPS_ALIGN_BYTES * MLUOPS_ALIGN_BYTES;
  cursor += bytes;
  return p;
}

// Element count rounded up to whole 128-byte vectors.
template <typename T>
__mlu_func__ long mluops_vec_pad(long n) {
  const long per = MLUOPS_VECTOR_BYTES / static_cast<long>(sizeof(T));
  return (n + per - 1) / per * per;
}

// The [begin, end) share of `total` items for task `task` of `tasks`: the first
// total % tasks tasks take one more (the seeds' rem_num rule).
__mlu_func__ void mluops_share(long total, int task, int tasks, long *begin, long *end) {
  long per = total / tasks, rem = total % tasks;
  *begin = task * per + (task < rem ? task : rem);
  *end = *begin + per + (task < rem ? 1 : 0);
}

// ---- launch ---------------------------------------------------------------------------
// Every kernel has a C-ABI launch entry `mluops_<op>_<kernel>(queue, dim..., args...)`
// returning 0 or a runtime error code.
#if defined(__BANG__)
#define MLUOPS_LAUNCH(kernel, dim, type, queue, ...) \
  (kernel<<<dim, type, queue>>>(__VA_ARGS__), static_cast<int>(cnrtGetLastError()))
#else
#define MLUOPS_LAUNCH(kernel, dim, type, queue, ...) \
  ::bang_emu::launch_fn(#kernel, dim, type, queue, [=] { kernel(__VA_ARGS__); })
#endif

#define MLUOPS_EXPORT extern "C" __attribute__((visibility("default")))
