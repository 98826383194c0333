//! PsRoiPool and PsRoiPoolBackward on Cambricon's MLU-OPS library (`mluOpPsRoiPoolForward` /
//! `Backward`). The library converts roi coordinates with a `_rd` intrinsic whose rounding is
//! not confirmed (round down by its name, half away from zero in mlu-ops' own CPU reference),
//! converts bin edges to int before clamping, and truncates non-finite batch ids
//! (docs/MLUOPS_BINDING.md §3.7). So the rois go to the library as a card copy prepared on
//! the host: coordinates rounded as the contract rounds (integers, which every rounding
//! keeps), and a roi the contract makes contribute nothing replaced by one the library
//! gives nothing for. The backward kernel skips a roi whose batch is out of range: batch -1.
//! The forward kernel stops its core's remaining rois there (psroipool_block.mlu:82-84 at
//! v1.4.0): a roi on batch 0 whose every bin is empty, which gives 0 and the channel map.
//! A node with a bin edge beyond the int range goes to the next path, and so does one with
//! a bin edge within one ulp of an integer (`edge_near_integer`: the card computes the edges
//! with its own division and floor/ceil; our BANG kernels take them from the host).

use super::backward::PsRoiPoolBackward;
use super::forward::PsRoiPool;
use super::{Dims, MIN_ROI_EXTENT};
use crate::error::{Error, Result};
use crate::mlu::Direction;
use crate::mluops::{DType, Layout, Library};
use crate::ops::device::{CardRun, DeviceOutputs, MluOpsOperator};
use crate::ops::operator::Operator;
use crate::scratch;
use std::ffi::c_void;

/// The library's tensors stay below 2^31 bytes (psroipool.cpp:204-219 at v1.4.0).
const MAX_BYTES: usize = (1 << 31) - 1;
/// Coordinates and bin edges beyond this magnitude could leave the int range the library
/// converts them to (it converts each coordinate, then each bin edge).
const EDGE_LIMIT: f32 = (1u32 << 30) as f32;

/// One roi as the library is to be given it.
enum LibraryRoi {
    /// Coordinates rounded as the contract rounds.
    Rounded([f32; 5]),
    /// The contract makes it contribute nothing (a non-finite value, start or bin size).
    Nothing,
    /// A coordinate or bin edge beyond the int range the library converts to.
    BeyondInt,
    /// A bin edge the card may place one pixel row off the contract's ([`edge_near_integer`]).
    NearInteger(f32),
}

impl PsRoiPoolBackward {
    fn library_roi(&self, roi: &[f32], height: usize, width: usize) -> LibraryRoi {
        let r = [roi[0], roi[1].round(), roi[2].round(), roi[3].round(), roi[4].round()];
        let Some([start_w, start_h, bin_w, bin_h]) = self.library_bins(&r) else {
            return LibraryRoi::Nothing;
        };
        if !roi.iter().all(|v| v.is_finite()) {
            return LibraryRoi::Nothing;
        }
        let far = |start: f32, bin: f32| start.abs().max((self.pooled as f32 * bin + start).abs());
        let coordinates = r[1..].iter().all(|v| v.abs() < EDGE_LIMIT);
        if !(coordinates && far(start_w, bin_w) < EDGE_LIMIT && far(start_h, bin_h) < EDGE_LIMIT) {
            return LibraryRoi::BeyondInt;
        }
        let near = edge_near_integer(self.pooled, start_w, bin_w, width)
            .or_else(|| edge_near_integer(self.pooled, start_h, bin_h, height));
        near.map_or(LibraryRoi::Rounded(r), LibraryRoi::NearInteger)
    }

