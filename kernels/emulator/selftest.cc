// Emulator self-tests (host only; tests/emulator.rs drives them): one kernel applying a
// chosen intrinsic to GDRAM inputs, checked against scalar definitions in Rust, and one
// kernel per enforced rule that deliberately breaks it.
#include "../common/kernel.h"

#include <atomic>

BANG_NRAM_BUFFER(nram_buffer);

// Every intrinsic of the allow-list (bang_emu.h).
enum SelftestOp {
  OP_ADD, OP_MUL, OP_EQ, OP_AND, OP_MINEQUAL, OP_ADD_SCALAR, OP_SUB_SCALAR, OP_MUL_SCALAR, OP_NE_SCALAR,
  OP_LT_SCALAR, OP_GE_SCALAR, OP_WRITE_VALUE, OP_TRANSPOSE, OP_HALF_ROUND_TRIP, OP_ATOMIC_ADD, OP_ATOMIC_ADD_VALUE,
  OP_STRIDED_COPY
};

// out = op(a, b) over n elements of T; `scalar` is the scalar operand; `m` the cycle
// length or the transpose height.
template <typename T>
__mlu_global__ void MLUKernelSelftestIntrinsic(int op, long n, long m, T scalar, const T *a, const T *b, T *out) {
  if (__is_mpu()) return;
  int8_t *cursor = nram_buffer;
  BANG_CARVE(T, x, cursor, n);
  BANG_CARVE(T, y, cursor, n);
  BANG_CARVE(T, z, cursor, n);
  __memcpy(x, a, n * sizeof(T), GDRAM2NRAM);
  __memcpy(y, b, n * sizeof(T), GDRAM2NRAM);
  switch (op) {
    case OP_ADD: __bang_add(z, x, y, n); break;
    case OP_MUL: __bang_mul(z, x, y, n); break;
    case OP_EQ: __bang_eq(z, x, y, n); break;
    case OP_AND: __bang_and(z, x, y, n); break;
    case OP_MINEQUAL: __bang_minequal(z, x, y, n); break;
    case OP_ADD_SCALAR: __bang_add_scalar(z, x, scalar, n); break;
    case OP_SUB_SCALAR: __bang_sub_scalar(z, x, scalar, n); break;
    case OP_MUL_SCALAR: __bang_mul_scalar(z, x, scalar, n); break;
    case OP_NE_SCALAR: __bang_ne_scalar(z, x, scalar, n); break;
    case OP_LT_SCALAR: __bang_lt_scalar(z, x, scalar, n); break;
    case OP_GE_SCALAR: __bang_ge_scalar(z, x, scalar, n); break;
    case OP_WRITE_VALUE: __bang_write_value(z, n, scalar); break;
    case OP_TRANSPOSE: __bang_transpose(z, x, m, n / m); break;
    case OP_HALF_ROUND_TRIP: {
      // float -> half (round to nearest even) -> float
      BANG_CARVE(half, h, cursor, n);
      __bang_float2half_rn(h, reinterpret_cast<float *>(x), n);
      __bang_half2float(reinterpret_cast<float *>(z), h, n);
      break;
    }
    case OP_ATOMIC_ADD:
      // Every task adds a to out: out = taskDim * a (out starts at 0).
      __bang_atomic_reduce_add(reinterpret_cast<float *>(out), reinterpret_cast<float *>(x), n);
      return;
    case OP_ATOMIC_ADD_VALUE:
      // Every task adds a[i] to out[i] one value at a time.
      for (long i = 0; i < n; ++i) __bang_atomic_reduce_add(reinterpret_cast<float *>(out) + i, static_cast<float>(x[i]), 1);
      return;
    case OP_STRIDED_COPY:
      // Element 2i of a to element i of out, via a strided NRAM copy.
      __memcpy(z, x, sizeof(T), NRAM2NRAM, sizeof(T), 2 * sizeof(T), n / 2 - 1);
      if (taskId == 0) __memcpy(out, z, n / 2 * sizeof(T), NRAM2GDRAM);
      return;
  }
  if (taskId == 0) __memcpy(out, z, n * sizeof(T), NRAM2GDRAM);
}

