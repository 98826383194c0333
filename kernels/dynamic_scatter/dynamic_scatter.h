// DynamicScatterBackward: the C ABI of dynamic_scatter.mlu, its launch entry (the
// max reduction). Included after ../common/kernel.h (MLUOPS_EXPORT, cnrtQueue_t, the int
// types). build.rs generates the Rust side (the family's `abi` module) from this file
// (build_support/abi.rs).
#pragma once

MLUOPS_EXPORT int mluops_dynamic_scatter_backward_max(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type,
                                                      int32_t points, int32_t voxels, int32_t channels,
                                                      int32_t padded, int32_t tile_points, int32_t tile_voxels,
                                                      int32_t fill_tile, const float *grad_voxel_feats,
                                                      const float *feats, const float *voxel_feats,
                                                      const int32_t *point2voxel_map, int32_t *reduce_from,
                                                      float *grad_feats, const int32_t *gate, int32_t gates);
