//! What both kernels of the family share: they compute L channels side by side (lanes), so
//! tasks own whole (batch, lane block) output rows, and the channel-major rows of the tensors
//! ([C][N] or [C][M]) are moved into lane tiles ([n][lane]) and back, float16 widened on the
//! way in and rounded on the way out. The forward op tiles its source rows and writes its
//! outputs back; the backward op tiles grad_output.

use super::{Dims, Real};
use crate::error::Result;
use crate::parallel::{Parallel, for_each_part_mut};
use crate::scratch::{self, FirstError};
use std::ops::Range;

/// Units of work (output elements or multiply-adds) per parallel task.
const GRAIN: usize = 32 * 1024;

/// One kernel of the family, on the output rows of one batch and whole lane blocks of
/// channels.
pub(super) trait LaneKernel: Sync {
    /// Output values per channel row.
    fn row(&self, d: &Dims) -> usize;
    /// Units of work per channel, which sizes the tasks.
    fn work(&self, d: &Dims) -> usize;
    /// Fills `part`, the output rows of batch `b` and `channels`, from `input` (channel-major
    /// [B, C, ..]) and the batch's indices and weights ([N, 3] each).
    #[allow(clippy::too_many_arguments)]
    fn fill<T: Real, const L: usize>(
        &self,
        d: &Dims,
        input: &[T],
        b: usize,
        channels: Range<usize>,
        idx: &[i32],
        w: &[T],
        part: &mut [T],
        tr: impl Transpose,
    ) -> Result<()>;
}

/// Cuts the output into tasks of whole (batch, lane block) rows and runs `kernel` on each,
/// in its AVX2 build where the CPU has one.
pub(super) fn split<K: LaneKernel, T: Real, const L: usize>(
    kernel: &K,
    d: &Dims,
    input: &[T],
    indices: &[i32],
    weights: &[T],
    out: &mut [T],
    par: &dyn Parallel,
) -> Result<()> {
    let row = kernel.row(d);
    if out.is_empty() || row == 0 {
        return Ok(());
    }
    // Channels per task: whole lane blocks, enough of them to reach GRAIN units of work.
    let channels = (GRAIN.div_ceil(L.saturating_mul(kernel.work(d)).max(1)) * L).min(d.c).max(1);
    let per_batch = d.c.div_ceil(channels);
    let mut bounds =
        scratch::collect((0..d.b).flat_map(|b| (0..per_batch).map(move |t| (b * d.c + t * channels) * row)), "the task bounds")?;
    scratch::push(&mut bounds, out.len(), "the task bounds")?;
    let errors = FirstError::default();
    for_each_part_mut(par, out, &bounds, |task, part| {
        let (b, first) = (task / per_batch, (task % per_batch) * channels);
        let span = 3 * d.n;
        let (Some(idx), Some(w)) = (indices.get(b * span..(b + 1) * span), weights.get(b * span..(b + 1) * span)) else {
            return;
        };
        let channels = first..first + part.len() / row;
        #[cfg(target_arch = "x86_64")]
        if let Some(avx2) = Avx2::detect() {
            // SAFETY: an `Avx2` exists only when the CPU supports AVX2 and F16C.
            return errors.record(unsafe { fill_avx2::<K, T, L>(kernel, d, input, b, channels, idx, w, part, avx2) });
        }
        errors.record(kernel.fill::<T, L>(d, input, b, channels, idx, w, part, ScalarTranspose));
    });
    errors.into_result()
}

/// [`LaneKernel::fill`] compiled with AVX2 and F16C: the lane loops use 8-wide vectors and the
/// tiles are widened, rounded and transposed 8 x 8 in registers. Products and sums are still
/// separate IEEE operations in the same order (no FMA: that feature is not enabled), so the
/// result is bit-identical to the baseline build. Callers hold an [`Avx2`], which proves
/// the features.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) fn fill_avx2<K: LaneKernel, T: Real, const L: usize>(
    kernel: &K,
    d: &Dims,
    input: &[T],
    b: usize,
    channels: Range<usize>,
    idx: &[i32],
    w: &[T],
    part: &mut [T],
    avx2: Avx2,
) -> Result<()> {
    kernel.fill::<T, L>(d, input, b, channels, idx, w, part, avx2)
}

/// Moves up to L channel rows into a lane tile and back.
pub(super) trait Transpose: Copy {
    /// `tile[p][lane] = rows[lane][p]` for p in 0..nt, as float32.
    fn transpose<T: Real, const L: usize>(self, rows: &[&[T]], nt: usize, tile: &mut [[f32; L]]);
    /// `rows[lane][p] = tile[p][lane]` for p in 0..nt, rounded to T.
    fn untranspose<T: Real, const L: usize>(self, tile: &[[f32; L]], nt: usize, rows: &mut [&mut [T]]);
}

/// The portable layout changes: one element at a time.
#[derive(Clone, Copy)]
pub(super) struct ScalarTranspose;

