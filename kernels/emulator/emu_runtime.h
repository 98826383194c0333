// The emulated card's runtime surface: the calls the Rust MLU runtime makes on an
// emulated device, mirroring the Cambricon runtime calls it makes on a real one
// (device count, malloc/free, host<->device copies, queues, launches).
// Every function returns 0 on success or a nonzero MLU_EMU_* code; the message of the
// last failure on the calling thread is mlu_emu_last_error().
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  MLU_EMU_SUCCESS = 0,
  MLU_EMU_INVALID_ARGUMENT = 1,
  MLU_EMU_KERNEL_FAILED = 2,
  MLU_EMU_OUT_OF_MEMORY = 3,
};

enum { MLU_EMU_HOST_TO_DEVICE = 1, MLU_EMU_DEVICE_TO_HOST = 2, MLU_EMU_DEVICE_TO_DEVICE = 3 };

typedef struct MluEmuDeviceInfo {
  char arch[32];
  int32_t clusters;
  int32_t cores_per_cluster;
  uint64_t nram_bytes;           // per core, as the architecture has it
  uint64_t nram_reserved_bytes;  // of which the stack takes this much
  uint64_t sram_bytes;           // per cluster
  uint64_t wram_bytes;           // per core
} MluEmuDeviceInfo;

int mlu_emu_device_count(int32_t *count);
int mlu_emu_device_info(int32_t device, MluEmuDeviceInfo *info);
int mlu_emu_malloc(void **ptr, size_t bytes);
int mlu_emu_free(void *ptr);
int mlu_emu_memcpy(void *dst, const void *src, size_t bytes, int32_t kind);
int mlu_emu_memset(void *dst, int32_t value, size_t bytes);
int mlu_emu_queue_create(struct MluEmuQueue **queue);
int mlu_emu_queue_sync(struct MluEmuQueue *queue);
int mlu_emu_queue_destroy(struct MluEmuQueue *queue);
const char *mlu_emu_last_error(void);
// GDRAM bytes read and written by kernels since the library was loaded: copies with a GDRAM
// end and atomic adds (scalar GDRAM loads and stores are not counted).
void mlu_emu_traffic(uint64_t *gdram_read, uint64_t *gdram_written);

#ifdef __cplusplus
}
#endif
