//! GetIndicePairs on the MLU: host policy for its five kernels in kernels/sparse_conv
//! (expand, mark, rank, out, pairs; see sparse_conv.mlu for the sequence and the seed steps).
//! Every kernel uses all of the card's cores except rank, whose barrier covers one
//! cluster only (UNION1).
//!
//! Supported: transpose = 0 (as MLU-OPS), every value of the descriptor within int32, and
//! batch_size * output volume within the int32 linear site index (the bitmap has that
//! many bits). Workspace: expand K*L int32, bitmap and word ranks 2 * ceil(V/32) int32,
//! subm adds 2 * L int32.

use super::{DIM_NB, GetIndicePairs, GipDims, INDICES, Layout};
use crate::error::{Error, Result};
use crate::mlu::{self, Direction, NRAM_BUDGET, TASK_UNION1};
use crate::ops::device::{self, BangOperator, CardRun, DeviceOutputs};
use crate::ops::operator::Operator;
use crate::ops::sparse_conv::STREAM_TILE;
use crate::ops::sparse_conv::abi::{GipGeometry, SparseConvKernels};
use crate::ops::sparse_conv::rank::BitmapRank;
use crate::tensor::{Data, Inputs, TensorRef};
use std::ffi::c_void;

/// Tiles carved by the widest kernel (each rounded up to 64 bytes).
const TILES: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub task_dim: u32,
    /// Input rows per expand tile: 4 coordinates, K expanded sites and the own site each.
    pub tile_rows: usize,
    pub tile: usize,
}

impl Policy {
    pub fn new(info: &mlu::DeviceInfo, k: usize) -> Self {
        let per_row = 4 * (4 + k + 1);
        let tile_rows = ((NRAM_BUDGET - TILES * 64) / per_row).max(1);
        Policy { task_dim: info.cores(), tile_rows, tile: STREAM_TILE }
    }
}

impl GetIndicePairs {
    /// Bits of the output site bitmap: batch_size * Do * Ho * Wo.
    fn sites(&self) -> Option<usize> {
        self.output_space
            .iter()
            .try_fold(self.batch as usize, |acc, &o| acc.checked_mul(o as usize))
    }

    fn geometry(&self) -> Option<GipGeometry> {
        let c = |v: [i64; DIM_NB]| -> Option<[i32; 3]> {
            Some([i32::try_from(v[0]).ok()?, i32::try_from(v[1]).ok()?, i32::try_from(v[2]).ok()?])
        };
        Some(GipGeometry {
            in_space: c(self.input_space)?,
            out_space: c(self.output_space)?,
            kernel: c(self.filter_space)?,
            stride: c(self.stride)?,
            pad: c(self.pad)?,
            dilation: c(self.dilation)?,
            subm: i32::from(self.sub_m),
        })
    }
}

/// Card scratch of `n` int32, alive until the caller's queue synchronisation.
fn ints(outputs: &mut dyn DeviceOutputs, n: usize) -> Result<*mut i32> {
    Ok(outputs.workspace(n * 4)?.cast())
}

/// The kernels' arguments (`bang_launch`).
#[derive(Clone, Copy)]
pub struct Launch {
    policy: Policy,
    geometry: GipGeometry,
    /// The bitmap words holding the output grid's linear sites.
    words: i32,
    rows: i32,
    kernel_volume: i32,
    /// K * L: the expanded sites.
    expanded: i32,
    tile_rows: i32,
    tile: i32,
}

