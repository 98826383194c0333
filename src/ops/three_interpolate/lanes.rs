//! What both kernels of the family share: they compute L channels side by side (lanes), so
//! tasks own whole (batch, lane block) output rows, and the channel-major rows of the tensors
//! ([C][N] or [C][M]) are moved into lane tiles ([n][lane]) and back, float16 widened on the
//! way in and rounded on the way out. The forward op tiles its source rows and writes its
//! outputs back; the backward op tiles grad_output.

use super::{Dims, Real};
use crate::cache;
use crate::error::Result;
use crate::parallel::{Parallel, for_each_part_mut};
use crate::scratch::{self, FirstError};
use std::ops::Range;

/// Units of work (output elements or multiply-adds) per parallel task.
const GRAIN: usize = 32 * 1024;

/// One kernel of the family, on the output rows of one batch and whole lane blocks of
/// channels.
pub(super) trait LaneKernel: Sync {
    /// Whether [`split`] runs the kernel's AVX-512 build at 16 lanes (one 512-bit register)
    /// where the CPU has one. Measured per kernel on Zen 4 only (docs/BENCHMARKS.md); CPUs that
    /// lower their clock for 512-bit work were not measured.
    const AVX512: bool;
    /// Output values per channel row.
    fn row(&self, d: &Dims) -> usize;
    /// Units of work per channel, which sizes the tasks.
    fn work(&self, d: &Dims) -> usize;
    /// Whether the whole output ([B, C, row] of T) is large enough for the write-back to
    /// stream (`Transpose::untranspose`'s `stream`).
    fn streams<T>(&self, d: &Dims) -> bool {
        cache::worth_streaming(d.b * d.c * self.row(d) * size_of::<T>())
    }
    /// Fills `part`, the output rows of the task's batch and channels.
    fn fill<T: Real, const L: usize>(
        &self,
        task: &Task<'_, T>,
        part: &mut [T],
        tr: impl Transpose,
    ) -> Result<()>;
}

/// What one task reads: `input` (channel-major [B, C, ..]), batch `b`'s indices and weights
/// ([N, 3] each), and the output `channels` it fills.
pub(super) struct Task<'a, T> {
    pub d: &'a Dims,
    pub input: &'a [T],
    pub b: usize,
    pub channels: Range<usize>,
    pub idx: &'a [i32],
    pub w: &'a [T],
}

#[cfg(test)]
impl<'a, T> Task<'a, T> {
    /// All channels of a one-batch input.
    pub(super) fn one_batch(d: &'a Dims, input: &'a [T], idx: &'a [i32], w: &'a [T]) -> Self {
        Task { d, input, b: 0, channels: 0..d.c, idx, w }
    }
}

/// Cuts the output into tasks of whole (batch, lane block) rows and runs `kernel` on each,
/// in its AVX-512 build (where the kernel asks for it) or AVX2 build where the CPU has one.
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
    let mut bounds = scratch::collect(
        (0..d.b).flat_map(|b| (0..per_batch).map(move |t| (b * d.c + t * channels) * row)),
        "the task bounds",
    )?;
    scratch::push(&mut bounds, out.len(), "the task bounds")?;
    // The build, chosen once for all tasks.
    #[cfg(target_arch = "x86_64")]
    let (avx512, avx2) = ((K::AVX512 && L == 16).then(Avx512::detect).flatten(), Avx2::detect());
    let errors = FirstError::default();
    for_each_part_mut(par, out, &bounds, |task, part| {
        let (b, first) = (task / per_batch, (task % per_batch) * channels);
        let span = 3 * d.n;
        let (Some(idx), Some(w)) =
            (indices.get(b * span..(b + 1) * span), weights.get(b * span..(b + 1) * span))
        else {
            return;
        };
        let task = Task { d, input, b, channels: first..first + part.len() / row, idx, w };
        #[cfg(target_arch = "x86_64")]
        if let Some(avx512) = avx512 {
            // SAFETY: an `Avx512` exists only when the CPU supports AVX-512F and VL besides
            // AVX2 and F16C.
            return errors.record(unsafe { fill_avx512::<K, T, L>(kernel, &task, part, avx512) });
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(avx2) = avx2 {
            // SAFETY: an `Avx2` exists only when the CPU supports AVX2 and F16C.
            return errors.record(unsafe { fill_avx2::<K, T, L>(kernel, &task, part, avx2) });
        }
        errors.record(kernel.fill::<T, L>(&task, part, ScalarTranspose));
    });
    errors.into_result()
}

