//! GetIndicePairs on Cambricon's MLU-OPS library (`mluOpGetIndicePairs`): 3-D, no transpose
//! or inverse, K <= 4096, L <= 1,000,000. The caller sizes out_indices as an upper bound and
//! reads the site count from the descriptor afterwards.

use super::{GetIndicePairs, GipDims, INDICES};
use crate::error::{Error, Result};
use crate::mlu::Direction;
use crate::mluops::{DType, Layout, Library, SparseConvParams};
use crate::ops::device::{CardRun, DeviceOutputs, MluOpsOperator};
use crate::ops::operator::Operator;

/// The library's scale limits (get_indice_pairs_structs.h at v1.4.0; docs/MLUOPS_BINDING.md).
const MAX_K: usize = 4096;
const MAX_L: usize = 1_000_000;

impl GetIndicePairs {
    fn params(&self) -> SparseConvParams {
        // mluops_supported declined any value beyond i32::MAX; the rules made them >= 0.
        let three = |a: [i64; 3]| a.map(|v| v as i32);
        SparseConvParams {
            batch: self.batch as i32,
            pad: three(self.pad),
            stride: three(self.stride),
            dilation: three(self.dilation),
            input: three(self.input_space),
            filter: three(self.filter_space),
            output: three(self.output_space),
            sub_m: i32::from(self.sub_m),
            transpose: i32::from(self.transpose),
            inverse: i32::from(self.inverse),
        }
    }

    /// out_indices' upper bound: every (site, offset) pair, or every output cell.
    fn site_bound(&self, l: usize, k: usize) -> usize {
        let cells = self
            .output_space
            .iter()
            .fold(self.batch as usize, |a, &d| a.saturating_mul(d as usize));
        l.saturating_mul(k).min(cells)
    }
}

impl MluOpsOperator for GetIndicePairs {
    fn mluops_supported(&self) -> Result<()> {
        if self.transpose {
            return Err(Error::declined(
                "transpose = 1: mluOpGetIndicePairs has no transposed convolution",
            ));
        }
        if self.sub_m {
            // A duplicate input site is an error of the contract in subm mode; the library
            // neither checks it nor reports a site count there.
            return Err(Error::declined(
                "subm = 1: the contract's duplicate-site error cannot be checked around mluOpGetIndicePairs",
            ));
        }
        if self.kernel_volume() > MAX_K {
            return Err(Error::declined(format!(
                "K = {} beyond MLU-OPS's {MAX_K}",
                self.kernel_volume()
            )));
        }
        let fields = [
            self.pad,
            self.stride,
            self.dilation,
            self.input_space,
            self.filter_space,
            self.output_space,
        ];
        if self.batch > i64::from(i32::MAX)
            || fields.iter().flatten().any(|&v| v > i64::from(i32::MAX))
        {
            return Err(Error::declined(
                "a descriptor value beyond int32: mluOpSetSparseConvolutionDescriptor takes ints",
            ));
        }
        // The library divides by a stride as a product with fl(1/s) and accepts a result
        // within 1e-6 of an integer: exact for powers of two, 3 and 5 at these sizes, not in
        // general (docs/MLUOPS_BINDING.md).
        if let Some(s) =
            self.stride.iter().find(|&&s| !(s as u64).is_power_of_two() && s != 3 && s != 5)
        {
            return Err(Error::declined(format!(
                "stride {s}: mluOpGetIndicePairs' float division is exact only for strides 2^k, 3 and 5"
            )));
        }
        // The library holds batch * output volume + 1 (its grid) and batch * input volume in
        // int (normal_get_indice_pairs.cpp:205-208 and 841 at v1.4.0).
        let volume = |space: [i64; 3]| space.iter().fold(self.batch as u128, |a, &v| a * v as u128);
        if volume(self.output_space) + 1 > i32::MAX as u128
            || volume(self.input_space) > i32::MAX as u128
        {
            return Err(Error::declined(
                "batch * output or input volume beyond int32: MLU-OPS computes its grid in int",
            ));
        }
        if self.input_space.iter().zip(&self.pad).any(|(&i, &p)| i + p >= 1 << 23) {
            return Err(Error::declined(
                "coordinates + padding of 2^23 or more: beyond the library's exact float arithmetic",
            ));
        }
        Ok(())
    }

