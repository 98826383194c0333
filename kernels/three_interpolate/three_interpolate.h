// ThreeInterpolateBackward: the C ABI of three_interpolate.mlu, its launch entries
// for float and half (one macro defines both there). Included after ../common/kernel.h
// (BANG_EXPORT, cnrtQueue_t, the int types, half). build.rs generates the Rust side (the
// family's `abi` module) from this file (build_support/abi.rs).
#pragma once

BANG_EXPORT int bang_three_interpolate_backward_f32(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type,
                                                    int32_t batches, int32_t channels, int32_t n_points,
                                                    int32_t m_points, int32_t mo, int32_t no, int32_t co,
                                                    const float *grad_output, const int32_t *indices,
                                                    const float *weights, float *grad_features);

BANG_EXPORT int bang_three_interpolate_backward_f16(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type,
                                                    int32_t batches, int32_t channels, int32_t n_points,
                                                    int32_t m_points, int32_t mo, int32_t no, int32_t co,
                                                    const half *grad_output, const int32_t *indices,
                                                    const half *weights, half *grad_features);
