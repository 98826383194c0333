//! ThreeInterpolate (PointNet++ feature propagation, mmcv three_interpolate; schemas/three_interpolate/three_interpolate.json):
//! `output[b, c, n] = f[i0] * w0 + f[i1] * w1 + f[i2] * w2` over the source row
//! `f = features[b, c, :]`, with `(i0, i1, i2) = indices[b, n, :]` and `(w0, w1, w2) = weights[b, n, :]`.
//!
//! Tasks own whole output rows (one batch, a block of channels). Inside a task, L channels
//! (16; 8, 4 or 1 when C is small) are computed together: their source rows are transposed
//! to a [m][lane] table (cache-resident), each point's three table rows are weighted and
//! summed as short vectors into a [n][lane] tile, and the tile is transposed back into the
//! output rows (an output of `cache::STREAM_MIN_BYTES` or more with non-temporal stores).
//! The op streams B*C*(M + N) values plus the batch's indices and weights once per channel
//! block. Every output is `(f[i0] * w0 + f[i1] * w1) + f[i2] * w2` in float32;
//! float16 is widened on load and rounded once on store. On the card: MLU-OPS only (mluops.rs).

use super::lanes::{LaneKernel, Task, Transpose, lane_rows, line_aligned_rows, split};
use super::real::as_f32s;
use super::{Dims, Real, float_dtype, indices_error, indices_rule};
use super::{INDICES, WEIGHTS};
use crate::error::{Error, Result};
use crate::ops::operator::Operator;
use crate::ops::rules::{Broken, ValueRule};
use crate::parallel::Parallel;
use crate::schema::Attrs;
use crate::tensor::{DType, Element, Inputs, OutputSpec, Outputs};
use half::f16;

const FEATURES: usize = 0;
/// Channels computed together (one 64-byte table row per source point).
const LANES: usize = 16;
/// Lanes for 4 <= C < 8, and 1 below that.
const FEW_LANES: usize = 4;
/// Points per output tile (8 KiB at 16 lanes): each output row is written 512 bytes at a
/// time (64 points: 5-10% slower at 1 thread in the bench's paired rounds; 256: no faster).
const TILE: usize = 128;

/// No attributes: M is the last dimension of `features`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ThreeInterpolate;

impl ThreeInterpolate {
    fn dims(inputs: &Inputs<'_>) -> Result<Dims> {
        match float_dtype(inputs, FEATURES)? {
            DType::F16 => Self::dims_of::<f16>(inputs),
            _ => Self::dims_of::<f32>(inputs),
        }
    }

    fn dims_of<T: Element>(inputs: &Inputs<'_>) -> Result<Dims> {
        let &[b, c, m] = inputs.shaped::<T>(FEATURES, &[None, None, None], "[B, C, M]")? else {
            unreachable!("rank checked")
        };
        if let Some(w) = inputs.dtype(WEIGHTS).filter(|&w| w != T::DTYPE) {
            return Err(inputs.error(
                WEIGHTS,
                format!(
                    "dtype {} differs from features' {}: both must be the same T",
                    w.onnx_name(),
                    T::DTYPE.onnx_name()
                ),
            ));
        }
        let n = inputs.shaped::<i32>(
            INDICES,
            &[Some(b), None, Some(3)],
            &format!("[B, N, 3] (B = {b} of features)"),
        )?[1];
        inputs.shaped::<T>(
            WEIGHTS,
            &[Some(b), Some(n), Some(3)],
            &format!("[B, N, 3] = [{b}, {n}, 3] (as indices)"),
        )?;
        let bytes = b
            .checked_mul(c)
            .and_then(|x| x.checked_mul(n))
            .and_then(|x| x.checked_mul(T::DTYPE.size()));
        if bytes.is_none_or(|x| x > isize::MAX as usize) {
            return Err(Error::output(
                "output",
                format!("[B, C, N] = [{b}, {c}, {n}] is too large"),
            ));
        }
        Ok(Dims { b, c, m, n, dtype: T::DTYPE })
    }
}

impl Operator for ThreeInterpolate {
    const NAME: &'static str = "ThreeInterpolate";
    const SCHEMA: &'static str =
        include_str!("../../../schemas/three_interpolate/three_interpolate.json");
    type Dims = Dims;
    type Found = ();

    fn from_attributes(_: &Attrs<'_>) -> Result<Self> {
        Ok(ThreeInterpolate)
    }

    fn shape_rules(&self, inputs: &Inputs<'_>) -> Result<Dims> {
        Self::dims(inputs)
    }

    /// output [B, C, N].
    fn output_specs(&self, d: &Dims) -> Vec<OutputSpec> {
        vec![OutputSpec::new(d.dtype, [d.b, d.c, d.n])]
    }

    fn value_rules(&self, d: &Dims) -> Vec<ValueRule> {
        vec![indices_rule(d.m)]
    }

    fn describe(&self, inputs: &Inputs<'_>, d: &Dims, broken: &Broken) -> Error {
        indices_error(inputs, d.n, d.m, "M", broken)
    }

