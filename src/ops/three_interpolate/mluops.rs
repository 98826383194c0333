//! ThreeInterpolate and ThreeInterpolateBackward on Cambricon's MLU-OPS library
//! (`mluOpThreeInterpolateForward` / `Backward`). Both take float32 only: the library computes
//! float16 in float16 (three_interpolate_union1.mlu at v1.4.0), the contract in float32.

use super::backward::ThreeInterpolateBackward;
use super::{Dims, ThreeInterpolate};
use crate::error::{Error, Result};
use crate::mlu::DeviceInfo;
use crate::mluops::{self, Functions, Layout, Library, Status, TensorDescPtr};
use crate::ops::device::{self, CardRun, DeviceOutputs, MluOpsOperator, StaticShapes};
use crate::ops::operator::Operator;
use crate::tensor::DType;
use std::ffi::c_void;

/// The library's rules shared by both directions: float32, and every tensor below 2^31
/// elements (three_interpolate.cpp:330-337 at v1.4.0).
fn fits(d: &Dims, name: &str) -> Result<()> {
    if d.dtype == DType::F16 {
        return Err(Error::declined(format!(
            "float16: mluOpThreeInterpolate{name} computes in float16, the contract in float32"
        )));
    }
    below_2_31(d.b, d.c, d.n, d.m)
}

/// The size rule of [`fits`], also applied at claim time when B, C, N and M are static.
fn below_2_31(b: usize, c: usize, n: usize, m: usize) -> Result<()> {
    let sizes = [
        b.saturating_mul(c).saturating_mul(n),
        b.saturating_mul(c).saturating_mul(m),
        b.saturating_mul(n).saturating_mul(3),
    ];
    if sizes.iter().any(|&v| v > i32::MAX as usize) {
        return Err(Error::declined(format!(
            "[B, C, N] = [{b}, {c}, {n}], M = {m}: MLU-OPS takes tensors below 2^31 elements"
        )));
    }
    Ok(())
}

/// The C type both directions share: the handle, three float32 inputs (the first [B, C, x],
/// then indices and weights [B, N, 3]) and the float32 output [B, C, y].
type Call = unsafe extern "C" fn(
    mluops::HandlePtr,
    TensorDescPtr,
    *const c_void,
    TensorDescPtr,
    *const c_void,
    TensorDescPtr,
    *const c_void,
    TensorDescPtr,
    *mut c_void,
) -> Status;

/// Calls `name` (`call` of `lib.f`) with the node's inputs 0-2, the first [B, C, `first`] and
/// the output [B, C, `last`] at `out`.
fn call(
    lib: &Library,
    card: &CardRun<'_>,
    name: &str,
    call: fn(&Functions) -> Call,
    d: &Dims,
    [first, last]: [usize; 2],
    out: *mut c_void,
) -> Result<()> {
    let t = mluops::DType::Float;
    let x = lib.tensor(Layout::Array, t, &[d.b, d.c, first])?;
    let idx = lib.tensor(Layout::Array, mluops::DType::Int32, &[d.b, d.n, 3])?;
    let w = lib.tensor(Layout::Array, t, &[d.b, d.n, 3])?;
    let y = lib.tensor(Layout::Array, t, &[d.b, d.c, last])?;
    lib.with_handle(card.queue, |h| {
        // SAFETY: descriptors of the node's tensors; card memory of those sizes.
        let s = unsafe {
            call(&lib.f)(
                h,
                x.ptr,
                card.input::<c_void>(0),
                idx.ptr,
                card.input::<c_void>(1),
                w.ptr,
                card.input::<c_void>(2),
                y.ptr,
                out,
            )
        };
        lib.check(name, s)
    })
}

impl MluOpsOperator for ThreeInterpolateBackward {
    fn mluops_supported(&self) -> Result<()> {
        Ok(())
    }

    fn mluops_supported_shapes(&self, _: &DeviceInfo, shapes: &StaticShapes) -> Result<()> {
        // grad_output [B, C, N]; M the attribute.
        let dim = |axis| device::static_dim(shapes, 0, axis);
        match (dim(0), dim(1), dim(2)) {
            (Some(b), Some(c), Some(n)) => below_2_31(b, c, n, self.m),
            _ => Ok(()),
        }
    }

    fn mluops_fits(&self, d: &Dims) -> Result<()> {
        fits(d, "Backward")
    }

    fn mluops_compute(
        &self,
        d: &Dims,
        lib: &Library,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let out = outputs.allocate(0, &self.output_specs(d)[0])?;
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
        call(
            lib,
            card,
            "mluOpThreeInterpolateBackward",
            |f| f.mluOpThreeInterpolateBackward,
            d,
            [d.n, d.m],
            out,
        )
    }
}

impl MluOpsOperator for ThreeInterpolate {
    fn mluops_supported(&self) -> Result<()> {
        Ok(())
    }

    fn mluops_supported_shapes(&self, _: &DeviceInfo, shapes: &StaticShapes) -> Result<()> {
        // features [B, C, M], indices [B, N, 3].
        let dim = |input, axis| device::static_dim(shapes, input, axis);
        match (dim(0, 0), dim(0, 1), dim(1, 1), dim(0, 2)) {
            (Some(b), Some(c), Some(n), Some(m)) => below_2_31(b, c, n, m),
            _ => Ok(()),
        }
    }

    fn mluops_fits(&self, d: &Dims) -> Result<()> {
        fits(d, "Forward")
    }

    fn mluops_compute(
        &self,
        d: &Dims,
        lib: &Library,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let out = outputs.allocate(0, &self.output_specs(d)[0])?;
        // An empty output is BAD_PARAM there and nothing to write here; M = 0 with N > 0 is
        // a broken value rule, reported before this runs.
        if d.b * d.c * d.n == 0 {
            return Ok(());
        }
        call(
            lib,
            card,
            "mluOpThreeInterpolateForward",
            |f| f.mluOpThreeInterpolateForward,
            d,
            [d.m, d.n],
            out,
        )
    }
}
