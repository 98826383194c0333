//! ThreeInterpolate and ThreeInterpolateBackward on Cambricon's MLU-OPS library
//! (`mluOpThreeInterpolateForward` / `Backward`). Both take float32 only: the library computes
//! float16 in float16 (three_interpolate_union1.mlu at v1.4.0), the contract in float32.

use super::backward::{Dims, ThreeInterpolateBackward};
use super::forward::{self, ThreeInterpolate};
use crate::error::Result;
use crate::mluops::{self, Layout, Library};
use crate::ops::device::{Card, DeviceOutputs, MluOpsOperator};
use crate::tensor::{DType, OutputSpec};
use std::ffi::c_void;

/// The library's rules shared by both directions: float32, and every tensor below 2^31
/// elements (three_interpolate.cpp:330-337 at v1.4.0).
fn fits(dtype: DType, b: usize, c: usize, m: usize, n: usize, name: &str) -> std::result::Result<(), String> {
    if dtype == DType::F16 {
        return Err(format!("float16: mluOpThreeInterpolate{name} computes in float16, the contract in float32"));
    }
    let sizes = [b.saturating_mul(c).saturating_mul(n), b.saturating_mul(c).saturating_mul(m), b.saturating_mul(n).saturating_mul(3)];
    if sizes.iter().any(|&v| v > i32::MAX as usize) {
        return Err(format!("[B, C, N] = [{b}, {c}, {n}], M = {m}: MLU-OPS takes tensors below 2^31 elements"));
    }
    Ok(())
}

impl MluOpsOperator for ThreeInterpolateBackward {
    fn mluops_supported(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    fn mluops_fits(&self, d: &Dims) -> std::result::Result<(), String> {
        fits(d.dtype, d.b, d.c, d.m, d.n, "Backward")
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

impl MluOpsOperator for ThreeInterpolate {
    fn mluops_supported(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    fn mluops_fits(&self, d: &forward::Dims) -> std::result::Result<(), String> {
        fits(d.dtype, d.b, d.c, d.m, d.n, "Forward")
    }

    fn mluops_compute(&self, d: &forward::Dims, lib: &Library, card: &Card<'_>, outputs: &mut dyn DeviceOutputs) -> Result<()> {
        let out = outputs.allocate(0, &OutputSpec::new(d.dtype, [d.b, d.c, d.n]))?;
        // An empty output is BAD_PARAM there and nothing to write here; M = 0 with N > 0 is
        // a broken value rule, reported before this runs.
        if d.b * d.c * d.n == 0 {
            return Ok(());
        }
        let t = mluops::DType::Float;
        let f = lib.tensor(Layout::Array, t, &[d.b, d.c, d.m])?;
        let idx = lib.tensor(Layout::Array, mluops::DType::Int32, &[d.b, d.n, 3])?;
        let w = lib.tensor(Layout::Array, t, &[d.b, d.n, 3])?;
        let o = lib.tensor(Layout::Array, t, &[d.b, d.c, d.n])?;
        lib.with_handle(card.queue, |h| {
            // SAFETY: descriptors of the node's tensors; card memory of those sizes.
            let s = unsafe {
                (lib.f.mluOpThreeInterpolateForward)(
                    h, f.ptr, card.input::<c_void>(0), idx.ptr, card.input::<c_void>(1), w.ptr, card.input::<c_void>(2), o.ptr, out,
                )
            };
            lib.check("mluOpThreeInterpolateForward", s)
        })
    }
}