/// Defines `$name`: [`LaneKernel::fill`] compiled with the target features `$features`, run
/// on the register transposes of [`Avx2`], the non-temporal stores of a streamed output
/// fenced before the caller's task reports done. Callers hold a `$proof`, which proves the
/// features.
macro_rules! simd_fill {
    ($(#[$doc:meta])* $name:ident, $features:literal, $proof:ty) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        pub(super) fn $name<K: LaneKernel, T: Real, const L: usize>(kernel: &K, task: &Task<'_, T>, part: &mut [T], proof: $proof) -> Result<()> {
            let filled = kernel.fill::<T, L>(task, part, Avx2::from(proof));
            cache::stream_fence();
            filled
        }
    };
}

simd_fill!(
    /// AVX2 and F16C: the lane loops use 8-wide vectors and the tiles are widened, rounded
    /// and transposed 8 x 8 in registers. Products and sums are still separate IEEE
    /// operations in the same order (Rust never fuses `a * b + c` into an FMA, whatever the
    /// target features), so the result is bit-identical to the baseline build (the kernels'
    /// unit tests compare the bits).
    fill_avx2,
    "avx2,f16c",
    Avx2
);

simd_fill!(
    /// [`fill_avx2`] with AVX-512F and VL also enabled: the compiler then computes 16 lanes in
    /// one 512-bit register (the register transposes stay 8 x 8). The same operations in the
    /// same order, so the same bits.
    fill_avx512,
    "avx2,f16c,avx512f,avx512vl",
    Avx512
);

/// Moves up to L channel rows into a lane tile and back.
pub(super) trait Transpose: Copy {
    /// `tile[p][lane] = rows[lane][p]` for p in 0..nt, as float32.
    fn transpose<T: Real, const L: usize>(self, rows: &[&[T]], nt: usize, tile: &mut [[f32; L]]);
    /// `rows[lane][p] = tile[p][lane]` for p in 0..nt, rounded to T. `stream`: the rows are
    /// part of a large output; the SIMD builds then write whole 8-row groups whose rows all
    /// start on a cache line with non-temporal stores, up to the last whole 32 points
    /// ([`fill_avx2`] and [`fill_avx512`] fence them).
    fn untranspose<T: Real, const L: usize>(
        self,
        tile: &[[f32; L]],
        nt: usize,
        rows: &mut [&mut [T]],
        stream: bool,
    );
}

/// The portable layout changes: one element at a time.
#[derive(Clone, Copy)]
pub(super) struct ScalarTranspose;

impl Transpose for ScalarTranspose {
    fn transpose<T: Real, const L: usize>(self, rows: &[&[T]], nt: usize, tile: &mut [[f32; L]]) {
        scalar_transpose(rows, 0..nt, tile, 0);
    }
    /// Plain stores only: only the SIMD builds stream.
    fn untranspose<T: Real, const L: usize>(
        self,
        tile: &[[f32; L]],
        nt: usize,
        rows: &mut [&mut [T]],
        _stream: bool,
    ) {
        scalar_untranspose(tile, 0..nt, rows, 0);
    }
}

/// `tile[p][lane0 + r] = rows[r][p]` for p in `points`.
#[inline(always)]
fn scalar_transpose<T: Real, const L: usize>(
    rows: &[&[T]],
    points: Range<usize>,
    tile: &mut [[f32; L]],
    lane0: usize,
) {
    for (r, src) in rows.iter().enumerate() {
        let (Some(src), Some(tile)) = (src.get(points.clone()), tile.get_mut(points.clone()))
        else {
            continue;
        };
        for (t, &g) in tile.iter_mut().zip(src) {
            if let Some(x) = t.get_mut(lane0 + r) {
                *x = g.to_f32();
            }
        }
    }
}