BANG_EXPORT int bang_emu_selftest_f32(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type, int32_t op,
                                      int64_t n, int64_t m, float scalar, const float *a, const float *b,
                                      float *out) {
  cnrtDim3_t dim = {task_dim, 1, 1};
  BANG_LAUNCH(MLUKernelSelftestIntrinsic<float>, dim, static_cast<cnrtFunctionType_t>(task_type), queue,
                       op, n, m, scalar, a, b, out);
  return 0;
}

BANG_EXPORT int bang_emu_selftest_i32(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type, int32_t op,
                                      int64_t n, int64_t m, int32_t scalar, const int32_t *a, const int32_t *b,
                                      int32_t *out) {
  cnrtDim3_t dim = {task_dim, 1, 1};
  BANG_LAUNCH(MLUKernelSelftestIntrinsic<int32_t>, dim, static_cast<cnrtFunctionType_t>(task_type), queue,
                       op, n, m, scalar, a, b, out);
  return 0;
}

// ---- deliberately broken kernels: each breaks one rule ---------------------------------
enum Broken {
  NRAM_CAPACITY, SRAM_CAPACITY, WRAM_CAPACITY, SRAM_IN_BLOCK, MISALIGNED, BAD_COUNT, GDRAM_OPERAND,
  COPY_PAST_GDRAM, COPY_PAST_TILE, WRONG_DIRECTION, EMPTY_COPY, BARRIER_IN_BLOCK, BARRIER_NEVER_REACHED,
  BAD_TRANSPOSE, UNALLOCATED_ADDRESS, STALE_ASYNC, MISSING_MPU_GUARD, FIRST_CLUSTER_BARRIER, WIDE_STRIDE
};

__mlu_global__ void MLUKernelSelftestBroken(int rule, float *buf, long n) {
  if (__is_mpu() && rule != MISSING_MPU_GUARD) return;
  int8_t *cursor = nram_buffer;
  BANG_CARVE(float, tile, cursor, 64);
  switch (rule) {
    case NRAM_CAPACITY:
      ::bang_emu::onchip_alloc(BANG_EMU_LOC, ::bang_emu::Space::NRAM, 64, "one_more");
      break;
    case SRAM_CAPACITY:
      ::bang_emu::onchip_alloc(BANG_EMU_LOC, ::bang_emu::Space::SRAM, 3 * 1024 * 1024, "big_sram");
      break;
    case WRAM_CAPACITY:
      ::bang_emu::onchip_alloc(BANG_EMU_LOC, ::bang_emu::Space::WRAM, 1024 * 1024 + 64, "big_wram");
      break;
    case SRAM_IN_BLOCK:
      ::bang_emu::onchip_alloc(BANG_EMU_LOC, ::bang_emu::Space::SRAM, 64, "sram_tile");
      break;
    case MISALIGNED: __bang_add(tile + 1, tile + 1, tile + 1, 32); break;
    case BAD_COUNT: __bang_add(tile, tile, tile, 10); break;
    case GDRAM_OPERAND: __bang_add(tile, tile, buf, 32); break;
    case COPY_PAST_GDRAM: __memcpy(tile, buf + n - 8, 16 * sizeof(float), GDRAM2NRAM); break;
    case COPY_PAST_TILE: __memcpy(tile, buf, 65 * sizeof(float), GDRAM2NRAM); break;
    case WRONG_DIRECTION: __memcpy(buf, tile, 16 * sizeof(float), GDRAM2NRAM); break;
    case EMPTY_COPY: __memcpy(tile, buf, 0, GDRAM2NRAM); break;
    case BARRIER_IN_BLOCK: __sync_all_ipu(); break;
    case BARRIER_NEVER_REACHED:
      if (taskId == 0) return;
      __sync_all_ipu();
      break;
    case MISSING_MPU_GUARD: break;  // the memory core reached the NRAM buffer above
    case FIRST_CLUSTER_BARRIER:
      // Only the first cluster's cores meet: fine for UNION1 (a barrier per cluster), a
      // hang for UNION2 (one barrier over both clusters).
      if (taskId >= 4) return;
      __sync_all_ipu();
      break;
    case BAD_TRANSPOSE: __bang_transpose(tile + 32, tile, 4, 8); break;
    // One segment, so the span stays inside both buffers: only the stride's range is wrong.
    case WIDE_STRIDE: __memcpy(tile, buf, sizeof(float), GDRAM2NRAM, sizeof(float), 1L << 31, 0); break;
    case UNALLOCATED_ADDRESS: {
      float local[16];
      __memcpy(tile, local, sizeof local, GDRAM2NRAM);
      break;
    }
    case STALE_ASYNC:
      // Not a violation: data of an async copy lands at the sync, so reading before it
      // sees the old value (0xFF bytes: NaN) and out[0] records that.
      __memcpy_async(tile, buf, 32 * sizeof(float), GDRAM2NRAM);
      if (taskId == 0) buf[1] = tile[0];
      __sync_io();
      if (taskId == 0) buf[2] = tile[0];
      break;
  }
}

