/* A stand-in for MLU-OPS's mlu_op.h, written for this project from the facts recorded in
 * docs/MLUOPS_BINDING.md section 1 (names, values and parameter types of Cambricon/mlu-ops
 * v1.4.0, identical at v1.9.1). It is not Cambricon's header: it declares only what that
 * table lists, in its own words, so that tests/mluops_header.rs can compile its check of
 * the Rust binding on machines without a Cambricon toolkit. Nothing here is defined: a
 * translation unit including it links to nothing. */
#ifndef ONNXRUNTIME_EP_MLU_MLU_OP_STANDIN_H
#define ONNXRUNTIME_EP_MLU_MLU_OP_STANDIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CNRT's queue handle (cnrt.h): an opaque pointer. */
typedef struct StandinCnrtQueue *cnrtQueue_t;

/* Opaque handle and descriptors (binding table 1.1). */
typedef struct mluOpContext *mluOpHandle_t;
typedef struct mluOpTensorStruct *mluOpTensorDescriptor_t;
typedef struct mluOpSparseConvolutionStruct *mluOpSparseConvolutionDescriptor_t;

/* Enums (binding table 1.2). */
typedef enum {
  MLUOP_STATUS_SUCCESS = 0,
  MLUOP_STATUS_NOT_INITIALIZED = 1,
  MLUOP_STATUS_ALLOC_FAILED = 2,
  MLUOP_STATUS_BAD_PARAM = 3,
  MLUOP_STATUS_INTERNAL_ERROR = 4,
  MLUOP_STATUS_ARCH_MISMATCH = 5,
  MLUOP_STATUS_EXECUTION_FAILED = 6,
  MLUOP_STATUS_NOT_SUPPORTED = 7,
  MLUOP_STATUS_NUMERICAL_OVERFLOW = 8
} mluOpStatus_t;

typedef enum {
  MLUOP_LAYOUT_NCHW = 0,
  MLUOP_LAYOUT_NHWC = 1,
  MLUOP_LAYOUT_HWCN = 2,
  MLUOP_LAYOUT_NDHWC = 3,
  MLUOP_LAYOUT_ARRAY = 4,
  MLUOP_LAYOUT_NCDHW = 5,
  MLUOP_LAYOUT_TNC = 6,
  MLUOP_LAYOUT_NTC = 7,
  MLUOP_LAYOUT_NC = 8,
  MLUOP_LAYOUT_NLC = 9,
  MLUOP_LAYOUT_NCL = 10
} mluOpTensorLayout_t;

typedef enum {
  MLUOP_DTYPE_INVALID = 0,
  MLUOP_DTYPE_HALF = 1,
  MLUOP_DTYPE_FLOAT = 2,
  MLUOP_DTYPE_INT8 = 3,
  MLUOP_DTYPE_INT16 = 4,
  MLUOP_DTYPE_INT31 = 5,
  MLUOP_DTYPE_INT32 = 6,
  MLUOP_DTYPE_UINT8 = 7,
  MLUOP_DTYPE_BOOL = 8,
  MLUOP_DTYPE_INT64 = 9,
  MLUOP_DTYPE_UINT32 = 11,
  MLUOP_DTYPE_UINT64 = 12,
  MLUOP_DTYPE_UINT16 = 13,
  MLUOP_DTYPE_DOUBLE = 14,
  MLUOP_DTYPE_COMPLEX_HALF = 15,
  MLUOP_DTYPE_COMPLEX_FLOAT = 16,
  MLUOP_DTYPE_BFLOAT16 = 17
} mluOpDataType_t;

typedef enum {
  MLUOP_REDUCE_DSUM = 0,
  MLUOP_REDUCE_DMEAN = 1,
  MLUOP_REDUCE_DMAX = 2
} mluOpReduceMode_t;

/* Functions (binding table 1.3). Short parameter names of our own; a top-level const on a
 * by-value parameter is no part of a function's type, so only the pointees' const is kept. */

