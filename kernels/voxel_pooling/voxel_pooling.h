// VoxelPoolingForward: the C ABI of voxel_pooling.mlu, its launch entry. Included
// after ../common/kernel.h (BANG_EXPORT, cnrtQueue_t, the int types). build.rs generates
// the Rust side (the family's `abi` module) from this file (build_support/abi.rs).
#pragma once

BANG_EXPORT int bang_voxel_pooling_forward(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type,
                                           int32_t batches, int32_t points, int32_t channels, int32_t nx,
                                           int32_t ny, int32_t nz, int32_t tile_points, int32_t tile_channels,
                                           const int32_t *geom, const float *feats, float *out,
                                           int32_t *pos_memo);
