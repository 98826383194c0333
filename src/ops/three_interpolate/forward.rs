//! ThreeInterpolate (PointNet++ feature propagation, mmcv three_interpolate; schemas/three_interpolate/three_interpolate.json):
//! `output[b, c, n] = f[i0] * w0 + f[i1] * w1 + f[i2] * w2` over the source row
//! `f = features[b, c, :]`, with `(i0, i1, i2) = indices[b, n, :]` and `(w0, w1, w2) = weights[b, n, :]`.
//!
//! Tasks own whole output rows (b, c): each reads its source row (M values, cache-resident)
//! at random and writes its N outputs in order, so the op streams B*C*(M + N) values plus
//! the batch's indices and weights once per row block. On the card: MLU-OPS only (mluops.rs).

use crate::ops::Operator;
use super::{Dims, Real, float_dtype, indices_error, indices_rule};
use crate::ops::rules::{Broken, Rules, ValueRule, check_values};
use crate::error::{Error, Result};
use crate::parallel::{Parallel, for_each_part_mut};
use crate::schema::Attrs;
use crate::scratch;
use crate::tensor::{DType, Element, Inputs, OutputSpec, Outputs};
use half::f16;

const FEATURES: usize = 0;
const INDICES: usize = 1;
const WEIGHTS: usize = 2;
/// Output elements (each three multiply-adds) per task.
const GRAIN: usize = 32 * 1024;

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
        let &[b, c, m] = inputs.shaped::<T>(FEATURES, &[None, None, None], "[B, C, M]")? else { unreachable!("rank checked") };
        if let Some(w) = inputs.dtype(WEIGHTS).filter(|&w| w != T::DTYPE) {
            return Err(inputs.error(
                WEIGHTS,
                format!("dtype {} differs from features' {}: both must be the same T", w.onnx_name(), T::DTYPE.onnx_name()),
            ));
        }
        let n = inputs.shaped::<i32>(INDICES, &[Some(b), None, Some(3)], &format!("[B, N, 3] (B = {b} of features)"))?[1];
        inputs.shaped::<T>(WEIGHTS, &[Some(b), Some(n), Some(3)], &format!("[B, N, 3] = [{b}, {n}, 3] (as indices)"))?;
        let bytes = b.checked_mul(c).and_then(|x| x.checked_mul(n)).and_then(|x| x.checked_mul(T::DTYPE.size()));
        if bytes.is_none_or(|x| x > isize::MAX as usize) {
            return Err(Error::output("output", format!("[B, C, N] = [{b}, {c}, {n}] is too large")));
        }
        Ok(Dims { b, c, m, n, dtype: T::DTYPE })
    }
}

impl Operator for ThreeInterpolate {
    const NAME: &'static str = "ThreeInterpolate";
    const SCHEMA: &'static str = include_str!("../../../schemas/three_interpolate/three_interpolate.json");
    type Plan = Dims;

    fn from_attributes(_: &Attrs<'_>) -> Result<Self> {
        Ok(ThreeInterpolate)
    }

    fn plan(&self, inputs: &Inputs<'_>, _par: &dyn Parallel) -> Result<(Vec<OutputSpec>, Dims)> {
        let d = self.shape_rules(inputs)?;
        check_values(self, inputs, &d)?;
        Ok((vec![OutputSpec::new(d.dtype, [d.b, d.c, d.n])], d))
    }

    fn execute(&self, plan: Dims, inputs: &Inputs<'_>, outputs: &mut Outputs<'_>, par: &dyn Parallel) -> Result<()> {
        if Self::dims(inputs)? != plan {
            return Err(Error::Runtime(format!("{}: inputs changed between plan and execute", Self::NAME)));
        }
        match plan.dtype {
            DType::F16 => run::<f16>(&plan, inputs, outputs, par),
            _ => run::<f32>(&plan, inputs, outputs, par),
        }
    }
}

impl Rules for ThreeInterpolate {
    type Dims = Dims;

    fn shape_rules(&self, inputs: &Inputs<'_>) -> Result<Dims> {
        Self::dims(inputs)
    }

    fn value_rules(&self, d: &Dims) -> Vec<ValueRule> {
        vec![indices_rule(d.m)]
    }

    fn describe(&self, inputs: &Inputs<'_>, d: &Dims, broken: &Broken) -> Error {
        indices_error(inputs, d.n, d.m, "M", broken)
    }
}

fn run<T: Real>(d: &Dims, inputs: &Inputs<'_>, outputs: &mut Outputs<'_>, par: &dyn Parallel) -> Result<()> {
    let features = inputs.get::<T>(FEATURES)?.data;
    let indices = inputs.get::<i32>(INDICES)?.data;
    let weights = inputs.get::<T>(WEIGHTS)?.data;
    let out = outputs.take::<T>(0)?;
    if out.len() != d.b * d.c * d.n {
        return Err(Error::output("output", format!("buffer holds {} elements, expected B*C*N", out.len())));
    }
    if out.is_empty() {
        return Ok(());
    }
    // Whole rows per task, never across a batch (a task widens its batch's weights once).
    let rows = GRAIN.div_ceil(d.n).clamp(1, d.c);
    let per_batch = d.c.div_ceil(rows);
    let mut bounds =
        scratch::collect((0..d.b).flat_map(|b| (0..per_batch).map(move |t| (b * d.c + t * rows) * d.n)), "the task bounds")?;
    scratch::push(&mut bounds, out.len(), "the task bounds")?;
    for_each_part_mut(par, out, &bounds, |task, part| {
        let (b, first) = (task / per_batch, (task % per_batch) * rows);
        let idx = &indices[b * 3 * d.n..(b + 1) * 3 * d.n];
        let mut w = vec![0f32; 3 * d.n];
        T::widen(&weights[b * 3 * d.n..(b + 1) * 3 * d.n], &mut w);
        let mut src = vec![0f32; d.m];
        let mut dst = vec![0f32; d.n];
        for (r, out_row) in part.chunks_exact_mut(d.n).enumerate() {
            let row = (b * d.c + first + r) * d.m;
            let f: &[f32] = match T::as_f32(&features[row..row + d.m]) {
                Some(f) => f,
                None => {
                    T::widen(&features[row..row + d.m], &mut src);
                    &src
                }
            };
            for ((o, i), w) in dst.iter_mut().zip(idx.chunks_exact(3)).zip(w.chunks_exact(3)) {
                // plan checked every index is in [0, M).
                *o = f[i[0] as usize] * w[0] + f[i[1] as usize] * w[1] + f[i[2] as usize] * w[2];
            }
            T::narrow(&dst, out_row);
        }
    });
    Ok(())
}