/* Library, handle, errors. */
void mluOpGetLibVersion(int *major, int *minor, int *patch);
const char *mluOpGetErrorString(mluOpStatus_t status);
mluOpStatus_t mluOpCreate(mluOpHandle_t *handle);
mluOpStatus_t mluOpDestroy(mluOpHandle_t handle);
mluOpStatus_t mluOpSetQueue(mluOpHandle_t handle, cnrtQueue_t queue);

/* Tensor descriptors. */
mluOpStatus_t mluOpCreateTensorDescriptor(mluOpTensorDescriptor_t *desc);
mluOpStatus_t mluOpSetTensorDescriptor(mluOpTensorDescriptor_t desc, mluOpTensorLayout_t layout,
                                       mluOpDataType_t dtype, int rank, const int *dims);
mluOpStatus_t mluOpDestroyTensorDescriptor(mluOpTensorDescriptor_t desc);

/* Sparse-convolution descriptors. */
mluOpStatus_t mluOpCreateSparseConvolutionDescriptor(mluOpSparseConvolutionDescriptor_t *desc);
mluOpStatus_t mluOpSetSparseConvolutionDescriptor(mluOpSparseConvolutionDescriptor_t desc, int rank,
                                                  int batch, const int *pad, const int *stride,
                                                  const int *dilation, const int *in_space,
                                                  const int *kernel_space, const int *out_space,
                                                  int subm, int transpose, int inverse);
mluOpStatus_t mluOpGetSparseConvolutionNumActOut(mluOpSparseConvolutionDescriptor_t desc, int *count);
mluOpStatus_t mluOpDestroySparseConvolutionDescriptor(mluOpSparseConvolutionDescriptor_t desc);

/* DynamicPointToVoxel (backward: DynamicScatterBackward). */
mluOpStatus_t mluOpGetDynamicPointToVoxelBackwardWorkspaceSize(
    mluOpHandle_t handle, mluOpReduceMode_t reduce, mluOpTensorDescriptor_t d_grad_voxels,
    mluOpTensorDescriptor_t d_feats, mluOpTensorDescriptor_t d_voxels, mluOpTensorDescriptor_t d_map,
    mluOpTensorDescriptor_t d_counts, mluOpTensorDescriptor_t d_voxel_num, size_t *bytes);
mluOpStatus_t mluOpDynamicPointToVoxelBackward(
    mluOpHandle_t handle, mluOpReduceMode_t reduce, mluOpTensorDescriptor_t d_grad_voxels,
    const void *grad_voxels, mluOpTensorDescriptor_t d_feats, const void *feats,
    mluOpTensorDescriptor_t d_voxels, const void *voxels, mluOpTensorDescriptor_t d_map, const void *map,
    mluOpTensorDescriptor_t d_counts, const void *counts, mluOpTensorDescriptor_t d_voxel_num,
    const void *voxel_num, void *workspace, size_t workspace_bytes, mluOpTensorDescriptor_t d_grad_feats,
    void *grad_feats);
mluOpStatus_t mluOpGetDynamicPointToVoxelForwardWorkspaceSize(mluOpHandle_t handle,
                                                             mluOpTensorDescriptor_t d_feats,
                                                             mluOpTensorDescriptor_t d_coors, size_t *bytes);
mluOpStatus_t mluOpDynamicPointToVoxelForward(
    mluOpHandle_t handle, mluOpReduceMode_t reduce, mluOpTensorDescriptor_t d_feats, const void *feats,
    mluOpTensorDescriptor_t d_coors, void *coors, void *workspace, size_t workspace_bytes,
    mluOpTensorDescriptor_t d_voxels, void *voxels, mluOpTensorDescriptor_t d_voxel_coors,
    void *voxel_coors, mluOpTensorDescriptor_t d_map, void *map, mluOpTensorDescriptor_t d_counts,
    void *counts, mluOpTensorDescriptor_t d_voxel_num, void *voxel_num);

