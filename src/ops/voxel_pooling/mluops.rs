//! VoxelPoolingForward on Cambricon's MLU-OPS library (`mluOpVoxelPoolingForward`).

use super::forward::{Dims, VoxelPoolingForward};
use crate::error::{Error, Result};
use crate::mlu::DeviceInfo;
use crate::mluops::{DType, Layout, Library};
use crate::ops::device::{self, CardRun, DeviceOutputs, MluOpsOperator, StaticShapes};
use crate::ops::operator::Operator;

impl VoxelPoolingForward {
    /// The output [B, ny, nx, C] must stay below 2^31 elements, as every MLU-OPS tensor.
    fn mluops_output(&self, b: usize, c: usize) -> Result<()> {
        let out = b.saturating_mul(self.cells).saturating_mul(c);
        if out > i32::MAX as usize {
            return Err(Error::declined(format!(
                "output_features of {out} elements: MLU-OPS takes tensors below 2^31 elements"
            )));
        }
        Ok(())
    }
}

impl MluOpsOperator for VoxelPoolingForward {
    fn mluops_supported(&self) -> Result<()> {
        match [("x", self.nx), ("y", self.ny), ("z", self.nz)]
            .into_iter()
            .find(|&(_, n)| n > i32::MAX as usize)
        {
            Some((axis, n)) => Err(Error::declined(format!(
                "num_voxel_{axis} = {n} exceeds the library's int arguments"
            ))),
            None => Ok(()),
        }
    }

    fn mluops_supported_shapes(&self, _: &DeviceInfo, shapes: &StaticShapes) -> Result<()> {
        // input_features [B, N, C].
        match (device::static_dim(shapes, 1, 0), device::static_dim(shapes, 1, 2)) {
            (Some(b), Some(c)) => self.mluops_output(b, c),
            _ => Ok(()),
        }
    }

    fn mluops_fits(&self, dims: &Dims) -> Result<()> {
        // Every integer argument must be > 0: the library has no zero-element path.
        if dims.batches == 0 || dims.points == 0 || dims.channels == 0 {
            return Err(Error::declined(format!(
                "MLU-OPS takes no empty B, N or C (B = {}, N = {}, C = {})",
                dims.batches, dims.points, dims.channels
            )));
        }
        self.mluops_output(dims.batches, dims.channels)
    }

    fn mluops_compute(
        &self,
        dims: &Dims,
        lib: &Library,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let specs = self.output_specs(dims);
        let out = outputs.allocate(0, &specs[0])?;
        let pos = outputs.allocate(1, &specs[1])?;
        let (b, n, c) = (dims.batches, dims.points, dims.channels);
        let geom = lib.tensor(Layout::Array, DType::Int32, &[b, n, 3])?;
        let feats = lib.tensor(Layout::Array, DType::Float, &[b, n, c])?;
        let out_d = lib.tensor(Layout::Array, DType::Float, &[b, self.ny, self.nx, c])?;
        let pos_d = lib.tensor(Layout::Array, DType::Int32, &[b, n, 3])?;
        // mluops_fits bounds B*N*C and the grid by int32.
        let int = |v: usize| v as i32;
        lib.with_handle(card.queue, |h| {
            // SAFETY: descriptors of the node's tensors; card memory of those sizes.
            let s = unsafe {
                (lib.f.mluOpVoxelPoolingForward)(
                    h,
                    int(b),
                    int(n),
                    int(c),
                    int(self.nx),
                    int(self.ny),
                    int(self.nz),
                    geom.ptr,
                    card.input::<i32>(0).cast(),
                    feats.ptr,
                    card.input::<f32>(1).cast(),
                    out_d.ptr,
                    out,
                    pos_d.ptr,
                    pos,
                )
            };
            lib.check("mluOpVoxelPoolingForward", s)
        })
    }
}