impl BangOperator for GetIndicePairs {
    type Launch = Launch;
    const BANG_FAMILIES: &'static [&'static str] = &["check", "sparse_conv"];

    fn bang_supported(&self) -> Result<()> {
        if self.transpose {
            return Err(Error::declined(
                "transpose = 1: the MLU kernels implement transpose = 0 only (as MLU-OPS)",
            ));
        }
        if self.geometry().is_none() {
            return Err(Error::declined("a padding, stride, dilation or size beyond int32"));
        }
        // The expand kernel's int32 tap arithmetic, (z + pad) - k * dilation per axis, with
        // z below the input size.
        let reach = |a: usize| {
            let near = self.input_space[a] - 1 + self.pad[a];
            let far = (self.filter_space[a] - 1).saturating_mul(self.dilation[a]);
            near.max(far) > i64::from(i32::MAX)
        };
        if let Some(a) = (0..DIM_NB).find(|&a| reach(a)) {
            return Err(Error::declined(format!(
                "axis {a}: input size {} + padding {} or (kernel {} - 1) * dilation {} beyond the MLU kernels' int32 tap arithmetic",
                self.input_space[a], self.pad[a], self.filter_space[a], self.dilation[a]
            )));
        }
        match self.sites() {
            Some(v) if v <= i32::MAX as usize - 31 => Ok(()),
            _ => Err(Error::declined(format!(
                "batch_size {} * output volume {:?} exceeds the MLU kernels' int32 linear site index",
                self.batch, self.output_space
            ))),
        }
    }

    fn bang_launch(&self, info: &mlu::DeviceInfo, d: &GipDims) -> Result<Launch> {
        self.bang_supported()?;
        // BANG's __memcpy takes int byte strides: expand stores its K rows of a tile with a
        // GDRAM row stride of L int32 (sparse_conv.mlu).
        if d.l * 4 > i32::MAX as usize {
            return Err(Error::declined(format!(
                "L = {}: its row stride of {} bytes exceeds the MLU copies' int32 byte strides",
                d.l,
                d.l * 4
            )));
        }
        let (Some(geometry), Some(sites)) = (self.geometry(), self.sites()) else {
            return Err(Error::declined("a geometry or site count beyond int32"));
        };
        // int32 offsets into indice_pairs [K, 2, L] and, in the default mode, into
        // out_indices, whose rows are at most min(sites, K * L).
        let expanded = d.k.saturating_mul(d.l);
        let out_rows = if self.sub_m { d.l } else { sites.min(expanded) };
        if expanded.saturating_mul(2) > i32::MAX as usize
            || out_rows.saturating_mul(4) > i32::MAX as usize
        {
            return Err(Error::declined(format!(
                "K = {}, L = {}: indice_pairs [K, 2, L] or out_indices (up to {out_rows} rows of 4) exceed the MLU kernels' int32 offsets",
                d.k, d.l
            )));
        }
        let policy = Policy::new(info, d.k);
        let n = device::narrow;
        Ok(Launch {
            policy,
            geometry,
            words: n("words", sites.div_ceil(32))?,
            rows: n("L", d.l)?,
            kernel_volume: n("K", d.k)?,
            expanded: n("K*L", expanded)?,
            tile_rows: n("tile_rows", policy.tile_rows)?,
            tile: n("tile", policy.tile)?,
        })
    }

    fn bang_compute(
        &self,
        d: &GipDims,
        launch: &Launch,
        card: &CardRun<'_>,
        outputs: &mut dyn DeviceOutputs,
    ) -> Result<()> {
        let Launch {
            policy: p,
            geometry,
            words: nwords,
            rows,
            kernel_volume: kv,
            expanded,
            tile_rows,
            tile,
        } = *launch;
        let (l, k) = (d.l, d.k);
        let device = card.device;
        // Non-negative: narrowed from a word count.
        let words = nwords as usize;
        let specs = self.output_specs(d);
        let pairs = outputs.allocate(0, &specs[0])?;
        let num = outputs.allocate(2, &specs[2])?;
        if l == 0 {
            outputs.allocate(1, &specs[1])?;
            // SAFETY: `num` was just allocated for K int32.
            return unsafe { device.zero_raw(num, k * 4) };
        }
        let expand = ints(outputs, k * l)?;
        let bitmap = ints(outputs, words)?;
        // SAFETY: `bitmap` was just allocated for `words` int32.
        unsafe { device.zero_raw(bitmap.cast(), words * 4)? };
        let rank = BitmapRank::new(card, outputs, words)?;
        let total = ints(outputs, 1)?;
        let (site, perm) = if self.sub_m {
            (ints(outputs, l)?, ints(outputs, l)?)
        } else {
            (std::ptr::null_mut(), std::ptr::null_mut())
        };
        let kernels = device.kernels::<SparseConvKernels>()?;
        let (queue, indices) = (card.queue, card.input::<i32>(INDICES));
        let (gate, gates) = card.gate();
        // SAFETY (all launches): device buffers of the sizes computed above; each launch
        // only enqueues, and the node's driver synchronises the queue before the workspace
        // is freed. Coordinates are read only behind the value-check gate (expand); the
        // later kernels read what expand wrote, each bounds-checked against the bitmap.
        queue.launch("bang_get_indice_pairs_expand", |q| unsafe {
            (kernels.bang_get_indice_pairs_expand)(
                q,
                p.task_dim,
                TASK_UNION1,
                &geometry,
                rows,
                tile_rows,
                indices,
                expand,
                site,
                gate,
                gates,
            )
        })?;
        // Subm marks the rows' own sites, the default mode every expanded one.
        let (marked, count) = if self.sub_m { (site, rows) } else { (expand, expanded) };
        // SAFETY: as above: `marked` holds `count` sites, each below the bitmap's bits.
        unsafe { rank.mark_and_rank(card, p.task_dim, count, marked.cast_const(), bitmap, total)? };
        // The one wait before the end: out_indices' size is the site count. The value
        // checks have run too, so a broken rule is reported here, before the count is used.
        queue.sync()?;
        card.verify()?;
        let mut count = [0i32];
        // SAFETY: `total` holds one int32 the rank kernel wrote; `count` has room for it.
        unsafe {
            device.copy_raw(
                count.as_mut_ptr().cast(),
                total.cast_const().cast(),
                4,
                Direction::DeviceToHost,
            )?
        };
        let num_out = usize::try_from(count[0]).map_err(|_| {
            Error::Runtime(format!("GetIndicePairs on the MLU: negative site count {}", count[0]))
        })?;
        if self.sub_m && num_out != l {
            return Err(self.duplicate_sites(card, l, num_out));
        }
        let out = outputs.allocate(1, &Self::out_indices_spec(num_out))?;
        if self.sub_m {
            // SAFETY: `out` holds L*4 int32 (num_out == L), the input as many.
            unsafe { device.copy_raw(out, indices.cast(), l * 16, Direction::DeviceToDevice)? };
        }
        // SAFETY: as above.
        queue.launch("bang_get_indice_pairs_out", |q| unsafe {
            (kernels.bang_get_indice_pairs_out)(
                q,
                p.task_dim,
                TASK_UNION1,
                &geometry,
                rows,
                nwords,
                tile,
                bitmap,
                rank.word_rank,
                site,
                if self.sub_m { std::ptr::null_mut() } else { out.cast() },
                perm,
            )
        })?;
        // SAFETY: as above.
        queue.launch("bang_get_indice_pairs_pairs", |q| unsafe {
            (kernels.bang_get_indice_pairs_pairs)(
                q,
                mlu::union1_tasks(&device.info, k),
                TASK_UNION1,
                kv,
                rows,
                geometry.subm,
                tile,
                expand,
                bitmap,
                rank.word_rank,
                perm,
                pairs.cast(),
                num.cast(),
            )
        })?;
        Ok(())
    }
}