    fn mluops_fits(&self, d: &GipDims) -> Result<()> {
        if d.l > MAX_L {
            return Err(Error::declined(format!("L = {} sites beyond MLU-OPS's {MAX_L}", d.l)));
        }
        let grid =
            self.input_space.iter().fold(self.batch as usize, |a, &v| a.saturating_mul(v as usize));
        if d.l > grid {
            return Err(Error::declined(format!(
                "L = {} rows beyond batch * input volume = {grid} (MLU-OPS takes no more)",
                d.l
            )));
        }
        let bound = self.site_bound(d.l, d.k);
        if bound.saturating_mul(4) > i32::MAX as usize {
            return Err(Error::declined(format!(
                "out_indices' bound of {bound} rows: MLU-OPS takes tensors below 2^31 elements"
            )));
        }
        Ok(())
    }

    fn mluops_compute(
        &self,
        d: &GipDims,
        lib: &Library,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let (l, k) = (d.l, d.k);
        let device = card.device;
        let specs = self.output_specs(d);
        let pairs = outputs.allocate(0, &specs[0])?;
        let num = outputs.allocate(2, &specs[2])?;
        if l == 0 {
            outputs.allocate(1, &specs[1])?;
            // SAFETY: `num` was just allocated for K int32.
            return unsafe { device.zero_raw(num, k * 4) };
        }
        // The contract's unused slots are -1 whatever the library leaves there: all bytes
        // 0xFF before the call.
        // SAFETY: `pairs` was just allocated for K*2*L int32.
        unsafe { device.fill_raw(pairs, 0xFF, k * 2 * l * 4)? };
        let bound = self.site_bound(l, k);
        let out_bound = outputs.workspace(bound * 16).map_err(|e| {
            Error::Declined(format!(
                "out_indices' upper bound of {bound} rows could not be allocated on the card: {e}"
            ))
        })?;
        let conv = lib.sparse_conv(&self.params())?;
        let indices = lib.tensor(Layout::Array, DType::Int32, &[l, 4])?;
        let pairs_d = lib.tensor(Layout::Array, DType::Int32, &[k, 2, l])?;
        let out_d = lib.tensor(Layout::Array, DType::Int32, &[bound, 4])?;
        let num_d = lib.tensor(Layout::Array, DType::Int32, &[k])?;
        lib.with_handle(card.queue, |h| {
            let mut size = 0usize;
            // SAFETY: live descriptors and a valid out-pointer.
            let s = unsafe {
                (lib.f.mluOpGetIndicePairsWorkspaceSize)(
                    h,
                    conv.ptr,
                    indices.ptr,
                    pairs_d.ptr,
                    out_d.ptr,
                    num_d.ptr,
                    &mut size,
                )
            };
            lib.check("mluOpGetIndicePairsWorkspaceSize", s)?;
            let workspace = outputs.workspace(size)?;
            // SAFETY: descriptors of the tensors at these card addresses, the workspace of the
            // size asked for. The library synchronises the queue itself to store num_act_out.
            let s = unsafe {
                (lib.f.mluOpGetIndicePairs)(
                    h,
                    conv.ptr,
                    indices.ptr,
                    card.input(INDICES),
                    workspace,
                    size,
                    pairs_d.ptr,
                    pairs,
                    out_d.ptr,
                    out_bound,
                    num_d.ptr,
                    num,
                )
            };
            lib.check("mluOpGetIndicePairs", s)
        })?;
        let num_out = conv.num_act_out()?;
        if num_out > bound {
            return Err(Error::Runtime(format!(
                "MLU-OPS reported {num_out} output sites, beyond the {bound} allocated"
            )));
        }
        // The library's count drops one site when every (site, offset) pair is valid but
        // sites repeat (normal_get_indice_pairs.cpp:1059-1061 at v1.4.0): such a node's
        // outputs are rewritten by the next path.
        if num_out < k * l {
            let mut counts = vec![0i32; k];
            // Whatever the library enqueued after its own synchronisation has finished.
            card.queue.sync()?;
            // SAFETY: `num` holds K int32 the library wrote.
            unsafe {
                device.copy_raw(
                    counts.as_mut_ptr().cast(),
                    num.cast_const(),
                    k * 4,
                    Direction::DeviceToHost,
                )?
            };
            let valid: usize = counts.iter().map(|&c| c.max(0) as usize).sum();
            if valid == k * l {
                return Err(Error::Declined(format!(
                    "every one of the K*L = {} pairs is valid and sites repeat: MLU-OPS's site count drops one there",
                    k * l
                )));
            }
        }
        let out = outputs.allocate(1, &Self::out_indices_spec(num_out))?;
        // The queue must hold nothing of the library's before the copy reads its output.
        card.queue.sync()?;
        // SAFETY: `out` holds num_out*4 int32; `out_bound` at least as many (bound >= num_out).
        unsafe {
            device.copy_raw(out, out_bound.cast_const(), num_out * 16, Direction::DeviceToDevice)
        }
    }
}
