// Host emulation of the BANG C device language, strict enough to catch the bugs that
// would break on a card. Included (through kernels/common/kernel.h) instead of the
// toolkit's <mlu.h> when the kernels are compiled with the system C++ compiler.
//
// What it models (see kernels/README.md):
// - a launch runs its tasks on the card's persistent host threads, one per core; UNION
//   tasks are grouped into clusters of CORES_PER_CLUSTER cores that share one SRAM, every
//   core has its own NRAM and WRAM;
// - on-chip buffers come from per-core / per-cluster arenas of the architecture's size;
// - every __memcpy checks both ranges (inside one device buffer) and the direction
//   against the address spaces; __memcpy_async copies happen at the next __sync_io /
//   __sync / barrier, so reading before the sync sees stale data;
// - every vector intrinsic checks its operands live in NRAM, inside one buffer, 64-byte
//   aligned, with an element count whose byte size is a positive multiple of 128;
// - atomics are real host atomics on GDRAM; barriers are real barriers.
// A broken rule throws bang_emu::Violation, naming kernel, task and source line; the
// launch is aborted and the queue reports the message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

// The device's binary16 as its 16 bits. The kernels only move halves and convert them with
// __bang_half2float / __bang_float2half_rn (software conversions in emu_runtime.cc), so no
// host half arithmetic, nor _Float16 (GCC 12 and later on x86), is needed.
struct half {
  uint16_t bits;
};
static_assert(sizeof(half) == 2, "half is 16 bits");