impl GetIndicePairs {
    /// The error of two subm rows holding one site, found on the card (fewer distinct sites
    /// than rows). Naming the rows takes the CPU check, so on this error path, and only
    /// here, `indices` comes to the host.
    fn duplicate_sites(&self, card: &CardRun<'_>, l: usize, num_out: usize) -> Error {
        let fallback = || {
            Error::input(
                "indices",
                format!(
                    "{num_out} distinct sites among {l} rows: duplicate input sites are not allowed in subm mode"
                ),
            )
        };
        let Ok(mut host) = crate::scratch::filled(l * 4, 0i32, "the host copy of indices") else {
            return fallback();
        };
        // SAFETY: `host` holds L*4 int32, the card's `indices` as many.
        let copied = unsafe {
            card.device.copy_raw(
                host.as_mut_ptr().cast(),
                card.input::<c_void>(INDICES),
                l * 16,
                Direction::DeviceToHost,
            )
        };
        let tensor = TensorRef { shape: vec![l as i64, 4], data: Data::I32(&host) };
        let Ok(inputs) =
            copied.and_then(|()| Inputs::new(vec!["indices".into()], vec![Some(tensor)]))
        else {
            return fallback();
        };
        match self.validate(&inputs) {
            Err(e) => e,
            Ok((_, _, max)) => {
                let err = if Layout::new(max).bits > u64::BITS {
                    self.subm_book::<u128>(&inputs, &host, max).err()
                } else {
                    self.subm_book::<u64>(&inputs, &host, max).err()
                };
                err.unwrap_or_else(fallback)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{BangOperator, GetIndicePairs, GipDims};
    use crate::schema::AttrValue;

    /// An L whose expand row stride in bytes reaches 2^31 is declined (the node runs on CPU);
    /// one row less is taken.
    #[test]
    fn byte_strides_of_2_31_or_more_are_declined() {
        let attrs = [
            ("batch_size".to_owned(), AttrValue::Int(1)),
            ("spatial_shape".to_owned(), AttrValue::Ints(vec![4, 4, 4])),
            ("kernel_size".to_owned(), AttrValue::Ints(vec![1, 1, 1])),
        ]
        .into_iter()
        .collect();
        let op = crate::ops::operator::descriptor::<GetIndicePairs>(&attrs).expect("valid");
        let info = crate::mlu::emulator::info().expect("the emulated card's description");
        assert!(op.bang_launch(&info, &GipDims { l: (1 << 29) - 1, k: 1 }).is_ok());
        let err = op
            .bang_launch(&info, &GipDims { l: 1 << 29, k: 1 })
            .err()
            .expect("a stride of 2^31 bytes")
            .to_string();
        assert!(err.contains("2147483648 bytes"), "{err}");
    }

    /// (kernel - 1) * dilation at 2^31 is declined before any launch; one below is taken.
    #[test]
    fn tap_arithmetic_beyond_int32_is_declined() {
        let op = |dilation: i64| {
            let attrs = [
                ("batch_size".to_owned(), AttrValue::Int(1)),
                ("spatial_shape".to_owned(), AttrValue::Ints(vec![4, 4, 4])),
                ("kernel_size".to_owned(), AttrValue::Ints(vec![3, 1, 1])),
                ("dilation".to_owned(), AttrValue::Ints(vec![dilation, 1, 1])),
                ("padding".to_owned(), AttrValue::Ints(vec![dilation, 0, 0])),
            ]
            .into_iter()
            .collect();
            crate::ops::operator::descriptor::<GetIndicePairs>(&attrs)
                .expect("valid: the output is 4 x 4 x 4")
        };
        assert_eq!(op((1 << 30) - 1).output_space, [4, 4, 4]);
        assert!(op((1 << 30) - 1).bang_supported().is_ok());
        let err = op(1 << 30).bang_supported().expect_err("(3 - 1) * 2^30 = 2^31").to_string();
        assert!(err.contains("axis 0") && err.contains("int32 tap arithmetic"), "{err}");
    }
}
