//! ThreeInterpolateBackward (docs/CONTRACT.md §3): the gradient of PointNet++
//! three_interpolate with respect to the source features,
//! `grad_features[b, c, indices[b, n, k]] += grad_output[b, c, n] * weights[b, n, k]`.
//!
//! Each task owns whole output rows (one batch, a block of channels), so no two tasks touch
//! the same accumulator. Inside a task, L channels (16; 8 when M rows of 16 would not fit a
//! quarter of L2; 8, 4 or 1 when C is small) are processed together: a tile of grad_output
//! is transposed to [n][lane] so each (n, k) term is one short vector multiply-add into
//! accumulator row `indices[b, n, k]` (kept as [m][lane], cache-resident for the seed sizes).
//! Every (c, j) accumulator sums its terms in (n, k) order, the order of the plain scatter
//! loop, in float32; float16 inputs are widened on load and rounded once on store. An output
//! of `cache::STREAM_MIN_BYTES` or more is written with non-temporal stores.

use super::lanes::{LaneKernel, Task, Transpose, lane_rows, line_aligned_rows, split};
use super::real::as_f32s;
use super::{Dims, Real, float_dtype, indices_error, indices_rule};
use super::{INDICES, WEIGHTS};
use crate::cache;
use crate::error::{Error, Result};
use crate::ops::operator::Operator;
use crate::ops::rules::{Broken, ValueRule};
use crate::parallel::Parallel;
use crate::schema::Attrs;
use crate::tensor::{DType, Element, Inputs, OutputSpec, Outputs};
use half::f16;

const GRAD_OUTPUT: usize = 0;

/// Channels accumulated together (one 64-byte accumulator row per source point).
const LANES: usize = 16;
/// Accumulator bytes (M rows of 16 lanes) up to which 16 lanes are kept, about a quarter of a
/// 1 MiB L2: from M 512 to 4096, where they leave L1, 8 lanes took 1.04-1.23x the time of 16
/// in 5 of 6 sets of paired rounds (1 thread; 0.86-0.89x in the sixth); at M 16384 about the
/// same (0.73-1.06x), so larger M keeps 8.
const ACC_BYTES: usize = 256 * 1024;
/// Lanes for 4 <= C < 8, and 1 below that: L <= C keeps a task's accumulators (L rows of
/// m) no larger than one batch's output, however large m is.
const FEW_LANES: usize = 4;
/// Points per transposed tile (seed case 7; float16 measured the same at 64 and 128).
const TILE: usize = 64;
/// Tiles ahead that the rows of grad_output are prefetched, into L2 (into L1: 1.04-1.28x the
/// time in paired rounds; 2 tiles ahead: 0.98-1.13x, 8 and 16 no faster).
const PREFETCH_AHEAD: usize = 4;

/// The configured node: `m` is the number of source points M.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreeInterpolateBackward {
    pub m: usize,
}

impl ThreeInterpolateBackward {
    /// Checks dtypes and shapes (not index values) and returns the sizes.
    fn dims(&self, inputs: &Inputs<'_>) -> Result<Dims> {
        match float_dtype(inputs, GRAD_OUTPUT)? {
            DType::F16 => self.dims_of::<f16>(inputs),
            _ => self.dims_of::<f32>(inputs),
        }
    }

    fn dims_of<T: Element>(&self, inputs: &Inputs<'_>) -> Result<Dims> {
        let go = inputs.shaped::<T>(GRAD_OUTPUT, &[None, None, None], "[B, C, N]")?;
        let (b, c, n) = (go[0], go[1], go[2]);
        if let Some(w) = inputs.dtype(WEIGHTS).filter(|&w| w != T::DTYPE) {
            return Err(inputs.error(
                WEIGHTS,
                format!(
                    "dtype {} differs from grad_output's {}: both must be the same T",
                    w.onnx_name(),
                    T::DTYPE.onnx_name()
                ),
            ));
        }
        let pattern = format!("[B, N, 3] = [{b}, {n}, 3] (B, N from grad_output)");
        inputs.shaped::<i32>(INDICES, &[Some(b), Some(n), Some(3)], &pattern)?;
        inputs.shaped::<T>(WEIGHTS, &[Some(b), Some(n), Some(3)], &pattern)?;
        let m = self.m;
        let numel = b.checked_mul(c).and_then(|x| x.checked_mul(m));
        let bytes = numel.and_then(|x| x.checked_mul(T::DTYPE.size()));
        if bytes.is_none_or(|x| x > isize::MAX as usize) {
            return Err(Error::output(
                "grad_features",
                format!("[B, C, m] = [{b}, {c}, {m}] is too large"),
            ));
        }
        Ok(Dims { b, c, n, m, dtype: T::DTYPE })
    }
}

impl Operator for ThreeInterpolateBackward {
    const NAME: &'static str = "ThreeInterpolateBackward";
    const SCHEMA: &'static str =
        include_str!("../../../schemas/three_interpolate/three_interpolate_backward.json");
    type Dims = Dims;
    type Found = ();

