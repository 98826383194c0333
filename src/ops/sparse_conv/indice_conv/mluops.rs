//! IndiceConv on Cambricon's MLU-OPS library (`mluOpIndiceConvolutionForward`: per kernel
//! offset a gather, a float32 GEMM and a ScatterNd into a zero-filled output, added offset by
//! offset; indice_convolution_forward.cpp at v1.4.0). What the contract needs around it:
//! - the library adds each offset's products with ScatterNd in UPDATE mode (:482), so a
//!   destination repeated within one offset keeps one contribution, where the contract sums
//!   them (GetIndicePairs makes such rulebooks from duplicate input rows). Before the call
//!   each offset's destinations are marked in a bitmap and counted (GetIndicePairs' mark and
//!   rank kernels, kernels/sparse_conv): fewer distinct than indice_num[k] declines the node;
//! - it has no bias and no epilogue: kernels/sparse_conv's epilogue step adds the bias to the
//!   library's output, so the bias comes last in each sum rather than first (the
//!   accumulating class allows the other order), then applies scale, shift, residual and
//!   the activation in the contract's order, one float32 operation each, in the same pass
//!   over the output (so the activations never leave the card between the convolution and
//!   its BatchNorm, ReLU and residual Add);
//! - no inverse (NOT_SUPPORTED, :73-77), indice_pairs' last dimension P equal to features'
//!   rows L (:146), P <= 1,000,000 (:95-100), every tensor below 2^31 elements (:118-125),
//!   indice_num as a host int64 array (read on the host by the shape rules anyway).
//!
//! Filters go as ARRAY [K, 1, 1, Cin, Cout]: the library reads an ARRAY filter as
//! [kd, kh, kw, Cin, Cout] with no transpose (:132-136, 180-186), which is the contract's
//! [K, Cin, Cout]. The empty cases (L, Cin or every indice_num 0) are written here without a
//! call: the library returns without writing its output there.

use super::{
    Activation, BIAS, ConvDims, FEATURES, FILTERS, IndiceConv, PAIRS, RESIDUAL, SCALE, SHIFT,
};
use crate::error::{Error, Result};
use crate::mlu::{DeviceInfo, Direction, NRAM_BUDGET, TASK_UNION1};
use crate::mluops::{DType, Layout, Library};
use crate::ops::device::{self, CardRun, DeviceOutputs, MluOpsOperator, StaticShapes};
use crate::ops::operator::Operator;
use crate::ops::sparse_conv::abi::SparseConvKernels;
use crate::ops::sparse_conv::rank::BitmapRank;
use crate::scratch;
use std::ffi::c_void;

/// indice_pairs' last dimension at most (INDICE_IN_LARGE_TENSOR_NUM, get_indice_pairs_structs.h:36).
const MAX_P: usize = 1_000_000;

impl IndiceConv {
    /// Declines the node unless every offset's first indice_num[k] destinations are distinct.
    fn distinct_destinations(
        &self,
        d: &ConvDims,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let device = card.device;
        let active = scratch::collect(
            d.counts.iter().copied().enumerate().filter(|&(_, n)| n > 0),
            "the active offsets",
        )?;
        let words = d.rows.div_ceil(32);
        let ints = |outputs: &mut dyn DeviceOutputs, n: usize| -> Result<*mut i32> {
            Ok(outputs.workspace(n * 4)?.cast())
        };
        let bitmaps = ints(outputs, active.len() * words).map_err(|e| {
            Error::Declined(format!(
                "the destination bitmaps ({} offsets x {words} words) do not fit on the card: {e}",
                active.len()
            ))
        })?;
        // SAFETY: `bitmaps` was just allocated for that many int32.
        unsafe { device.zero_raw(bitmaps.cast(), active.len() * words * 4)? };
        let rank = BitmapRank::new(card, outputs, words)?;
        let totals = ints(outputs, active.len())?;
        let pairs = card.input::<i32>(PAIRS);
        for (a, &(k, n)) in active.iter().enumerate() {
            let count = device::bounded("indice_num[k]", n)?;
            // SAFETY (both blocks): offset k's destination slot is P int32 of the [K, 2, P] rulebook,
            // its first n checked to lie in [0, num_out) before this runs; bitmap a holds
            // `words` zeroed int32, totals one per active offset; the launches only enqueue
            // and the node's driver synchronises the queue before the workspace is freed.
            let (dst, bitmap, total) =
                unsafe { (pairs.add((k * 2 + 1) * d.p), bitmaps.add(a * words), totals.add(a)) };
            // SAFETY: as above.
            unsafe { rank.mark_and_rank(card, device.info.cores(), count, dst, bitmap, total)? };
        }
        card.queue.sync()?;
        let mut found =
            scratch::filled(active.len(), 0i32, "the distinct destinations per offset")?;
        // SAFETY: `totals` holds one int32 per active offset, written by the rank kernels.
        unsafe {
            device.copy_raw(
                found.as_mut_ptr().cast(),
                totals.cast_const().cast(),
                found.len() * 4,
                Direction::DeviceToHost,
            )?
        };
        match active.iter().zip(&found).find(|((_, n), f)| usize::try_from(**f).ok() != Some(*n)) {
            None => Ok(()),
            Some(((k, n), f)) => Err(Error::Declined(format!(
                "offset {k}: {f} distinct destinations among its {n} pairs; MLU-OPS's ScatterNd (UPDATE) would keep one \
                 contribution of each repeated one"
            ))),
        }
    }