    fn find(&self, _: &Inputs<'_>, _: &Dims, _: &dyn Parallel) -> Result<()> {
        Ok(())
    }

    fn execute(
        &self,
        dims: Dims,
        (): (),
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        par: &dyn Parallel,
    ) -> Result<()> {
        if Self::dims(inputs)? != dims {
            return Err(Error::Runtime(format!(
                "{}: inputs changed between plan and execute",
                Self::NAME
            )));
        }
        match dims.dtype {
            DType::F16 => run::<f16>(&dims, inputs, outputs, par),
            _ => run::<f32>(&dims, inputs, outputs, par),
        }
    }
}

fn run<T: Real>(
    d: &Dims,
    inputs: &Inputs<'_>,
    outputs: &mut Outputs<'_>,
    par: &dyn Parallel,
) -> Result<()> {
    let features = inputs.get::<T>(FEATURES)?.data;
    let indices = inputs.get::<i32>(INDICES)?.data;
    let weights = inputs.get::<T>(WEIGHTS)?.data;
    let out = outputs.take::<T>(0)?;
    if out.len() != d.b * d.c * d.n {
        return Err(Error::output(
            "output",
            format!("buffer holds {} elements, expected B*C*N", out.len()),
        ));
    }
    if out.is_empty() {
        return Ok(());
    }
    match d.c {
        c if c >= LANES => {
            split::<_, T, LANES>(&ThreeInterpolate, d, features, indices, weights, out, par)
        }
        c if c >= 8 => split::<_, T, 8>(&ThreeInterpolate, d, features, indices, weights, out, par),
        c if c >= FEW_LANES => {
            split::<_, T, FEW_LANES>(&ThreeInterpolate, d, features, indices, weights, out, par)
        }
        _ => split::<_, T, 1>(&ThreeInterpolate, d, features, indices, weights, out, par),
    }
}

impl LaneKernel for ThreeInterpolate {
    /// 16 lanes in one 512-bit register: 0.84-0.95x the time (paired rounds, seed shapes, 1
    /// thread; 2 threads 0.58-1.04x, noisy).
    const AVX512: bool = true;
    fn row(&self, d: &Dims) -> usize {
        d.n
    }
    fn work(&self, d: &Dims) -> usize {
        d.n
    }
    /// Fills `part`, the output rows of batch `b` and `channels`: L channels at a time, their
    /// source rows as a [m][lane] table, each point's three table rows weighted and summed into
    /// a [n][lane] tile, which is written back to the rows.
    #[inline(always)]
    fn fill<T: Real, const L: usize>(
        &self,
        task: &Task<'_, T>,
        part: &mut [T],
        tr: impl Transpose,
    ) -> Result<()> {
        let Task { d, input: features, b, ref channels, idx, w } = *task;
        let (n, m) = (d.n, d.m);
        let mut widened = Vec::new();
        let w = as_f32s(w, &mut widened)?;
        // The table (m rows of L lanes) takes memory in proportion to m, an input dimension.
        let mut table_buf = Vec::new();
        let table = line_aligned_rows::<L>(&mut table_buf, m)?;
        let mut tile_buf = Vec::new();
        let tile = line_aligned_rows::<L>(&mut tile_buf, TILE.min(n))?;
        let stream = self.streams::<T>(d);
        let mut c0 = channels.start;
        while c0 < channels.end {
            let lanes = L.min(channels.end - c0);
            // Unused lanes keep stale values; their outputs are never stored.
            let mut rows: [&[T]; L] = [&[]; L];
            for (lane, row) in rows.iter_mut().take(lanes).enumerate() {
                let start = (b * d.c + c0 + lane) * m;
                if let Some(src) = features.get(start..start + m) {
                    *row = src;
                }
            }
            tr.transpose(&rows[..lanes], m, table);
            let mut n0 = 0;
            while n0 < n {
                let nt = TILE.min(n - n0);
                let terms = n0 * 3..(n0 + nt) * 3;
                if let (Some(js), Some(ws)) = (idx.get(terms.clone()), w.get(terms)) {
                    interpolate(table, js, ws, &mut tile[..nt]);
                }
                let mut dst = lane_rows::<T, L>(part, n, c0 - channels.start, lanes, n0..n0 + nt);
                tr.untranspose(&tile[..nt], nt, &mut dst[..lanes], stream);
                n0 += nt;
            }
            c0 += lanes;
        }
        Ok(())
    }
}