    fn from_attributes(attrs: &Attrs<'_>) -> Result<Self> {
        let m = attrs.int("m")?;
        let m = usize::try_from(m)
            .map_err(|_| Error::attribute("m", format!("must be >= 0, got {m}")))?;
        Ok(ThreeInterpolateBackward { m })
    }

    fn shape_rules(&self, inputs: &Inputs<'_>) -> Result<Dims> {
        self.dims(inputs)
    }

    /// grad_features [B, C, m].
    fn output_specs(&self, d: &Dims) -> Vec<OutputSpec> {
        vec![OutputSpec::new(d.dtype, [d.b, d.c, d.m])]
    }

    fn value_rules(&self, d: &Dims) -> Vec<ValueRule> {
        vec![indices_rule(d.m)]
    }

    fn describe(&self, inputs: &Inputs<'_>, d: &Dims, broken: &Broken) -> Error {
        indices_error(inputs, d.n, d.m, "m", broken)
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
        let d = self.dims(inputs)?;
        if d != dims {
            return Err(Error::Runtime(format!(
                "{}: inputs changed between plan and execute",
                Self::NAME
            )));
        }
        match d.dtype {
            DType::F16 => run::<f16>(self, &d, inputs, outputs, par),
            _ => run::<f32>(self, &d, inputs, outputs, par),
        }
    }
}

fn run<T: Real>(
    op: &ThreeInterpolateBackward,
    d: &Dims,
    inputs: &Inputs<'_>,
    outputs: &mut Outputs<'_>,
    par: &dyn Parallel,
) -> Result<()> {
    let go = inputs.get::<T>(GRAD_OUTPUT)?.data;
    let indices = inputs.get::<i32>(INDICES)?.data;
    let weights = inputs.get::<T>(WEIGHTS)?.data;
    let out = outputs.take::<T>(0)?;
    if out.len() != d.b * d.c * d.m {
        return Err(Error::output(
            "grad_features",
            format!("buffer holds {} elements, expected B*C*m", out.len()),
        ));
    }
    if out.is_empty() {
        return Ok(());
    }
    match d.c {
        c if c >= LANES && d.m * LANES * 4 <= ACC_BYTES => {
            split::<_, T, LANES>(op, d, go, indices, weights, out, par)
        }
        c if c >= 8 => split::<_, T, 8>(op, d, go, indices, weights, out, par),
        c if c >= FEW_LANES => split::<_, T, FEW_LANES>(op, d, go, indices, weights, out, par),
        _ => split::<_, T, 1>(op, d, go, indices, weights, out, par),
    }
}

impl LaneKernel for ThreeInterpolateBackward {
    /// 512-bit read-modify-writes of the accumulator rows were no faster: 1.0-1.2x the time
    /// (paired rounds, seed shapes, 1 and 2 threads).
    const AVX512: bool = false;
    fn row(&self, d: &Dims) -> usize {
        d.m
    }
    fn work(&self, d: &Dims) -> usize {
        d.n.saturating_mul(3).saturating_add(d.m)
    }
    /// Fills `part`, the output rows of batch `b` and `channels`, from that batch's indices and
    /// weights.
    #[inline(always)]
    fn fill<T: Real, const L: usize>(
        &self,
        task: &Task<'_, T>,
        part: &mut [T],
        tr: impl Transpose,
    ) -> Result<()> {
        let Task { d, input: go, b, ref channels, idx, w } = *task;
        let (n, m) = (d.n, d.m);
        let mut widened = Vec::new();
        let w = as_f32s(w, &mut widened)?;
        // The accumulators (m rows of L lanes) take memory in proportion to m, which only
        // the input's attribute bounds.
        let mut acc_buf = Vec::new();
        let acc = line_aligned_rows::<L>(&mut acc_buf, m)?;
        let mut tile_buf = Vec::new();
        let tile = line_aligned_rows::<L>(&mut tile_buf, TILE.min(n))?;
        let stream = self.streams::<T>(d);
        let mut c0 = channels.start;
        while c0 < channels.end {
            let lanes = L.min(channels.end - c0);
            acc.fill([0.0; L]);
            let mut n0 = 0;
            while n0 < n {
                let nt = TILE.min(n - n0);
                // Transpose grad_output[b, c0.., n0..n0+nt] into tile[n][lane]. Unused lanes keep
                // stale values; their accumulators are never stored.
                let mut rows: [&[T]; L] = [&[]; L];
                for (lane, dst) in rows.iter_mut().take(lanes).enumerate() {
                    let start = ((b * d.c + c0 + lane) * n) + n0;
                    // The L rows are L separate streams, more than the hardware prefetcher
                    // follows: ask for this row's next tiles now.
                    if let Some(ahead) = go.get(start + PREFETCH_AHEAD * TILE..) {
                        cache::prefetch_l2(&ahead[..TILE.min(ahead.len())]);
                    }
                    let Some(src) = go.get(start..start + nt) else { continue };
                    *dst = src;
                }
                tr.transpose(&rows[..lanes], nt, &mut tile[..nt]);
                let terms = n0 * 3..(n0 + nt) * 3;
                if let (Some(js), Some(ws)) = (idx.get(terms.clone()), w.get(terms)) {
                    accumulate(acc, &tile[..nt], js, ws);
                }
                n0 += nt;
            }
            let mut dst = lane_rows::<T, L>(part, m, c0 - channels.start, lanes, 0..m);
            tr.untranspose(acc, m, &mut dst[..lanes], stream);
            c0 += lanes;
        }
        Ok(())
    }
}