    /// (start_w, start_h, bin_w, bin_h) of rounded roi `r` in the library's float32 order,
    /// `None` when one is not finite.
    fn library_bins(&self, r: &[f32; 5]) -> Option<[f32; 4]> {
        let scale = self.spatial_scale;
        let (start_w, start_h) = (r[1] * scale, r[2] * scale);
        let (end_w, end_h) = ((r[3] + 1.0) * scale, (r[4] + 1.0) * scale);
        let bin_w = (end_w - start_w).max(MIN_ROI_EXTENT) / self.pooled as f32;
        let bin_h = (end_h - start_h).max(MIN_ROI_EXTENT) / self.pooled as f32;
        let bins = [start_w, start_h, bin_w, bin_h];
        bins.iter().all(|v| v.is_finite()).then_some(bins)
    }

    /// A roi on batch 0 all of whose bins lie left of and above the map (every edge <= 0,
    /// so clamped to 0: empty), with int-range edges; `None` when the scale allows none.
    fn empty_roi(&self) -> Option<[f32; 5]> {
        // -k * scale <= -(max(scale, 0.1) + margin): the last edge stays below 0.
        let k = ((0.2 / f64::from(self.spatial_scale)).max(1.0).ceil() + 2.0) as f32;
        let r = [0.0, -k, -k, -k, -k];
        let [start_w, _, bin_w, _] = self.library_bins(&r)?;
        let last = self.pooled as f32 * bin_w + start_w;
        (last <= 0.0 && start_w.abs() < EDGE_LIMIT && k < EDGE_LIMIT).then_some(r)
    }

    /// The rois of input `index` prepared for the library in card scratch; `nothing` is the
    /// replacement for a roi that contributes nothing (`None`: the node declines).
    fn prepare_rois(
        &self,
        (rois, height, width): (usize, usize, usize),
        index: usize,
        nothing: Option<[f32; 5]>,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<*mut c_void> {
        let mut host = scratch::filled(rois * 5, 0f32, "the host copy of rois")?;
        // SAFETY: `host` holds R*5 floats; input `index` is the [R, 5] rois on the card.
        unsafe {
            card.device.copy_raw(
                host.as_mut_ptr().cast(),
                card.input::<c_void>(index),
                rois * 20,
                Direction::DeviceToHost,
            )?
        };
        for row in host.chunks_exact_mut(5) {
            let adapted = match self.library_roi(row, height, width) {
                LibraryRoi::Rounded(r) => r,
                LibraryRoi::Nothing => nothing.ok_or_else(|| {
                    Error::Declined(format!(
                        "roi {row:?} contributes nothing, and at spatial_scale {} no roi with empty bins stays in MLU-OPS's int range",
                        self.spatial_scale
                    ))
                })?,
                LibraryRoi::NearInteger(edge) => {
                    return Err(Error::Declined(format!(
                        "roi {row:?}: bin edge {edge:e} is within one ulp of an integer, where MLU-OPS's on-card division and floor/ceil may place it one pixel row off the contract (rule: such rois run on the next path)"
                    )));
                }
                LibraryRoi::BeyondInt => {
                    return Err(Error::Declined(format!(
                        "roi {row:?}: a coordinate or bin edge beyond the int range MLU-OPS converts to"
                    )));
                }
            };
            row.copy_from_slice(&adapted);
        }
        let prepared = outputs.workspace(rois * 20)?;
        // SAFETY: `prepared` holds R*5 floats of card memory; `host` as many on the host.
        unsafe {
            card.device.copy_raw(
                prepared,
                host.as_ptr().cast(),
                rois * 20,
                Direction::HostToDevice,
            )?
        };
        Ok(prepared)
    }

    /// The library's int arguments.
    fn int_arguments(&self) -> Result<()> {
        if self.pooled > i32::MAX as usize || self.output_dim > i32::MAX as usize {
            return Err(Error::declined(
                "pooled sizes or output_dim beyond the library's int arguments",
            ));
        }
        Ok(())
    }
}

/// A bin edge of one axis (`start`, `bin` as [`PsRoiPoolBackward::library_bins`] gives them)
/// whose place on a map of `limit` pixels the card may not compute as the contract does.
/// MLU-OPS computes the edges on the card: `bin` by a scalar division, then
/// `floor(p * bin + start)` for bin p's first row and `ceil((p + 1) * bin + start)` past its
/// last, clamped to the map (psroipool_block.mlu:93-110 forward, :254-259 backward, at
/// v1.4.0), built without -ffp-contract=off, and how mtp_372 lowers that division is not
/// public. The contract rounds each operation in float32. An edge whose clamped floor or
/// ceil changes when `bin` is one ulp off either way, or when the multiply-add is fused,
/// could move a whole row of pixels on the card: that edge (as the contract computes it).
fn edge_near_integer(pooled: usize, start: f32, bin: f32, limit: usize) -> Option<f32> {
    let clamp = |v: f32| v.clamp(0.0, limit as f32);
    let edge = |p: usize, bin: f32, fused: bool| {
        if fused { (p as f32).mul_add(bin, start) } else { p as f32 * bin + start }
    };
    let variants = [
        (bin.next_down(), false),
        (bin.next_up(), false),
        (bin, true),
        (bin.next_down(), true),
        (bin.next_up(), true),
    ];
    (0..=pooled).find_map(|p| {
        let e = edge(p, bin, false);
        let moved = variants.iter().any(|&(b, fused)| {
            let v = edge(p, b, fused);
            (p < pooled && clamp(v.floor()) != clamp(e.floor()))
                || (p > 0 && clamp(v.ceil()) != clamp(e.ceil()))
        });
        moved.then_some(e)
    })
}

/// The library's tensors stay below 2^31 bytes: the map [batches, height, width, channels]
/// and the pooled side [R, channels].
fn byte_limits(
    batches: usize,
    height: usize,
    width: usize,
    channels: usize,
    rois: usize,
) -> Result<()> {
    let map =
        [batches, height, width, channels, 4].iter().fold(1usize, |a, &d| a.saturating_mul(d));
    let pooled = [rois, channels, 4].iter().fold(1usize, |a, &d| a.saturating_mul(d));
    if map > MAX_BYTES || pooled > MAX_BYTES {
        return Err(Error::declined(
            "a tensor of 2^31 bytes or more: MLU-OPS's PsRoiPool takes less",
        ));
    }
    Ok(())
}

impl MluOpsOperator for PsRoiPoolBackward {
    fn mluops_supported(&self) -> Result<()> {
        self.int_arguments()
    }

