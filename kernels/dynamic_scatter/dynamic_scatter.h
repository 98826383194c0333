// DynamicScatterBackward: the C ABI of dynamic_scatter.mlu, its launch entry (the
// max reduction). Included after ../common/kernel.h (BANG_EXPORT, cnrtQueue_t, the int
// types). build.rs generates the Rust side (the family's `abi` module) from this file
// (build_support/abi.rs).
#pragma once

BANG_EXPORT int bang_dynamic_scatter_backward_max(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type,
                                                  int32_t points, int32_t voxels, int32_t channels,
                                                  int32_t padded, int32_t tile_points, int32_t tile_voxels,
                                                  int32_t fill_tile, const float *grad_voxel_feats,
                                                  const float *feats, const float *voxel_feats,
                                                  const int32_t *point2voxel_map, int32_t *reduce_from,
                                                  float *grad_feats, const int32_t *gate, int32_t gates);

// DynamicScatter (the forward partner): the steps of dynamic_scatter.mlu's forward section,
// launched by the host between its two reads (src/ops/dynamic_scatter/bang.rs).
BANG_EXPORT int bang_dynamic_scatter_bounds(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type,
                                            int32_t points, int32_t dims, int32_t tile_points,
                                            const int32_t *coors, int32_t *partial);

BANG_EXPORT int bang_dynamic_scatter_linear(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type,
                                            int32_t points, int32_t dims, int32_t tile_points,
                                            const int32_t *coors, const int32_t *coord_box, int32_t *lin);

BANG_EXPORT int bang_dynamic_scatter_index(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type,
                                           int32_t points, int32_t dims, int32_t words, int32_t tile,
                                           const int32_t *lin, const int32_t *coord_box, const int32_t *bitmap,
                                           const int32_t *word_rank, int32_t *point2voxel_map,
                                           int32_t *voxel_coors);

BANG_EXPORT int bang_dynamic_scatter_reduce(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type,
                                            int32_t points, int32_t voxels, int32_t channels, int32_t mode,
                                            float init, int32_t tile_points, int32_t tile_voxels,
                                            const float *feats, const int32_t *point2voxel_map,
                                            float *voxel_feats, int32_t *voxel_points_count);
