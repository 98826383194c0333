// PsRoiPoolBackward: the C ABI of psroipool.mlu, its launch entry. Included after
// ../common/kernel.h (BANG_EXPORT, cnrtQueue_t, the int types). build.rs generates the
// Rust side (the family's `abi` module) from this file (build_support/abi.rs).
#pragma once

BANG_EXPORT int bang_psroipool_backward(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type, int32_t rois_num,
                                        int32_t pooled, int32_t output_dim, int32_t height, int32_t width,
                                        int32_t channels, int32_t bins_per_load, int32_t deal,
                                        const float *top_grad, const int32_t *spans,
                                        const int32_t *mapping_channel, float *bottom_grad, const int32_t *gate,
                                        int32_t gates);