    fn mluops_fits(&self, dims: &Dims) -> Result<()> {
        byte_limits(dims.batches, dims.height, dims.width, self.channels, dims.rois)
    }

    fn mluops_compute(
        &self,
        dims: &Dims,
        lib: &Library,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let spec = &self.output_specs(dims)[0];
        let out = outputs.allocate(0, spec)?;
        // SAFETY: `out` was just allocated for the spec's bytes.
        unsafe { card.device.zero_raw(out, spec.bytes())? };
        // R = 0 is BAD_PARAM there and the contract's all-zero output here.
        if spec.numel() == 0 || dims.rois == 0 {
            return Ok(());
        }
        let r = dims.rois;
        let prepared = self.prepare_rois(
            (r, dims.height, dims.width),
            1,
            Some([-1.0, 0.0, 0.0, 0.0, 0.0]),
            card,
            outputs,
        )?;
        let (p, o) = (self.pooled, self.output_dim);
        let top = lib.tensor(Layout::Nhwc, DType::Float, &[r, p, p, o])?;
        let rois_d = lib.tensor(Layout::Array, DType::Float, &[r, 5])?;
        let map = lib.tensor(Layout::Nhwc, DType::Int32, &[r, p, p, o])?;
        let bottom = lib.tensor(
            Layout::Nhwc,
            DType::Float,
            &[dims.batches, dims.height, dims.width, self.channels],
        )?;
        lib.with_handle(card.queue, |h| {
            // SAFETY: descriptors of the node's tensors; card memory of those sizes; the int
            // arguments bounded by mluops_supported.
            let s = unsafe {
                (lib.f.mluOpPsRoiPoolBackward)(
                    h,
                    p as i32,
                    p as i32,
                    self.spatial_scale,
                    o as i32,
                    top.ptr,
                    card.input::<c_void>(0),
                    rois_d.ptr,
                    prepared.cast_const(),
                    map.ptr,
                    card.input::<c_void>(2),
                    bottom.ptr,
                    out,
                )
            };
            lib.check("mluOpPsRoiPoolBackward", s)
        })
    }
}

impl MluOpsOperator for PsRoiPool {
    fn mluops_supported(&self) -> Result<()> {
        self.0.int_arguments()
    }