/// `rows[r][p] = tile[p][lane0 + r]` for p in `points`.
#[inline(always)]
fn scalar_untranspose<T: Real, const L: usize>(
    tile: &[[f32; L]],
    points: Range<usize>,
    rows: &mut [&mut [T]],
    lane0: usize,
) {
    for (r, dst) in rows.iter_mut().enumerate() {
        let (Some(dst), Some(tile)) = (dst.get_mut(points.clone()), tile.get(points.clone()))
        else {
            continue;
        };
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

/// Proof that this CPU has AVX-512F and VL besides AVX2 and F16C: only [`Avx512::detect`]
/// makes one.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Avx512(Avx2);

#[cfg(target_arch = "x86_64")]
impl From<Avx512> for Avx2 {
    fn from(avx512: Avx512) -> Avx2 {
        avx512.0
    }
}

#[cfg(target_arch = "x86_64")]
impl Avx512 {
    pub(super) fn detect() -> Option<Self> {
        let avx2 = Avx2::detect()?;
        (std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512vl"))
        .then_some(Avx512(avx2))
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
                Ok(group)
                    if lane0 + 8 <= L
                        && tile.len() >= full
                        && group.iter().all(|r| r.len() >= full) =>
                {
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
    fn untranspose<T: Real, const L: usize>(
        self,
        tile: &[[f32; L]],
        nt: usize,
        rows: &mut [&mut [T]],
        stream: bool,
    ) {
        let full = nt - nt % 8;
        let mut lane0 = 0;
        for group in rows.chunks_mut(8) {
            match <&mut [&mut [T]; 8]>::try_from(&mut *group) {
                Ok(whole)
                    if lane0 + 8 <= L
                        && tile.len() >= full
                        && whole.iter().all(|r| r.len() >= full) =>
                {
                    // SAFETY: as in `transpose`, the CPU's features and the bounds just checked.
                    unsafe { untranspose_blocks(tile, full, whole, lane0, stream) };
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
unsafe fn transpose_blocks<T: Real, const L: usize>(
    rows: &[&[T]; 8],
    full: usize,
    tile: &mut [[f32; L]],
    lane0: usize,
) {
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

/// Points of each row written per step when streaming: 32 values fill whole 64-byte lines
/// (two of float32, one of float16), each line written in one go so that the CPU's
/// write-combining sends it to memory whole.
#[cfg(target_arch = "x86_64")]
const STREAM_POINTS: usize = 32;

/// `rows[r][p] = tile[p][lane0 + r]` for p in 0..full (a multiple of 8) and r in 0..8
/// (rounded to float16 as it is stored). `stream`: where every row starts on a cache line,
/// whole lines are written with non-temporal stores (no read for ownership: at the seed
/// shapes ThreeInterpolate's output then takes 0.7-0.75x the time, 1 and 2 threads).
///
/// # Safety
/// As [`transpose_blocks`], with the rows written.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn untranspose_blocks<T: Real, const L: usize>(
    tile: &[[f32; L]],
    full: usize,
    rows: &mut [&mut [T]; 8],
    lane0: usize,
    stream: bool,
) {
    use std::arch::x86_64::_mm256_setzero_ps;
    let src = tile.as_ptr().cast::<f32>();
    let dst = rows.each_mut().map(|r| r.as_mut_ptr());
    let streamed = if stream && dst.iter().all(|row| row.cast::<u8>().align_offset(64) == 0) {
        full - full % STREAM_POINTS
    } else {
        0
    };
    for p0 in (0..streamed).step_by(STREAM_POINTS) {
        // SAFETY (this block): AVX2, F16C and the bounds are the caller's guarantee: the
        // loads read tile[p0 + q][lane0..lane0 + 8] with p0 + q < streamed <= full, the stores
        // write rows[r][p0..p0 + STREAM_POINTS]; each store's address, row + p0 + 16h, is
        // 32-byte aligned (the row starts on a line, p0 + 16h is a multiple of 16 values of
        // at least 2 bytes), as `stream16` requires.
        unsafe {
            let mut blocks = [[_mm256_setzero_ps(); 8]; STREAM_POINTS / 8];
            for (u, block) in blocks.iter_mut().enumerate() {
                *block = transpose8(tile_points::<L>(src, p0 + 8 * u, lane0));
            }
            for (r, row) in dst.iter().enumerate() {
                for (h, pair) in blocks.chunks_exact(2).enumerate() {
                    T::stream16(row.add(p0 + 16 * h), pair[0][r], pair[1][r]);
                }
            }
        }
    }
    for p0 in (streamed..full).step_by(8) {
        // SAFETY (this block): as above, the loads read tile[p0 + q][lane0..lane0 + 8], the
        // stores rows[r][p0..p0 + 8], p0 + 8 <= full.
        unsafe {
            for (row, lanes) in dst.iter().zip(transpose8(tile_points::<L>(src, p0, lane0))) {
                T::store8(row.add(p0), lanes);
            }
        }
    }
}

/// The 8 tile rows from point `p0` on, lanes `lane0..lane0 + 8`, as vectors. A function,
/// not a closure: a closure would not inherit the caller's AVX2 and the loads would become
/// calls (7x slower, measured).
///
/// # Safety
/// AVX (inlined into an AVX2 caller) and tile rows p0..p0 + 8 of L floats at `src`, with
/// `lane0 + 8 <= L`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile_points<const L: usize>(
    src: *const f32,
    p0: usize,
    lane0: usize,
) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::{_mm256_loadu_ps, _mm256_setzero_ps};
    // SAFETY: AVX and the 8 rows are the caller's guarantee.
    unsafe {
        let mut points = [_mm256_setzero_ps(); 8];
        for (q, point) in points.iter_mut().enumerate() {
            *point = _mm256_loadu_ps(src.add((p0 + q) * L + lane0));
        }
        points
    }
}

/// Rows `first..first + lanes` of `part` (rows of `row` values), each cut to `cols`: the
/// output rows a tile is written back to. Lanes past `lanes` stay empty.
pub(super) fn lane_rows<T, const L: usize>(
    part: &mut [T],
    row: usize,
    first: usize,
    lanes: usize,
    cols: Range<usize>,
) -> [&mut [T]; L] {
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
pub(super) fn line_aligned_rows<const L: usize>(
    buf: &mut Vec<f32>,
    rows: usize,
) -> Result<&mut [[f32; L]]> {
    const LINE_FLOATS: usize = 64 / size_of::<f32>();
    *buf = scratch::filled(rows * L + LINE_FLOATS, 0.0, "the lane tiles of a task")?;
    let skip = buf.as_ptr().align_offset(64).min(LINE_FLOATS);
    Ok(buf[skip..skip + rows * L].as_chunks_mut::<L>().0)
}

#[cfg(test)]
#[cfg(target_arch = "x86_64")]
mod tests {
    use super::*;
    use half::f16;

    /// Has `write` fill L rows of nt values in a poisoned buffer (rows `gap` values apart, from
    /// `first` values past a line), and returns the rows with the 32 values
    /// before them and the gaps, as float32s.
    fn untranspose_into<T: Real, const L: usize>(
        nt: usize,
        first: usize,
        write: impl Fn(&mut [&mut [T]]),
    ) -> Vec<f32> {
        let gap = nt.next_multiple_of(32) + 32;
        let mut buf = vec![T::from_f32(-3.0); 96 + L * gap];
        // 32 values are 64 or 128 bytes: `line` starts on a line.
        let line = buf.as_ptr().align_offset(64) + 32;
        let mut rows: Vec<&mut [T]> =
            buf[line + first..].chunks_mut(gap).take(L).map(|r| &mut r[..nt]).collect();
        if first == 0 {
            assert!(
                rows.iter().all(|r| r.as_ptr().cast::<u8>().align_offset(64) == 0),
                "the streamed case's rows start on a line"
            );
        }
        write(&mut rows);
        buf[line - 32..line + L * gap].iter().map(|x| x.to_f32()).collect()
    }

    /// The AVX2 write-back compiled as the kernels compile it: inlined into a function with
    /// AVX2 and F16C (called from a test function without them, its intrinsics would be
    /// calls), then fenced as `fill_avx2` fences it.
    #[target_feature(enable = "avx2,f16c")]
    fn untranspose_avx2<T: Real, const L: usize>(
        avx2: Avx2,
        tile: &[[f32; L]],
        nt: usize,
        rows: &mut [&mut [T]],
        stream: bool,
    ) {
        avx2.untranspose(tile, nt, rows, stream);
        cache::stream_fence();
    }

    fn check<T: Real, const L: usize>(avx2: Avx2) {
        let mut next = crate::test_rng::xorshift(0x9E37_79B9_7F4A_7C15);
        for nt in [8, 31, 32, 64, 75, 128] {
            let tile: Vec<[f32; L]> = (0..nt)
                .map(|_| std::array::from_fn(|_| (next() % 10007) as f32 * 1.7e-4))
                .collect();
            for first in [0, 1] {
                let want = untranspose_into::<T, L>(nt, first, |rows| {
                    ScalarTranspose.untranspose(&tile, nt, rows, false)
                });
                for stream in [false, true] {
                    // SAFETY: an `Avx2` exists only when the CPU supports AVX2 and F16C.
                    let got = untranspose_into::<T, L>(nt, first, |rows| unsafe {
                        untranspose_avx2(avx2, &tile, nt, rows, stream)
                    });
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{} L {L} nt {nt} first {first} stream {stream}",
                        std::any::type_name::<T>()
                    );
                }
            }
        }
    }

    /// The AVX2 write-back, streamed (whole lines, non-temporal stores) or not, gives the
    /// portable one's values and touches nothing outside the rows: rows on a line (streamed
    /// from point 0) and off one (plain stores), tiles of whole and partial 32-point steps.
    #[test]
    fn streamed_write_back_matches_the_plain_one() {
        let Some(avx2) = Avx2::detect() else { return };
        check::<f32, 16>(avx2);
        check::<f32, 8>(avx2);
        check::<f16, 16>(avx2);
        check::<f16, 8>(avx2);
    }
}
