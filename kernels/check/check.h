// Value checks: the C ABI of check.mlu, the operator-agnostic kernels that check the
// contract's rules on input values on the card. Each writes `record`: the first row that
// breaks its rule, or -1. The compute kernels of the node are gated on the records
// (bang_gate_closed, ../common/kernel.h) and the host reads them after its one queue
// synchronisation. Included after ../common/kernel.h. build.rs generates the Rust side
// (crate::mlu::abi) from this file (build_support/abi.rs).
#pragma once

// Inclusive bounds per column of an int32 row (at most 4 columns).
typedef struct BangIntBounds {
  int32_t lo[4];
  int32_t hi[4];
} BangIntBounds;

// int32 [rows, cols]: every value within its column's bounds.
BANG_EXPORT int bang_check_int_rows(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type, const int32_t *data,
                                    int32_t rows, int32_t cols, const BangIntBounds *bounds, int32_t tile_rows,
                                    int32_t *task_first, int32_t *record);

// float [rows, cols]: in every row whose values are all finite, above < row[col] < below.
BANG_EXPORT int bang_check_float_rows(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type, const float *data,
                                      int32_t rows, int32_t cols, int32_t col, float above, float below,
                                      int32_t tile_rows, int32_t *task_first, int32_t *record);