/// `tile[n] = table[i0] * w0 + table[i1] * w1 + table[i2] * w2`, left to right, for each
/// point's indices and weights. Inlined so the AVX2 build vectorises it with 8-wide registers.
#[inline(always)]
fn interpolate<const L: usize>(table: &[[f32; L]], idx: &[i32], w: &[f32], tile: &mut [[f32; L]]) {
    for ((t, js), ws) in tile.iter_mut().zip(idx.chunks_exact(3)).zip(w.chunks_exact(3)) {
        // Indices were validated by `plan`; a point with an out-of-range one gets zeros, not
        // a panic. The rows by reference: copied out of an Option, as before, the kernel ran
        // 13-15% more instructions (callgrind, AVX2 build).
        let row = |k: usize| table.get(js[k] as u32 as usize);
        let (Some(a), Some(b), Some(c)) = (row(0), row(1), row(2)) else {
            *t = [0.0; L];
            continue;
        };
        let mut o = [0f32; L];
        for (l, x) in o.iter_mut().enumerate() {
            // Separate multiplies and adds (no FMA): the contract's rounding.
            *x = a[l] * ws[0] + b[l] * ws[1] + c[l] * ws[2];
        }
        *t = o;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::three_interpolate::lanes::ScalarTranspose;
    #[cfg(target_arch = "x86_64")]
    use crate::ops::three_interpolate::lanes::{Avx2, Avx512, fill_avx2, fill_avx512};

    /// The plain formula, in the contract's order, on widened values.
    fn plain(d: &Dims, f: &[f32], idx: &[i32], w: &[f32]) -> Vec<f32> {
        let mut out = vec![0f32; d.c * d.n];
        for c in 0..d.c {
            for n in 0..d.n {
                let v = |k: usize| f[c * d.m + idx[n * 3 + k] as usize] * w[n * 3 + k];
                out[c * d.n + n] = v(0) + v(1) + v(2);
            }
        }
        out
    }

    /// Every lane count and every build (scalar, AVX2 + F16C, AVX-512) gives the plain
    /// formula's bits, for float32 and float16, with M and N not multiples of the 8 x 8 blocks.
    #[test]
    fn every_build_and_lane_count_gives_the_plain_formulas_bits() {
        let mut next = crate::test_rng::xorshift(0x2545_F491_4F6C_DD1D);
        for (c, n, m) in [(37, 301, 53), (16, 64, 8), (5, 9, 3), (2, 130, 200)] {
            let d = Dims { b: 1, c, n, m, dtype: DType::F32 };
            let f: Vec<f32> = (0..c * m).map(|_| (next() % 20001) as f32 * 1.3e-4 - 1.3).collect();
            let idx: Vec<i32> = (0..n * 3).map(|_| (next() % m as u64) as i32).collect();
            let w: Vec<f32> = (0..n * 3).map(|_| (next() % 1001) as f32 * 1e-3).collect();
            let want: Vec<u32> = plain(&d, &f, &idx, &w).iter().map(|x| x.to_bits()).collect();
            let f16s: Vec<f16> = f.iter().map(|&x| f16::from_f32(x)).collect();
            let w16: Vec<f16> = w.iter().map(|&x| f16::from_f32(x)).collect();
            let want16: Vec<u16> = plain(
                &d,
                &f16s.iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
                &idx,
                &w16.iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
            )
            .iter()
            .map(|&x| f16::from_f32(x).to_bits())
            .collect();
            let check = |run: &dyn Fn(&mut [f32], &mut [f16])| {
                let (mut o32, mut o16) = (vec![f32::NAN; c * n], vec![f16::NAN; c * n]);
                run(&mut o32, &mut o16);
                assert_eq!(
                    o32.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    want,
                    "C {c} N {n} M {m}"
                );
                assert_eq!(
                    o16.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    want16,
                    "float16, C {c} N {n} M {m}"
                );
            };
            let d16 = Dims { dtype: DType::F16, ..d };
            macro_rules! lanes {
                ($l:literal) => {
                    check(&|o32, o16| {
                        ThreeInterpolate.fill::<f32, $l>(&Task::one_batch(&d, &f, &idx, &w), o32, ScalarTranspose).unwrap();
                        ThreeInterpolate.fill::<f16, $l>(&Task::one_batch(&d16, &f16s, &idx, &w16), o16, ScalarTranspose).unwrap();
                    });
                    #[cfg(target_arch = "x86_64")]
                    if let Some(avx2) = Avx2::detect() {
                        check(&|o32, o16| {
                            // SAFETY (both calls): an `Avx2` exists only when the CPU supports AVX2 and F16C.
                            unsafe { fill_avx2::<_, f32, $l>(&ThreeInterpolate, &Task::one_batch(&d, &f, &idx, &w), o32, avx2).unwrap() };
                            unsafe { fill_avx2::<_, f16, $l>(&ThreeInterpolate, &Task::one_batch(&d16, &f16s, &idx, &w16), o16, avx2).unwrap() };
                        });
                    }
                    #[cfg(target_arch = "x86_64")]
                    if let Some(avx512) = Avx512::detect() {
                        check(&|o32, o16| {
                            // SAFETY (both calls): an `Avx512` exists only when the CPU supports
                            // AVX-512F and VL besides AVX2 and F16C.
                            unsafe { fill_avx512::<_, f32, $l>(&ThreeInterpolate, &Task::one_batch(&d, &f, &idx, &w), o32, avx512).unwrap() };
                            unsafe { fill_avx512::<_, f16, $l>(&ThreeInterpolate, &Task::one_batch(&d16, &f16s, &idx, &w16), o16, avx512).unwrap() };
                        });
                    }
                };
            }
            lanes!(16);
            lanes!(8);
            lanes!(4);
            lanes!(1);
        }
    }
}
