//! DynamicScatterBackward on Cambricon's MLU-OPS library
//! (`mluOpDynamicPointToVoxelBackward`, max reduction only).

use super::Reduce;
use super::backward::{Dims, DynamicScatterBackward};
use crate::error::{Error, Result};
use crate::mlu::DeviceInfo;
use crate::mluops::{DType, Layout, Library, ReduceMode};
use crate::ops::device::{self, CardRun, DeviceOutputs, MluOpsOperator, StaticShapes};
use crate::ops::operator::Operator;
use std::ffi::c_void;

/// The library's NRAM bound, 5N + 20C + 4 bytes of `nram` (BAD_PARAM beyond it;
/// docs/MLUOPS_BINDING.md, DynamicPointToVoxelBackward rule 10).
fn nram_bound(n: usize, c: usize, nram: usize) -> Result<()> {
    if n.saturating_mul(5).saturating_add(c.saturating_mul(20)).saturating_add(4) > nram {
        return Err(Error::declined(format!(
            "N = {n}, C = {c}: beyond MLU-OPS's NRAM bound 5N + 20C + 4 <= {nram}"
        )));
    }
    Ok(())
}

impl MluOpsOperator for DynamicScatterBackward {
    fn mluops_supported(&self) -> Result<()> {
        match self.reduce {
            Reduce::Max => Ok(()),
            _ => Err(Error::declined(
                "reduce_type mean/sum: mluOpDynamicPointToVoxelBackward implements max only",
            )),
        }
    }

    fn mluops_supported_shapes(&self, info: &DeviceInfo, shapes: &StaticShapes) -> Result<()> {
        // feats [N, C]: a static C alone can exceed the bound (N >= 0); a symbolic N counts 0.
        match device::static_dim(shapes, 1, 1) {
            Some(c) => {
                nram_bound(device::static_dim(shapes, 1, 0).unwrap_or(0), c, info.kernel_nram())
            }
            None => Ok(()),
        }
    }

    fn mluops_fits(&self, d: &Dims) -> Result<()> {
        if d.n < d.m {
            return Err(Error::declined(format!(
                "N = {} points < M = {} voxels: MLU-OPS requires N >= M",
                d.n, d.m
            )));
        }
        Ok(())
    }

    fn mluops_compute(
        &self,
        d: &Dims,
        lib: &Library,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        nram_bound(d.n, d.c, card.device.info.kernel_nram())?;
        let out = outputs.allocate(0, &self.output_specs(d)[0])?;
        // SAFETY: `out` was just allocated for N*C floats.
        unsafe { card.device.zero_raw(out, d.n * d.c * 4)? };
        if d.n * d.c == 0 || d.v == 0 {
            return Ok(());
        }
        // voxel_num: the optional input, or V = M written to the card.
        let voxel_num: *const c_void = if card.input::<c_void>(5).is_null() {
            let v: *mut i32 = outputs.workspace(4)?.cast();
            let value = [i32::try_from(d.v)
                .map_err(|_| Error::Declined(format!("V = {} beyond int32", d.v)))?];
            // SAFETY: `v` was just allocated for one int32.
            unsafe {
                card.device.copy_raw(
                    v.cast(),
                    value.as_ptr().cast(),
                    4,
                    crate::mlu::Direction::HostToDevice,
                )?
            };
            v.cast_const().cast()
        } else {
            card.input::<c_void>(5)
        };
        let gv = lib.tensor(Layout::Array, DType::Float, &[d.m, d.c])?;
        let f = lib.tensor(Layout::Array, DType::Float, &[d.n, d.c])?;
        let vf = lib.tensor(Layout::Array, DType::Float, &[d.m, d.c])?;
        let map = lib.tensor(Layout::Array, DType::Int32, &[d.n])?;
        let count = lib.tensor(Layout::Array, DType::Int32, &[d.m])?;
        let num = lib.tensor(Layout::Array, DType::Int32, &[1])?;
        let gf = lib.tensor(Layout::Array, DType::Float, &[d.n, d.c])?;
        let max = ReduceMode::Max;
        lib.with_handle(card.queue, |h| {
            let mut size = 0usize;
            // SAFETY: descriptors of the node's tensors and a valid out-pointer.
            let s = unsafe {
                (lib.f.mluOpGetDynamicPointToVoxelBackwardWorkspaceSize)(
                    h, max, gv.ptr, f.ptr, vf.ptr, map.ptr, count.ptr, num.ptr, &mut size,
                )
            };
            lib.check("mluOpGetDynamicPointToVoxelBackwardWorkspaceSize", s)?;
            let workspace = outputs.workspace(size)?;
            // SAFETY: descriptors of the node's tensors; card memory of those sizes; the
            // workspace of the size the library asked for.
            let s = unsafe {
                (lib.f.mluOpDynamicPointToVoxelBackward)(
                    h,
                    max,
                    gv.ptr,
                    card.input(0),
                    f.ptr,
                    card.input(1),
                    vf.ptr,
                    card.input(2),
                    map.ptr,
                    card.input(3),
                    count.ptr,
                    card.input(4),
                    num.ptr,
                    voxel_num,
                    workspace,
                    size,
                    gf.ptr,
                    out,
                )
            };
            lib.check("mluOpDynamicPointToVoxelBackward", s)
        })
    }
}