    /// Whether the node needs the epilogue step at all.
    fn has_epilogue(&self, d: &ConvDims) -> bool {
        let e = d.epilogue;
        d.bias || e.scale || e.shift || e.residual || self.activation != Activation::None
    }

    /// The epilogue on the card (bias, scale, shift, residual, activation), when the node
    /// has any of it: one pass over the output.
    fn epilogue(&self, d: &ConvDims, card: &CardRun<'_>, out: *mut c_void) -> Result<()> {
        if !self.has_epilogue(d) {
            return Ok(());
        }
        let e = d.epilogue;
        let i = device::bounded;
        // NRAM: bias, scale and shift, a tile of rows and the residual's tile, each rounded up
        // to 64 bytes (mluops_fits bounds Cout).
        let tile_rows =
            ((NRAM_BUDGET - 5 * 64 - 3 * d.cout * 4) / (2 * d.cout * 4)).min(i32::MAX as usize);
        let (rows, cols, tile_rows) =
            (i("num_out", d.rows)?, i("Cout", d.cout)?, i("tile_rows", tile_rows)?);
        let device = card.device;
        let kernels = device.kernels::<SparseConvKernels>()?;
        let given = |on: bool, input: usize| {
            if on { card.input::<f32>(input) } else { std::ptr::null() }
        };
        let (bias, scale, shift, residual) = (
            given(d.bias, BIAS),
            given(e.scale, SCALE),
            given(e.shift, SHIFT),
            given(e.residual, RESIDUAL),
        );
        // SAFETY: each non-null pointer is its [Cout] (residual: [num_out, Cout]) input and
        // `out` the [num_out, Cout] output in card memory; the launch only enqueues.
        card.queue.launch("bang_indice_conv_epilogue", |q| unsafe {
            (kernels.bang_indice_conv_epilogue)(
                q,
                device.info.cores(),
                TASK_UNION1,
                rows,
                cols,
                tile_rows,
                bias,
                scale,
                shift,
                residual,
                i32::from(self.activation == Activation::Relu),
                out.cast(),
            )
        })
    }
}