/// `acc[indices[n, k]] += tile[n] * weights[n, k]` for every n and k in order. Inlined so
/// the AVX2 build vectorises it with 8-wide registers.
#[inline(always)]
fn accumulate<const L: usize>(acc: &mut [[f32; L]], tile: &[[f32; L]], idx: &[i32], w: &[f32]) {
    for ((&g, js), ws) in tile.iter().zip(idx.chunks_exact(3)).zip(w.chunks_exact(3)) {
        for (&j, &wk) in js.iter().zip(ws) {
            // Indices were validated by `plan`; an out-of-range one is skipped, not a panic.
            let Some(a) = acc.get_mut(j as u32 as usize) else { continue };
            // Whole rows as values: the compiler need not fear that `a` aliases `g`, so the
            // lanes become one vector operation each.
            let mut row = *a;
            for (x, gl) in row.iter_mut().zip(g) {
                // Separate multiply and add (no FMA): the contract's rounding.
                *x += gl * wk;
            }
            *a = row;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::three_interpolate::lanes::{Avx2, ScalarTranspose, fill_avx2};

    /// The AVX2 build of the inner kernel (register transposes, 8-wide vectors) must give the
    /// same bits as the baseline build, for every lane count (the tests elsewhere run
    /// whichever one this CPU and shape select).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx2_and_baseline_builds_agree_bit_for_bit() {
        let Some(avx2) = Avx2::detect() else { return };
        let d = Dims { b: 1, c: 37, n: 301, m: 53, dtype: DType::F32 };
        let op = ThreeInterpolateBackward { m: d.m };
        let mut next = crate::test_rng::xorshift(0x9E37_79B9_7F4A_7C15);
        let go: Vec<f32> = (0..d.c * d.n).map(|_| (next() % 20001) as f32 * 1.3e-4 - 1.3).collect();
        let idx: Vec<i32> = (0..d.n * 3).map(|_| (next() % d.m as u64) as i32).collect();
        let w: Vec<f32> = (0..d.n * 3).map(|_| (next() % 1001) as f32 * 1e-3).collect();
        let mut base = vec![f32::NAN; d.c * d.m];
        let mut avx2_out = vec![f32::NAN; d.c * d.m];
        op.fill::<f32, LANES>(&Task::one_batch(&d, &go, &idx, &w), &mut base, ScalarTranspose)
            .unwrap();
        // SAFETY (each call below): an `Avx2` exists only when the CPU supports AVX2.
        unsafe {
            fill_avx2::<_, f32, LANES>(
                &op,
                &Task::one_batch(&d, &go, &idx, &w),
                &mut avx2_out,
                avx2,
            )
            .unwrap()
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&base), bits(&avx2_out));
        // 8 lanes (large M, or C < 16) and 4: the same sums in the same order, so the same bits.
        let mut eight = vec![f32::NAN; d.c * d.m];
        unsafe {
            fill_avx2::<_, f32, 8>(&op, &Task::one_batch(&d, &go, &idx, &w), &mut eight, avx2)
                .unwrap()
        };
        assert_eq!(bits(&base), bits(&eight));
        let mut four = vec![f32::NAN; d.c * d.m];
        op.fill::<f32, FEW_LANES>(&Task::one_batch(&d, &go, &idx, &w), &mut four, ScalarTranspose)
            .unwrap();
        assert_eq!(bits(&base), bits(&four));
        // float16: widened tiles, same rule.
        let d16 = Dims { dtype: DType::F16, ..d };
        let go16: Vec<f16> = go.iter().map(|&x| f16::from_f32(x)).collect();
        let w16: Vec<f16> = w.iter().map(|&x| f16::from_f32(x)).collect();
        let mut base16 = vec![f16::NAN; d.c * d.m];
        let mut avx2_16 = vec![f16::NAN; d.c * d.m];
        op.fill::<f16, LANES>(
            &Task::one_batch(&d16, &go16, &idx, &w16),
            &mut base16,
            ScalarTranspose,
        )
        .unwrap();
        unsafe {
            fill_avx2::<_, f16, LANES>(
                &op,
                &Task::one_batch(&d16, &go16, &idx, &w16),
                &mut avx2_16,
                avx2,
            )
            .unwrap()
        };
        let bits16 = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits16(&base16), bits16(&avx2_16));
        assert!(base16.iter().all(|x| x.is_finite()));
        assert!(base.iter().all(|x| x.is_finite()));
    }
}