namespace bang_emu {

struct Loc {
  const char *file;
  int line;
};
#define BANG_EMU_LOC (::bang_emu::Loc{__FILE__, __LINE__})

enum class Space { GDRAM, NRAM, SRAM, WRAM, NONE };
const char *space_name(Space s);

// Task builtins of the running core (set by the launcher for each task).
struct Builtins {
  int taskId, taskDim, taskIdX, taskIdY, taskIdZ, taskDimX, taskDimY, taskDimZ;
  int coreId, coreDim, clusterId, clusterDim;
};
const Builtins &builtins();

[[noreturn]] void violation(Loc at, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// The address space holding [p, p + bytes) as one buffer; a violation when the range
// is not inside one allocated device buffer or on-chip buffer.
Space space_of(Loc at, const void *p, size_t bytes, const char *what);
// On-chip buffer allocation at run time (the emulator's self-tests of the capacities).
void *onchip_alloc(Loc at, Space s, size_t bytes, const char *name);
// The calling core's part of a file-scope NRAM buffer (see NramBuffer).
void *nram_static(Loc decl, size_t offset, size_t bytes, const char *name);

// A file-scope `__nram__` array (BANG_NRAM_BUFFER in kernels/common/kernel.h). The
// buffers of one translation unit are laid out one after another and their total is
// checked against the NRAM budget; using one yields the calling core's copy, and the
// memory core, which has no NRAM, may not use it.
class NramBuffer {
 public:
  NramBuffer(Loc decl, size_t bytes, const char *name);
  operator int8_t *() const { return static_cast<int8_t *>(nram_static(decl_, offset_, bytes_, name_)); }

 private:
  Loc decl_;
  size_t offset_, bytes_;
  const char *name_;
};

// Whether the running task is a cluster's memory core.
bool is_mpu();
// Names [p, p + bytes) as a sub-buffer of the on-chip buffer holding it, so later
// accesses are checked against the sub-buffer (carving one budget into tiles).
void carve(Loc at, const void *p, size_t bytes, const char *name);

// Vector-intrinsic operand rule: NRAM, one buffer, 64-byte aligned, count * size a
// positive multiple of 128 bytes.
void vector_operand(Loc at, const char *op, const void *p, size_t count, size_t elem);
void vector_count(Loc at, const char *op, long count, size_t elem);

enum Direction {
  GDRAM2NRAM, NRAM2GDRAM, NRAM2NRAM, GDRAM2SRAM, SRAM2GDRAM, SRAM2NRAM, NRAM2SRAM,
  GDRAM2GDRAM, SRAM2SRAM, GDRAM2WRAM, NRAM2WRAM, SRAM2WRAM, WRAM2NRAM
};

void memcpy_(Loc at, bool async, void *dst, const void *src, long bytes, int dir);
void memcpy_(Loc at, bool async, void *dst, const void *src, long bytes, int dir, long dst_stride,
             long src_stride, long segnum);
void sync_io(Loc at);
void sync_core(Loc at);
void sync_cluster(Loc at);
void sync_all(Loc at);
void sync_all_ipu(Loc at);

// ---- vector intrinsics --------------------------------------------------------------
template <typename T>
void check2(Loc at, const char *op, T *d, const T *a, long n) {
  vector_count(at, op, n, sizeof(T));
  vector_operand(at, op, d, n, sizeof(T));
  vector_operand(at, op, a, n, sizeof(T));
}
template <typename T>
void check3(Loc at, const char *op, T *d, const T *a, const T *b, long n) {
  check2(at, op, d, a, n);
  vector_operand(at, op, b, n, sizeof(T));
}

#define BANG_EMU_BINARY(NAME, EXPR)                                                   \
  template <typename T>                                                              \
  void NAME(Loc at, T *d, const T *a, const T *b, long n) {                          \
    check3(at, "__bang_" #NAME, d, a, b, n);                                                   \
    for (long i = 0; i < n; ++i) {                                                   \
      T x = a[i], y = b[i];                                                          \
      d[i] = (EXPR);                                                                 \
    }                                                                                \
  }                                                                                  \
  template <typename T, typename S>                                                  \
  void NAME##_scalar(Loc at, T *d, const T *a, S s, long n) {                         \
    check2(at, "__bang_" #NAME "_scalar", d, a, n);                                            \
    T y = static_cast<T>(s);                                                         \
    for (long i = 0; i < n; ++i) {                                                   \
      T x = a[i];                                                                    \
      d[i] = (EXPR);                                                                 \
    }                                                                                \
  }
// Comparisons and logic produce 1 or 0 in the operand type (IEEE: NaN never equal).
BANG_EMU_BINARY(add, static_cast<T>(x + y))
BANG_EMU_BINARY(sub, static_cast<T>(x - y))
BANG_EMU_BINARY(mul, static_cast<T>(x * y))
BANG_EMU_BINARY(eq, static_cast<T>(x == y ? 1 : 0))
BANG_EMU_BINARY(ne, static_cast<T>(x != y ? 1 : 0))
BANG_EMU_BINARY(lt, static_cast<T>(x < y ? 1 : 0))
BANG_EMU_BINARY(ge, static_cast<T>(x >= y ? 1 : 0))
BANG_EMU_BINARY(and_, static_cast<T>((x != 0 && y != 0) ? 1 : 0))
BANG_EMU_BINARY(minequal, (x < y ? x : y))
#undef BANG_EMU_BINARY

template <typename T, typename S>
void write_value(Loc at, T *d, long n, S v) {
  vector_count(at, "__bang_write_value", n, sizeof(T));
  vector_operand(at, "__bang_write_value", d, n, sizeof(T));
  for (long i = 0; i < n; ++i) d[i] = static_cast<T>(v);
}

// dst[w][h] = src[h][w] for a height x width matrix; each dimension's byte size must be
// a multiple of 64.
template <typename T>
void transpose(Loc at, T *d, const T *s, long height, long width) {
  if (height <= 0 || width <= 0 || (height * sizeof(T)) % 64 != 0 || (width * sizeof(T)) % 64 != 0)
    violation(at, "__bang_transpose: height %ld and width %ld must be positive with a byte size that is a multiple of 64",
              height, width);
  vector_operand(at, "__bang_transpose", d, height * width, sizeof(T));
  vector_operand(at, "__bang_transpose", s, height * width, sizeof(T));
  if (static_cast<const void *>(d) == static_cast<const void *>(s))
    violation(at, "__bang_transpose: source and destination must not be the same buffer");
  for (long h = 0; h < height; ++h)
    for (long w = 0; w < width; ++w) d[w * height + h] = s[h * width + w];
}

void half2float(Loc at, float *d, const half *s, long n);
void float2half_rn(Loc at, half *d, const float *s, long n);

// Atomic add on GDRAM: element-wise from NRAM, or one value (count 1) from a register.
void atomic_reduce_add(Loc at, float *gdram, const float *nram, long n);
void atomic_reduce_add(Loc at, float *gdram, float value, long n);

}  // namespace bang_emu

// ---- the BANG C surface (not for the emulator's own sources) -------------------------
// The allow-list: only the constructs below exist for a kernel, and each has a public
// Cambricon precedent built for mtp_372 (kernels/README.md has the table with repository,
// path and arch). Anything else, including <math.h>, which this header does not include,
// is a compile error under the emulator.
#ifndef BANG_EMU_RUNTIME
#define __mlu_global__
#define __mlu_func__ static inline
// Raw on-chip qualifiers are not on the list: file-scope NRAM is BANG_NRAM_BUFFER.

#define taskId (::bang_emu::builtins().taskId)
#define taskDim (::bang_emu::builtins().taskDim)
#define __is_mpu() (::bang_emu::is_mpu())

using ::bang_emu::GDRAM2NRAM;
using ::bang_emu::NRAM2GDRAM;
using ::bang_emu::NRAM2NRAM;

#define __memcpy(...) ::bang_emu::memcpy_(BANG_EMU_LOC, false, __VA_ARGS__)
#define __memcpy_async(...) ::bang_emu::memcpy_(BANG_EMU_LOC, true, __VA_ARGS__)
#define __sync_io() ::bang_emu::sync_io(BANG_EMU_LOC)
#define __sync() ::bang_emu::sync_core(BANG_EMU_LOC)
#define __sync_all_ipu() ::bang_emu::sync_all_ipu(BANG_EMU_LOC)

#define __bang_add(...) ::bang_emu::add(BANG_EMU_LOC, __VA_ARGS__)
#define __bang_mul(...) ::bang_emu::mul(BANG_EMU_LOC, __VA_ARGS__)
#define __bang_eq(...) ::bang_emu::eq(BANG_EMU_LOC, __VA_ARGS__)
#define __bang_and(...) ::bang_emu::and_(BANG_EMU_LOC, __VA_ARGS__)
#define __bang_minequal(...) ::bang_emu::minequal(BANG_EMU_LOC, __VA_ARGS__)
#define __bang_add_scalar(...) ::bang_emu::add_scalar(BANG_EMU_LOC, __VA_ARGS__)
#define __bang_sub_scalar(...) ::bang_emu::sub_scalar(BANG_EMU_LOC, __VA_ARGS__)
#define __bang_mul_scalar(...) ::bang_emu::mul_scalar(BANG_EMU_LOC, __VA_ARGS__)
#define __bang_ne_scalar(...) ::bang_emu::ne_scalar(BANG_EMU_LOC, __VA_ARGS__)
#define __bang_lt_scalar(...) ::bang_emu::lt_scalar(BANG_EMU_LOC, __VA_ARGS__)
#define __bang_ge_scalar(...) ::bang_emu::ge_scalar(BANG_EMU_LOC, __VA_ARGS__)
#define __bang_write_value(...) ::bang_emu::write_value(BANG_EMU_LOC, __VA_ARGS__)
#define __bang_transpose(...) ::bang_emu::transpose(BANG_EMU_LOC, __VA_ARGS__)
#define __bang_half2float(...) ::bang_emu::half2float(BANG_EMU_LOC, __VA_ARGS__)
#define __bang_float2half_rn(...) ::bang_emu::float2half_rn(BANG_EMU_LOC, __VA_ARGS__)
#define __bang_atomic_reduce_add(...) ::bang_emu::atomic_reduce_add(BANG_EMU_LOC, __VA_ARGS__)

// Device math (scalar, on the host's IEEE float). No rounding functions: the kernels leave
// every rounding decision to the host (PsRoiPoolBackward's bin spans).
inline bool isnan(float x) { return __builtin_isnan(x); }
inline bool isinf(float x) { return __builtin_isinf(x); }
#endif  // BANG_EMU_RUNTIME

// ---- host side: kernel launch ----------------------------------------------------------
struct cnrtDim3_t {
  unsigned int x, y, z;
};
// CNRT 6.x cnrt.h values (UnionN: N clusters of 4 cores per task).
enum cnrtFunctionType_t {
  cnrtFuncTypeBlock = 1,
  cnrtFuncTypeUnion1 = 4,
  cnrtFuncTypeUnion2 = 8,
  cnrtFuncTypeUnion4 = 16,
  cnrtFuncTypeUnion8 = 32
};
typedef struct MluEmuQueue *cnrtQueue_t;

namespace bang_emu {
// Enqueues a launch of `body` over `dim` tasks; returns 0 or a nonzero code (with a
// message in the runtime's last error) when the launch configuration is invalid.
int launch(const char *kernel, cnrtDim3_t dim, cnrtFunctionType_t type, cnrtQueue_t queue,
           void (*body)(void *), void *args, void (*drop)(void *));

template <typename F>
int launch_fn(const char *kernel, cnrtDim3_t dim, cnrtFunctionType_t type, cnrtQueue_t queue, F f) {
  F *boxed = new F(static_cast<F &&>(f));
  return launch(kernel, dim, type, queue, [](void *p) { (*static_cast<F *>(p))(); }, boxed,
                [](void *p) { delete static_cast<F *>(p); });
}
}  // namespace bang_emu
