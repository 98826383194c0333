// Shared by every kernel of kernels/: the BANG surface (the toolkit's <mlu.h> under
// cncc, the host emulator otherwise), the on-chip budget, tiling helpers and the launch
// macro, so one .mlu source builds for a card and for the emulator.
#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(__BANG__)
// The headers mlu-ops' device and launch code get (Cambricon/mlu-ops@v1.4.0 kernels/kernel.h:26-28,
// `#include <mlu.h>` under __BANG__; mlu_op.h:44, `cnrt.h`).
#include <mlu.h>
#include <cnrt.h>
#else
#include "../emulator/bang_emu.h"
#endif

// ---- the NRAM budget: the one place it is computed ----------------------------------
// MLU370 (mtp_372): 768 KB NRAM per core, 128 KB of it reserved for the stack. The host
// policy (src/ops/*/bang.rs) splits exactly this many bytes into tiles; bang_nram_budget()
// exports it so a test pins the Rust copy to this one.
#define BANG_NRAM_BYTES (768 * 1024)
#define BANG_NRAM_STACK_BYTES (128 * 1024)
#define BANG_NRAM_BUDGET (BANG_NRAM_BYTES - BANG_NRAM_STACK_BYTES)
// Vector operands: 64-byte aligned addresses, element counts of 128 bytes.
#define BANG_ALIGN_BYTES 64
#define BANG_VECTOR_BYTES 128

// The file's NRAM: one file-scope buffer of the whole budget per .mlu, shared by that
// file's kernels (Cambricon/mlu-ops@v1.4.0 kernels/*/*.mlu, e.g.
// dynamic_point_to_voxel_backward_union1.mlu:30, `__nram__ int8_t nram_buffer[MAX_NRAM_SIZE]`;
// mtp_372). Under the emulator it is an object whose use from a task yields that core's
// NRAM, counted per translation unit against the budget and refused to the memory core.
#if defined(__BANG__)
#define BANG_NRAM_BUFFER(name) __nram__ int8_t name[BANG_NRAM_BUDGET]
#else
#define BANG_NRAM_BUFFER(name) static ::bang_emu::NramBuffer name(BANG_EMU_LOC, BANG_NRAM_BUDGET, #name)
#endif

