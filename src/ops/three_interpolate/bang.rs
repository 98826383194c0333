//! ThreeInterpolateBackward on the MLU: host policy for kernels/three_interpolate.
//!
//! UNION1 over the card's cores, B * ceil(M / Mo) (batch, M-tile) units split evenly
//!. NRAM: the Mo x Co accumulator (twice: transposed and stored layouts)
//! is fixed first, then the N tile No takes everything left, as the seed gives N priority.

use super::Dims;
use super::backward::ThreeInterpolateBackward;
use crate::error::{Error, Result};
use crate::mlu::{self, NRAM_BUDGET, TASK_UNION1};
use crate::ops::device::{self, BangOperator, CardRun, DeviceOutputs};
use crate::ops::operator::Operator;
use crate::tensor::DType;
use std::ffi::c_void;

/// Largest channel tile (floats; a multiple of 32 keeps rows whole 128-byte vectors).
const MAX_CO: usize = 128;
/// Largest M tile (a multiple of 16 keeps the transposes' 64-byte rule).
const MAX_MO: usize = 256;
/// No is a multiple of this (3 * No float16 weights are whole 128-byte vectors).
const NO_STEP: usize = 64;
/// Tiles carved, each rounded up to 64 bytes.
const TILES: usize = 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub task_dim: u32,
    pub mo: usize,
    pub no: usize,
    pub co: usize,
}

impl Policy {
    pub fn new(info: &mlu::DeviceInfo, d: &Dims) -> Self {
        let half = d.dtype == DType::F16;
        let co = d.c.next_multiple_of(32).clamp(32, MAX_CO);
        let mo = d.m.next_multiple_of(16).clamp(16, MAX_MO);
        // accT + acc in float32 (+ the float16 copy) and the product row.
        let fixed = 8 * mo * co + if half { 2 * mo * co } else { 0 } + 4 * co + TILES * 64;
        // Per point of the N tile: indices, weights (+ widened), grad_output (+ widened), transposed.
        let per_n =
            if half { 12 + 6 + 12 + 2 * co + 4 * co + 4 * co } else { 12 + 12 + 4 * co + 4 * co };
        let fit = (NRAM_BUDGET - fixed) / per_n / NO_STEP * NO_STEP;
        let no = fit.min(d.n.next_multiple_of(NO_STEP)).max(NO_STEP);
        let units = d.b * d.m.div_ceil(mo);
        Policy { task_dim: mlu::union1_tasks(info, units), mo, no, co }
    }
}

/// The kernel's arguments (`bang_launch`).
pub struct Launch {
    task_dim: u32,
    /// B, C, N, M, then Mo, No, Co.
    sizes: [i32; 7],
}

impl BangOperator for ThreeInterpolateBackward {
    type Launch = Launch;
    const BANG_FAMILIES: &'static [&'static str] = &["check", "three_interpolate"];

    fn bang_supported_shapes(
        &self,
        _: &mlu::DeviceInfo,
        shapes: &device::StaticShapes,
    ) -> Result<()> {
        // grad_output [B, C, N] -> output B * C * m.
        device::int32_output(shapes, 0, [0, 1], self.m, "B*C*m")
    }

    fn bang_launch(&self, info: &mlu::DeviceInfo, d: &Dims) -> Result<Launch> {
        // The kernel's offsets are int32 products of these sizes.
        if [d.b * d.c * d.n, d.b * d.c * d.m, d.b * d.n * 3].iter().any(|&v| v > i32::MAX as usize)
        {
            return Err(Error::declined(format!(
                "[B, C, N] = [{}, {}, {}], M = {}: too large for the MLU kernel's int32 offsets",
                d.b, d.c, d.n, d.m
            )));
        }
        // BANG's __memcpy takes int byte strides (mlu-ops v1.4.0 three_interpolate_union1.mlu:
        // 344-356 checks them and copies otherwise beyond): the grad_output and grad_features
        // tiles are copied with GDRAM row strides of N and M elements (three_interpolate.mlu).
        // Larger shapes run on CPU.
        let elem = d.dtype.size();
        if let Some((name, v)) =
            [("N", d.n), ("M", d.m)].into_iter().find(|&(_, v)| v * elem > i32::MAX as usize)
        {
            return Err(Error::declined(format!(
                "{name} = {v}: its row stride of {} bytes exceeds the MLU copies' int32 byte strides",
                v * elem
            )));
        }
        let p = Policy::new(info, d);
        let n = device::narrow;
        let sizes = [
            n("B", d.b)?,
            n("C", d.c)?,
            n("N", d.n)?,
            n("M", d.m)?,
            n("Mo", p.mo)?,
            n("No", p.no)?,
            n("Co", p.co)?,
        ];
        Ok(Launch { task_dim: p.task_dim, sizes })
    }

    // Out-of-range indices need no gate: the kernel adds only indices inside its M tile.
    fn bang_compute(
        &self,
        d: &Dims,
        l: &Launch,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let out = outputs.allocate(0, &self.output_specs(d)[0])?;
        if d.b * d.c * d.m == 0 {
            return Ok(());
        }
        let [b, c, n, m, mo, no, co] = l.sizes;
        let (go, idx, w) = (card.input::<c_void>(0), card.input::<i32>(1), card.input::<c_void>(2));
        let k = card.device.kernels::<super::abi::ThreeInterpolateKernels>()?;
        // SAFETY: device buffers of the validated shapes; the launch only enqueues.
        card.queue.launch("bang_three_interpolate_backward", |q| unsafe {
            if d.dtype == DType::F16 {
                (k.bang_three_interpolate_backward_f16)(
                    q,
                    l.task_dim,
                    TASK_UNION1,
                    b,
                    c,
                    n,
                    m,
                    mo,
                    no,
                    co,
                    go.cast(),
                    idx,
                    w.cast(),
                    out.cast(),
                )
            } else {
                (k.bang_three_interpolate_backward_f32)(
                    q,
                    l.task_dim,
                    TASK_UNION1,
                    b,
                    c,
                    n,
                    m,
                    mo,
                    no,
                    co,
                    go.cast(),
                    idx,
                    w.cast(),
                    out.cast(),
                )
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shapes whose GDRAM row stride in bytes reaches 2^31 are declined (the node runs on CPU),
    /// though their element counts fit int32; one element less is taken. (A float16 N stride
    /// cannot reach 2^31 bytes: 3 * N indices must fit int32 first.)
    #[test]
    fn byte_strides_of_2_31_or_more_are_declined() {
        let op = ThreeInterpolateBackward { m: 16 };
        let info = mlu::emulator::info().expect("the emulated card's description");
        let fits = |n: usize, m: usize, dtype| {
            op.bang_launch(&info, &Dims { b: 1, c: 1, n, m, dtype }).map(|_| ())
        };
        for (n, m, dtype) in
            [(1usize << 29, 16, DType::F32), (16, 1 << 29, DType::F32), (16, 1 << 30, DType::F16)]
        {
            assert_eq!(
                fits(n - usize::from(n > 16), m - usize::from(m > 16), dtype),
                Ok(()),
                "{n} {m} {dtype:?}"
            );
            let err = fits(n, m, dtype).expect_err("a row stride of 2^31 bytes").to_string();
            assert!(err.contains("2147483648 bytes"), "{n} {m} {dtype:?}: {err}");
        }
    }
}
