//! ThreeInterpolateBackward on Cambricon's MLU-OPS library (`mluOpThreeInterpolateBackward`).

use super::backward::{Dims, ThreeInterpolateBackward};
use crate::error::Result;
use crate::mluops::{self, Layout, Library};
use crate::ops::device::{Card, DeviceOutputs, MluOpsOperator};
use crate::tensor::{DType, OutputSpec};
use std::ffi::c_void;

impl MluOpsOperator for ThreeInterpolateBackward {
    fn mluops_supported(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    fn mluops_fits(&self, d: &Dims) -> std::result::Result<(), String> {
        if d.dtype == DType::F16 {
            // The contract accumulates in float32; the library sums float16 in float16.
            return Err("float16: mluOpThreeInterpolateBackward accumulates in float16".into());
        }
        if [d.b * d.c * d.n, d.b * d.c * d.m, d.b * d.n * 3].iter().any(|&v| v > i32::MAX as usize) {
            return Err(format!("[B, C, N] = [{}, {}, {}], M = {}: MLU-OPS takes tensors below 2^31 elements", d.b, d.c, d.n, d.m));
        }
        Ok(())
    }

    fn mluops_compute(&self, d: &Dims, lib: &Library, card: &Card<'_>, outputs: &mut dyn DeviceOutputs) -> Result<()> {
        let out = outputs.allocate(0, &OutputSpec::new(d.dtype, [d.b, d.c, d.m]))?;
        if d.b * d.c * d.m == 0 {
            return Ok(());
        }
        // Empty grad_output, indices or weights are BAD_PARAM there: the contract's answer
        // is then all zeros, written here.
        // SAFETY: `out` was just allocated for B*C*M elements of d.dtype.
        unsafe { card.device.zero_raw(out, d.b * d.c * d.m * d.dtype.size())? };
        if d.n == 0 {
            return Ok(());
        }
        let t = mluops::DType::Float;
        let go = lib.tensor(Layout::Array, t, &[d.b, d.c, d.n])?;
        let idx = lib.tensor(Layout::Array, mluops::DType::Int32, &[d.b, d.n, 3])?;
        let w = lib.tensor(Layout::Array, t, &[d.b, d.n, 3])?;
        let gf = lib.tensor(Layout::Array, t, &[d.b, d.c, d.m])?;
        lib.with_handle(card.queue, |h| {
            // SAFETY: descriptors of the node's tensors; card memory of those sizes.
            let s = unsafe {
                (lib.f.mluOpThreeInterpolateBackward)(
                    h, go.ptr, card.input::<c_void>(0), idx.ptr, card.input::<c_void>(1), w.ptr, card.input::<c_void>(2), gf.ptr, out,
                )
            };
            lib.check("mluOpThreeInterpolateBackward", s)
        })
    }
}