impl MluOpsOperator for IndiceConv {
    // The distinct-destination count (mark, rank) and the epilogue step (bias, scale, shift,
    // residual, ReLU) are ours.
    const PRE_CALL_FAMILIES: &'static [&'static str] = &["check", "sparse_conv"];

    fn mluops_supported(&self) -> Result<()> {
        if self.inverse {
            return Err(Error::declined(
                "inverse = 1: mluOpIndiceConvolutionForward does not support it",
            ));
        }
        Ok(())
    }

    fn mluops_supported_shapes(&self, _: &DeviceInfo, shapes: &StaticShapes) -> Result<()> {
        let dim = |input: usize, axis: usize| device::static_dim(shapes, input, axis);
        match (dim(FEATURES, 0), dim(PAIRS, 2)) {
            (Some(l), Some(p)) if l != p => Err(Error::declined(format!(
                "indice_pairs' P = {p} != features' L = {l}: MLU-OPS requires them equal"
            ))),
            (_, Some(p)) if p > MAX_P => {
                Err(Error::declined(format!("indice_pairs' P = {p} beyond MLU-OPS's {MAX_P}")))
            }
            _ => Ok(()),
        }
    }

    fn mluops_fits(&self, d: &ConvDims) -> Result<()> {
        if d.p != d.l {
            return Err(Error::declined(format!(
                "indice_pairs' P = {} != features' L = {}: MLU-OPS requires them equal",
                d.p, d.l
            )));
        }
        if d.p > MAX_P {
            return Err(Error::declined(format!(
                "indice_pairs' P = {} beyond MLU-OPS's {MAX_P}",
                d.p
            )));
        }
        let sizes = [
            d.l.saturating_mul(d.cin),
            d.k.saturating_mul(d.cin).saturating_mul(d.cout),
            d.k.saturating_mul(2 * d.p),
            d.rows.saturating_mul(d.cout),
        ];
        if sizes.iter().any(|&n| n > i32::MAX as usize) {
            return Err(Error::declined("a tensor of 2^31 elements or more: MLU-OPS takes less"));
        }
        // The library's gathered and product blocks, [max indice_num, Cin] and [.., Cout],
        // are sized in int (indice_convolution_forward.cpp:194-206 at v1.4.0).
        let most = d.counts.iter().copied().max().unwrap_or(0);
        if most.saturating_mul(d.cin.max(d.cout)).saturating_mul(4) > i32::MAX as usize {
            return Err(Error::declined(format!(
                "max indice_num = {most} x Cin/Cout: beyond the library's int workspace arithmetic"
            )));
        }
        if self.has_epilogue(d) && d.cout.saturating_mul(5 * 4).saturating_add(5 * 64) > NRAM_BUDGET
        {
            return Err(Error::declined(format!(
                "Cout = {}: the epilogue step holds bias, scale, shift, a row and a residual row in NRAM",
                d.cout
            )));
        }
        Ok(())
    }

    fn mluops_compute(
        &self,
        d: &ConvDims,
        lib: &Library,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let spec = &self.output_specs(d)[0];
        if spec.numel() == 0 {
            outputs.allocate(0, spec)?;
            return Ok(());
        }
        let total: usize = d.counts.iter().sum();
        if d.l == 0 || d.cin == 0 || total == 0 {
            // No pair contributes: the bias (or zeros), without the library.
            let out = outputs.allocate(0, spec)?;
            // SAFETY: `out` was just allocated for the spec's bytes.
            unsafe { card.device.zero_raw(out, spec.bytes())? };
            return self.epilogue(d, card, out);
        }
        self.distinct_destinations(d, card, outputs)?;
        let out = outputs.allocate(0, spec)?;
        let counts =
            scratch::collect(d.counts.iter().map(|&n| n as i64), "indice_num for MLU-OPS")?;
        let features = lib.tensor(Layout::Array, DType::Float, &[d.l, d.cin])?;
        let filters = lib.tensor(Layout::Array, DType::Float, &[d.k, 1, 1, d.cin, d.cout])?;
        let pairs = lib.tensor(Layout::Array, DType::Int32, &[d.k, 2, d.p])?;
        let out_d = lib.tensor(Layout::Array, DType::Float, &[d.rows, d.cout])?;
        let num_out = d.rows as i64;
        lib.with_handle(card.queue, |h| {
            let mut size = 0usize;
            // SAFETY: live descriptors, `counts` holds K int64 on the host, a valid out-pointer.
            let s = unsafe {
                (lib.f.mluOpGetIndiceConvolutionForwardWorkspaceSize)(
                    h,
                    features.ptr,
                    filters.ptr,
                    pairs.ptr,
                    out_d.ptr,
                    counts.as_ptr(),
                    num_out,
                    0,
                    0,
                    &mut size,
                )
            };
            lib.check("mluOpGetIndiceConvolutionForwardWorkspaceSize", s)?;
            let workspace = outputs.workspace(size)?;
            // SAFETY: descriptors of the node's tensors at these card addresses, `counts` on
            // the host, the workspace of the size asked for; the rulebook's first
            // indice_num[k] pairs of each offset were checked in range and distinct.
            let s = unsafe {
                (lib.f.mluOpIndiceConvolutionForward)(
                    h,
                    features.ptr,
                    card.input::<c_void>(FEATURES),
                    filters.ptr,
                    card.input::<c_void>(FILTERS),
                    pairs.ptr,
                    card.input::<c_void>(PAIRS),
                    counts.as_ptr(),
                    num_out,
                    0,
                    0,
                    workspace,
                    size,
                    out_d.ptr,
                    out,
                )
            };
            lib.check("mluOpIndiceConvolutionForward", s)
        })?;
        self.epilogue(d, card, out)
    }
}