BANG_EXPORT int bang_emu_selftest_broken(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type, int32_t rule,
                                         float *buf, int64_t n) {
  cnrtDim3_t dim = {task_dim, 1, 1};
  BANG_LAUNCH(MLUKernelSelftestBroken, dim, static_cast<cnrtFunctionType_t>(task_type), queue, rule, buf,
                       n);
  return 0;
}

// The order tasks start in (MLU_EMU_ORDER=serial: clusters, or BLOCK tasks, last first):
// each task's first act takes the next ticket. Host code: the counter is the emulator's.
static std::atomic<int32_t> g_ticket{0};

__mlu_global__ void MLUKernelSelftestOrder(int32_t *tickets) {
  if (__is_mpu()) return;
  tickets[taskId] = g_ticket++;
}

BANG_EXPORT int bang_emu_selftest_order(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type, int32_t *tickets) {
  g_ticket = 0;
  cnrtDim3_t dim = {task_dim, 1, 1};
  BANG_LAUNCH(MLUKernelSelftestOrder, dim, static_cast<cnrtFunctionType_t>(task_type), queue, tickets);
  return 0;
}

// On-chip memory no task of this launch wrote must read as poison (0xFF bytes) even where
// an earlier task or launch on the same core or cluster wrote it. Each task first copies
// out what it finds, then writes its buffers: NRAM by scalar stores into a carved tile,
// WRAM and SRAM by copies from `src`. out holds 2n floats per task (what its NRAM and WRAM
// held), then n per cluster (what the memory core found in SRAM; UNION launches only).
__mlu_global__ void MLUKernelSelftestFresh(const float *src, float *out, long n) {
  const size_t bytes = n * sizeof(float);
  if (__is_mpu()) {
    float *sram = static_cast<float *>(::bang_emu::onchip_alloc(BANG_EMU_LOC, ::bang_emu::Space::SRAM, bytes, "sram"));
    __memcpy(out + taskDim * 2 * n + taskId / 4 * n, sram, bytes, ::bang_emu::SRAM2GDRAM);
    __memcpy(sram, src, bytes, ::bang_emu::GDRAM2SRAM);
    return;
  }
  int8_t *cursor = nram_buffer;
  BANG_CARVE(float, seen, cursor, n);
  BANG_CARVE(float, staged, cursor, n);
  float *wram = static_cast<float *>(::bang_emu::onchip_alloc(BANG_EMU_LOC, ::bang_emu::Space::WRAM, bytes, "wram"));
  __memcpy(out + taskId * 2 * n, seen, bytes, NRAM2GDRAM);
  __memcpy(staged, wram, bytes, ::bang_emu::WRAM2NRAM);
  __memcpy(out + taskId * 2 * n + n, staged, bytes, NRAM2GDRAM);
  for (long i = 0; i < n; ++i) seen[i] = 2.0f;
  __memcpy(wram, src, bytes, ::bang_emu::GDRAM2WRAM);
}

BANG_EXPORT int bang_emu_selftest_fresh(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type, const float *src,
                                        float *out, int64_t n) {
  cnrtDim3_t dim = {task_dim, 1, 1};
  BANG_LAUNCH(MLUKernelSelftestFresh, dim, static_cast<cnrtFunctionType_t>(task_type), queue, src, out, n);
  return 0;
}