/* ThreeInterpolate. */
mluOpStatus_t mluOpThreeInterpolateForward(mluOpHandle_t handle, mluOpTensorDescriptor_t d_features,
                                           const void *features, mluOpTensorDescriptor_t d_indices,
                                           const void *indices, mluOpTensorDescriptor_t d_weights,
                                           const void *weights, mluOpTensorDescriptor_t d_out, void *out);
mluOpStatus_t mluOpThreeInterpolateBackward(mluOpHandle_t handle, mluOpTensorDescriptor_t d_grad_out,
                                            const void *grad_out, mluOpTensorDescriptor_t d_indices,
                                            const void *indices, mluOpTensorDescriptor_t d_weights,
                                            const void *weights, mluOpTensorDescriptor_t d_grad_features,
                                            void *grad_features);

/* GetIndicePairs and IndiceConvolutionForward. */
mluOpStatus_t mluOpGetIndicePairsWorkspaceSize(mluOpHandle_t handle, mluOpSparseConvolutionDescriptor_t conv,
                                               mluOpTensorDescriptor_t d_indices, mluOpTensorDescriptor_t d_pairs,
                                               mluOpTensorDescriptor_t d_out_indices,
                                               mluOpTensorDescriptor_t d_counts, size_t *bytes);
mluOpStatus_t mluOpGetIndicePairs(mluOpHandle_t handle, mluOpSparseConvolutionDescriptor_t conv,
                                  mluOpTensorDescriptor_t d_indices, const void *indices, void *workspace,
                                  size_t workspace_bytes, mluOpTensorDescriptor_t d_pairs, void *pairs,
                                  mluOpTensorDescriptor_t d_out_indices, void *out_indices,
                                  mluOpTensorDescriptor_t d_counts, void *counts);
mluOpStatus_t mluOpGetIndiceConvolutionForwardWorkspaceSize(
    mluOpHandle_t handle, mluOpTensorDescriptor_t d_features, mluOpTensorDescriptor_t d_filters,
    mluOpTensorDescriptor_t d_pairs, mluOpTensorDescriptor_t d_out, const int64_t *counts,
    int64_t out_sites, int64_t inverse, int64_t subm, size_t *bytes);
mluOpStatus_t mluOpIndiceConvolutionForward(
    mluOpHandle_t handle, mluOpTensorDescriptor_t d_features, const void *features,
    mluOpTensorDescriptor_t d_filters, const void *filters, mluOpTensorDescriptor_t d_pairs,
    const void *pairs, const int64_t *counts, int64_t out_sites, int64_t inverse, int64_t subm,
    void *workspace, size_t workspace_bytes, mluOpTensorDescriptor_t d_out, void *out);

/* VoxelPoolingForward. */
mluOpStatus_t mluOpVoxelPoolingForward(mluOpHandle_t handle, int batches, int points, int channels, int nx,
                                       int ny, int nz, mluOpTensorDescriptor_t d_geom, const void *geom,
                                       mluOpTensorDescriptor_t d_feats, const void *feats,
                                       mluOpTensorDescriptor_t d_out, void *out,
                                       mluOpTensorDescriptor_t d_pos_memo, void *pos_memo);

/* PsRoiPool. */
mluOpStatus_t mluOpPsRoiPoolForward(mluOpHandle_t handle, int pooled_h, int pooled_w, float scale, int group,
                                    int out_channels, mluOpTensorDescriptor_t d_input, const void *input,
                                    mluOpTensorDescriptor_t d_rois, const void *rois,
                                    mluOpTensorDescriptor_t d_out, void *out,
                                    mluOpTensorDescriptor_t d_mapping, void *mapping);
mluOpStatus_t mluOpPsRoiPoolBackward(mluOpHandle_t handle, int pooled_h, int pooled_w, float scale,
                                     int out_channels, mluOpTensorDescriptor_t d_top_grad, const void *top_grad,
                                     mluOpTensorDescriptor_t d_rois, const void *rois,
                                     mluOpTensorDescriptor_t d_mapping, const void *mapping,
                                     mluOpTensorDescriptor_t d_bottom_grad, void *bottom_grad);

#ifdef __cplusplus
}
#endif

#endif