// Takes `count` elements of T from the NRAM cursor, 64-byte aligned. Under the emulator
// the tile becomes its own checked buffer, so overrunning a tile is caught even when
// the next tile follows it.
#if defined(__BANG__)
#define BANG_CARVE(T, name, cursor, count) T *name = bang_carve<T>(cursor, count)
#else
#define BANG_CARVE(T, name, cursor, count)                                               \
  T *name = bang_carve<T>(cursor, count);                                                \
  ::bang_emu::carve(BANG_EMU_LOC, name, (count) * sizeof(T), #name)
#endif

// Device index arithmetic is 32-bit, as mlu-ops keeps it on mtp_372 (Cambricon/mlu-ops@v1.4.0
// kernels/kernel.h:83-85 makes even sizeof 32-bit there): every host launch policy
// (src/ops/*/bang.rs) bounds the element counts a kernel indexes below 2^31, and loops step
// by the chunk they took (never past their end), so no sum leaves int32.
template <typename T>
__mlu_func__ T *bang_carve(int8_t *&cursor, int32_t count) {
  T *p = reinterpret_cast<T *>(cursor);
  const int32_t size = static_cast<int32_t>(sizeof(T));
  cursor += (count * size + BANG_ALIGN_BYTES - 1) / BANG_ALIGN_BYTES * BANG_ALIGN_BYTES;
  return p;
}

// Element count rounded up to whole 128-byte vectors.
template <typename T>
__mlu_func__ int32_t bang_vec_pad(int32_t n) {
  const int32_t per = BANG_VECTOR_BYTES / static_cast<int32_t>(sizeof(T));
  return (n + per - 1) / per * per;
}

// The [begin, end) share of `total` items for task `task` of `tasks`: the first
// total % tasks tasks take one more (the seeds' rem_num rule).
__mlu_func__ void bang_share(int32_t total, int32_t task, int32_t tasks, int32_t *begin, int32_t *end) {
  const int32_t per = total / tasks, rem = total % tasks;
  *begin = task * per + (task < rem ? task : rem);
  *end = *begin + per + (task < rem ? 1 : 0);
}

// The items a loop at `at` takes next: `tile`, or what is left before `end`.
__mlu_func__ int32_t bang_chunk(int32_t at, int32_t end, int32_t tile) { return end - at < tile ? end - at : tile; }

// ---- bitmaps of linear indices ---------------------------------------------------------
// A bitmap of int32 words (bit i of word w: index 32 w + i) ranked by sparse_conv's rank
// kernel: word_rank[w] = set bits before word w. Shared by GetIndicePairs (output sites)
// and DynamicScatter (voxels in their coordinate box). Scalar GDRAM loads: the allow-list.
__mlu_func__ uint32_t bang_popcount(uint32_t v) {
  v = v - ((v >> 1) & 0x55555555u);
  v = (v & 0x33333333u) + ((v >> 2) & 0x33333333u);
  return (((v + (v >> 4)) & 0x0F0F0F0Fu) * 0x01010101u) >> 24;
}

// Rank of an index whose bit is set: its row among the set indices in ascending order.
__mlu_func__ int32_t bang_bitmap_rank(const int32_t *bitmap, const int32_t *word_rank, int32_t lin) {
  const uint32_t word = static_cast<uint32_t>(bitmap[lin >> 5]);
  const uint32_t below = word & ((1u << (lin & 31)) - 1u);
  return word_rank[lin >> 5] + static_cast<int32_t>(bang_popcount(below));
}

// ---- launch ---------------------------------------------------------------------------
// Every kernel has a C-ABI launch entry `bang_<op>[_<step>](queue, dim..., args...)`
// returning 0 or a runtime error code, declared in its family's <family>/<family>.h (the
// ABI the Rust side is tested against, tests/kernel_abi.rs). BANG_LAUNCH is a statement
// that returns the error code from the entry when the launch fails. On a card it clears a
// stale error before the launch and reads the launch's own after it, as mlu-ops'
// KERNEL_CHECK does (Cambricon/mlu-ops@v1.4.0 core/logging.h:89-105: cnrtGetLastError,
// then cnrtPeekAtLastError; CNRT 6.x).
#if defined(__BANG__)
#define BANG_LAUNCH(kernel, dim, type, queue, ...)                   \
  {                                                                  \
    cnrtGetLastError();                                              \
    kernel<<<dim, type, queue>>>(__VA_ARGS__);                       \
    const int bang_code = static_cast<int>(cnrtPeekAtLastError());   \
    if (bang_code != 0) return bang_code;                            \
  }
#else
#define BANG_LAUNCH(kernel, dim, type, queue, ...)                                                       \
  {                                                                                                     \
    const int bang_code = ::bang_emu::launch_fn(#kernel, dim, type, queue, [=] { kernel(__VA_ARGS__); });   \
    if (bang_code != 0) return bang_code;                                                               \
  }
#endif

#define BANG_EXPORT extern "C" __attribute__((visibility("default")))

// ---- the value-check gate --------------------------------------------------------------
// A node's value-check records (../check/check.h): -1 each while its rule holds. A kernel
// that would address memory with an input's values returns at once when one is not; the
// host reports the broken rule after its queue synchronisation. Scalar GDRAM loads: the
// allow-list (Cambricon/mlu-ops@v1.4.0 kernels/psroipool/psroipool_block.mlu:78; mtp_372).
__mlu_func__ bool bang_gate_closed(const int32_t *gate, int32_t gates) {
  for (int32_t i = 0; i < gates; ++i) {
    if (gate[i] >= 0) return true;
  }
  return false;
}