impl Transpose for ScalarTranspose {
    fn transpose<T: Real, const L: usize>(self, rows: &[&[T]], nt: usize, tile: &mut [[f32; L]]) {
        scalar_transpose(rows, 0..nt, tile, 0);
    }
    fn untranspose<T: Real, const L: usize>(self, tile: &[[f32; L]], nt: usize, rows: &mut [&mut [T]]) {
        scalar_untranspose(tile, 0..nt, rows, 0);
    }
}

/// `tile[p][lane0 + r] = rows[r][p]` for p in `points`.
#[inline(always)]
fn scalar_transpose<T: Real, const L: usize>(rows: &[&[T]], points: std::ops::Range<usize>, tile: &mut [[f32; L]], lane0: usize) {
    for (r, src) in rows.iter().enumerate() {
        let (Some(src), Some(tile)) = (src.get(points.clone()), tile.get_mut(points.clone())) else { continue };
        for (t, &g) in tile.iter_mut().zip(src) {
            if let Some(x) = t.get_mut(lane0 + r) {
                *x = g.to_f32();
            }
        }
    }
}

/// `rows[r][p] = tile[p][lane0 + r]` for p in `points`.
#[inline(always)]
fn scalar_untranspose<T: Real, const L: usize>(tile: &[[f32; L]], points: std::ops::Range<usize>, rows: &mut [&mut [T]], lane0: usize) {
    for (r, dst) in rows.iter_mut().enumerate() {
        let (Some(dst), Some(tile)) = (dst.get_mut(points.clone()), tile.get(points.clone())) else { continue };
        for (d, t) in dst.iter_mut().zip(tile) {
            if let Some(&x) = t.get(lane0 + r) {
                *d = T::from_f32(x);
            }
        }
    }
}

/// Proof that this CPU has AVX2 and F16C (every AVX2 CPU has both): only [`Avx2::detect`]
/// makes one.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Avx2(());

#[cfg(target_arch = "x86_64")]
impl Avx2 {
    pub(super) fn detect() -> Option<Self> {
        // std caches the CPU's features after the first query.
        (std::arch::is_x86_feature_detected!("avx2") && super::real::has_f16c()).then_some(Avx2(()))
    }
}

/// Whole 8 x 8 blocks go through registers, the rest element by element. Inlined into the
/// callers' AVX2 functions, whose target features the intrinsics then share.
#[cfg(target_arch = "x86_64")]
impl Transpose for Avx2 {
    #[inline(always)]
    fn transpose<T: Real, const L: usize>(self, rows: &[&[T]], nt: usize, tile: &mut [[f32; L]]) {
        let full = nt - nt % 8;
        let mut lane0 = 0;
        for group in rows.chunks(8) {
            match <&[&[T]; 8]>::try_from(group) {
                // Only when every row holds `full` points, the tile `full` rows and its rows
                // 8 lanes from lane0 on.
                Ok(group) if lane0 + 8 <= L && tile.len() >= full && group.iter().all(|r| r.len() >= full) => {
                    // SAFETY: `self` exists only when the CPU supports AVX2 and F16C; the
                    // bounds the function requires were checked just above.
                    unsafe { transpose_blocks(group, full, tile, lane0) };
                    scalar_transpose(group, full..nt, tile, lane0);
                }
                _ => scalar_transpose(group, 0..nt, tile, lane0),
            }
            lane0 += 8;
        }
    }

    #[inline(always)]
    fn untranspose<T: Real, const L: usize>(self, tile: &[[f32; L]], nt: usize, rows: &mut [&mut [T]]) {
        let full = nt - nt % 8;
        let mut lane0 = 0;
        for group in rows.chunks_mut(8) {
            match <&mut [&mut [T]; 8]>::try_from(&mut *group) {
                Ok(whole) if lane0 + 8 <= L && tile.len() >= full && whole.iter().all(|r| r.len() >= full) => {
                    // SAFETY: as in `transpose`, the CPU's features and the bounds just checked.
                    unsafe { untranspose_blocks(tile, full, whole, lane0) };
                    scalar_untranspose(tile, full..nt, whole, lane0);
                }
                _ => scalar_untranspose(tile, 0..nt, group, lane0),
            }
            lane0 += 8;
        }
    }
}

