// The sparse convolution family: the C ABI of sparse_conv.mlu, the launch entries of
// GetIndicePairs' five kernels (expand, mark, rank, out, pairs) and their geometry argument,
// and IndiceConv's epilogue step on the MLU-OPS path. Included after
// ../common/kernel.h (BANG_EXPORT, cnrtQueue_t, the int types). build.rs generates the
// Rust side (the family's `abi` module: GipGeometry, SparseConvKernels) from this file
// (build_support/abi.rs).
#pragma once

// The convolution's geometry per axis (D, H, W) and the mode; passed by pointer, copied to
// the kernels by value.
typedef struct BangGipGeometry {
  int32_t in_space[3];
  int32_t out_space[3];
  int32_t kernel[3];
  int32_t stride[3];
  int32_t pad[3];
  int32_t dilation[3];
  int32_t subm;
} BangGipGeometry;

BANG_EXPORT int bang_get_indice_pairs_expand(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type,
                                             const BangGipGeometry *geometry, int32_t rows, int32_t tile_rows,
                                             const int32_t *indices, int32_t *expand, int32_t *site,
                                             const int32_t *gate, int32_t gates);

BANG_EXPORT int bang_get_indice_pairs_mark(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type, int32_t count,
                                           int32_t words, int32_t tile, const int32_t *src, int32_t *bitmap);

BANG_EXPORT int bang_get_indice_pairs_rank(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type, int32_t words,
                                           int32_t tile_words, const int32_t *bitmap, int32_t *word_rank,
                                           int32_t *core_totals, int32_t *total);

BANG_EXPORT int bang_get_indice_pairs_out(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type,
                                          const BangGipGeometry *geometry, int32_t rows, int32_t words,
                                          int32_t tile, const int32_t *bitmap, const int32_t *word_rank,
                                          const int32_t *site, int32_t *out_indices, int32_t *perm);

BANG_EXPORT int bang_get_indice_pairs_pairs(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type,
                                            int32_t kernel_volume, int32_t rows, int32_t subm, int32_t tile,
                                            const int32_t *expand, const int32_t *bitmap,
                                            const int32_t *word_rank, const int32_t *perm, int32_t *pairs,
                                            int32_t *indice_num);

// IndiceConv's epilogue (mluOpIndiceConvolutionForward has none): over float32 [rows, cols],
// out = act(((out + bias) * scale + shift) + residual), each step only when its pointer is
// not null (relu != 0: ReLU), tile_rows rows per NRAM tile.
BANG_EXPORT int bang_indice_conv_epilogue(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type, int32_t rows,
                                          int32_t cols, int32_t tile_rows, const float *bias, const float *scale,
                                          const float *shift, const float *residual, int32_t relu, float *out);
