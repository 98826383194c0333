// Emulator self-test (host only; tests/emulator.rs drives it): a translation unit whose
// file-scope NRAM buffers together exceed the budget, which the emulator must refuse.
#include "../common/kernel.h"

BANG_NRAM_BUFFER(first_buffer);
BANG_NRAM_BUFFER(second_buffer);

__mlu_global__ void MLUKernelSelftestNramOverBudget(float *buf) {
  if (__is_mpu()) return;
  int8_t *cursor = first_buffer;
  BANG_CARVE(float, tile, cursor, 32);
  __memcpy(tile, buf, 32 * sizeof(float), GDRAM2NRAM);
}

BANG_EXPORT int bang_emu_selftest_nram_over_budget(cnrtQueue_t queue, float *buf) {
  cnrtDim3_t dim = {1, 1, 1};
  BANG_LAUNCH(MLUKernelSelftestNramOverBudget, dim, cnrtFuncTypeBlock, queue, buf);
  return 0;
}