    fn mluops_fits(&self, dims: &Dims) -> Result<()> {
        if dims.rois > 0 && dims.batches * dims.height * dims.width == 0 {
            // psroipool.cpp:132-135 at v1.4.0: success with nothing written, where the
            // contract fills mapping_channel.
            return Err(Error::declined("an empty input map: the library writes no output"));
        }
        byte_limits(dims.batches, dims.height, dims.width, self.0.channels, dims.rois)
    }

    fn mluops_compute(
        &self,
        dims: &Dims,
        lib: &Library,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        // The forward kernel's output channels per NRAM pass, FLOOR_ALIGN(NRAM / ((2 + 2 *
        // CEIL_ALIGN(ph * pw, 64)) * 4), 64), divides output_dim (psroipool_block.mlu:199-203
        // at v1.4.0; its NRAM is the card's less 128 KiB): 0 there is a division by zero.
        let nram = card.device.info.kernel_nram();
        let bins = (self.0.pooled * self.0.pooled).div_ceil(64) * 64;
        if nram / ((2 + 2 * bins) * 4) < 64 {
            return Err(Error::Declined(format!(
                "pooled {}: mluOpPsRoiPoolForward's kernel fits no output channel block in NRAM at this size",
                self.0.pooled
            )));
        }
        let specs = self.output_specs(dims);
        let (spec, map_spec) = (&specs[0], &specs[1]);
        let out = outputs.allocate(0, spec)?;
        let mapping = outputs.allocate(1, map_spec)?;
        // R = 0 (or output_dim 0) is BAD_PARAM there and empty outputs here.
        if spec.numel() == 0 {
            return Ok(());
        }
        let d = &self.0;
        let r = dims.rois;
        let prepared =
            d.prepare_rois((r, dims.height, dims.width), 1, d.empty_roi(), card, outputs)?;
        let (p, o) = (d.pooled, d.output_dim);
        let input = lib.tensor(
            Layout::Nhwc,
            DType::Float,
            &[dims.batches, dims.height, dims.width, d.channels],
        )?;
        let rois_d = lib.tensor(Layout::Array, DType::Float, &[r, 5])?;
        let out_d = lib.tensor(Layout::Nhwc, DType::Float, &[r, p, p, o])?;
        let map_d = lib.tensor(Layout::Nhwc, DType::Int32, &[r, p, p, o])?;
        lib.with_handle(card.queue, |h| {
            // SAFETY: descriptors of the node's tensors; card memory of those sizes; the int
            // arguments bounded by mluops_supported (group_size is pooled: R-FCN's bins).
            let s = unsafe {
                (lib.f.mluOpPsRoiPoolForward)(
                    h,
                    p as i32,
                    p as i32,
                    d.spatial_scale,
                    p as i32,
                    o as i32,
                    input.ptr,
                    card.input::<c_void>(0),
                    rois_d.ptr,
                    prepared.cast_const(),
                    out_d.ptr,
                    out,
                    map_d.ptr,
                    mapping,
                )
            };
            lib.check("mluOpPsRoiPoolForward", s)
        })
    }
}