/// The 8 x 8 transpose of `r` (vector q's element p becomes vector p's element q).
///
/// # Safety
/// The CPU must support AVX2 (inlined into an AVX2 caller).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose8(r: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let [r0, r1, r2, r3, r4, r5, r6, r7] = r;
    // SAFETY: register shuffles only; AVX2 is the caller's guarantee.
    unsafe {
        // [a0 b0 a1 b1 | a4 b4 a5 b5] and [a2 b2 a3 b3 | a6 b6 a7 b7] for vector pairs (a, b).
        let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
        let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
        let (t4, t5) = (_mm256_unpacklo_ps(r4, r5), _mm256_unpackhi_ps(r4, r5));
        let (t6, t7) = (_mm256_unpacklo_ps(r6, r7), _mm256_unpackhi_ps(r6, r7));
        // Element q of vectors 0-3 in the low half and element q + 4 in the high half.
        let (u0, u1) = (_mm256_shuffle_ps::<0x44>(t0, t2), _mm256_shuffle_ps::<0xEE>(t0, t2));
        let (u2, u3) = (_mm256_shuffle_ps::<0x44>(t1, t3), _mm256_shuffle_ps::<0xEE>(t1, t3));
        let (u4, u5) = (_mm256_shuffle_ps::<0x44>(t4, t6), _mm256_shuffle_ps::<0xEE>(t4, t6));
        let (u6, u7) = (_mm256_shuffle_ps::<0x44>(t5, t7), _mm256_shuffle_ps::<0xEE>(t5, t7));
        [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ]
    }
}

/// `tile[p][lane0 + r] = rows[r][p]` for p in 0..full (a multiple of 8) and r in 0..8
/// (float16 widened as it is loaded).
///
/// # Safety
/// The CPU must support AVX2 and F16C; every row must hold at least `full` values, `tile`
/// at least `full` rows, and `lane0 + 8 <= L`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn transpose_blocks<T: Real, const L: usize>(rows: &[&[T]; 8], full: usize, tile: &mut [[f32; L]], lane0: usize) {
    use std::arch::x86_64::_mm256_storeu_ps;
    let src = rows.map(<[T]>::as_ptr);
    let dst = tile.as_mut_ptr().cast::<f32>();
    for p0 in (0..full).step_by(8) {
        // SAFETY (this block): AVX2, F16C and the bounds are the caller's guarantee: the
        // loads read rows[r][p0..p0 + 8] with p0 + 8 <= full, the stores write
        // tile[p0 + q][lane0..lane0 + 8] with p0 + q < full and lane0 + 8 <= L.
        unsafe {
            let columns = transpose8(src.map(|row| T::load8(row.add(p0))));
            for (q, column) in columns.into_iter().enumerate() {
                _mm256_storeu_ps(dst.add((p0 + q) * L + lane0), column);
            }
        }
    }
}

/// `rows[r][p] = tile[p][lane0 + r]` for p in 0..full (a multiple of 8) and r in 0..8
/// (rounded to float16 as it is stored).
///
/// # Safety
/// As [`transpose_blocks`], with the rows written.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn untranspose_blocks<T: Real, const L: usize>(tile: &[[f32; L]], full: usize, rows: &mut [&mut [T]; 8], lane0: usize) {
    use std::arch::x86_64::_mm256_loadu_ps;
    let src = tile.as_ptr().cast::<f32>();
    let dst = rows.each_mut().map(|r| r.as_mut_ptr());
    for p0 in (0..full).step_by(8) {
        // SAFETY (this block): AVX2, F16C and the bounds are the caller's guarantee: the
        // loads read tile[p0 + q][lane0..lane0 + 8], the stores rows[r][p0..p0 + 8].
        unsafe {
            let points = std::array::from_fn(|q| _mm256_loadu_ps(src.add((p0 + q) * L + lane0)));
            for (row, lanes) in dst.iter().zip(transpose8(points)) {
                T::store8(row.add(p0), lanes);
            }
        }
    }
}

/// Rows `first..first + lanes` of `part` (rows of `row` values), each cut to `cols`: the
/// output rows a tile is written back to. Lanes past `lanes` stay empty.
pub(super) fn lane_rows<T, const L: usize>(part: &mut [T], row: usize, first: usize, lanes: usize, cols: Range<usize>) -> [&mut [T]; L] {
    let mut dst: [&mut [T]; L] = std::array::from_fn(|_| <&mut [T]>::default());
    if row == 0 {
        return dst;
    }
    for (d, r) in dst.iter_mut().zip(part.chunks_exact_mut(row).skip(first).take(lanes)) {
        if let Some(r) = r.get_mut(cols.clone()) {
            *d = r;
        }
    }
    dst
}

/// `rows` zeroed rows of L floats carved out of `buf`, starting on a 64-byte boundary: a
/// row's vector loads and stores then never straddle two cache lines (a heap block is only
/// 16-byte aligned, which would split every other 32-byte access of a 64-byte row).
pub(super) fn line_aligned_rows<const L: usize>(buf: &mut Vec<f32>, rows: usize) -> Result<&mut [[f32; L]]> {
    const LINE_FLOATS: usize = 64 / size_of::<f32>();
    *buf = scratch::filled(rows * L + LINE_FLOATS, 0.0, "the lane tiles of a task")?;
    let skip = buf.as_ptr().align_offset(64).min(LINE_FLOATS);
    Ok(buf[skip..skip + rows * L].as_chunks_mut::<L>().0)
}
