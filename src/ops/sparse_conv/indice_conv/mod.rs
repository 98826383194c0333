//! IndiceConv (spconv v1 / mmcv indice_conv; schemas/sparse_conv/indice_conv.json): the sparse 3D
//! convolution over a GetIndicePairs rulebook, `output[dst] += features[src] @ filters[k]`
//! for every valid pair of every kernel offset k, after `bias`.
//!
//! Gather -> GEMM -> scatter, tiled by output rows:
//! - `plan` validates the rulebook and finds each *row tile*'s pairs (2^shift consecutive
//!   output rows; the power of two is chosen from the shapes and the pair counts alone: about
//!   TILE_PAIRS_PER_OFFSET pairs per offset, an output block of at most TILE_OUT_BYTES),
//!   offset by offset. In place when it can: an offset whose destinations strictly ascend (a
//!   submanifold rulebook over sites in (batch, z, y, x) order, as every rulebook after a
//!   strided layer is) has each tile's pairs at one range of j; otherwise a submanifold
//!   offset (ascending by source, as GetIndicePairs emits) holds the same pairs as its mirror
//!   offset read with the slots swapped, which ascend by destination: checked pair by pair,
//!   then read instead. (With no destination repeated within an offset, the order of an
//!   offset's pairs changes no output's sum.) Any other rulebook is grouped by tile with a
//!   stable counting sort, run in parallel over fixed pieces of the (k, j) sequence; each
//!   piece keeps its own grouped copy, and a tile's pairs are its segments of the pieces
//!   read in piece order, which is the (k, j) order whatever the pieces are.
//! - `execute` gives each task whole tiles. A tile's output block starts as `bias` and stays
//!   in L2 while the tile walks its pairs offset by offset, in *chunks*: consecutive pairs of
//!   one offset k, at most `chunk_rows` of them (CHUNK_BYTES for the gathered block and its
//!   product, in L1/L2). A chunk prefetches its source rows as it is formed (unless they
//!   ascend: an own offset read in place), gathers them into a [m, Cin] block (or reads them
//!   in place when they are consecutive rows, as the submanifold centre offset's are),
//!   multiplies it by filters[k] with one single-threaded GEMM (the `gemm` crate,
//!   Parallelism::None) into a [m, Cout] block, and adds that block's rows to their output
//!   rows in order.
//! - With Cout 16, 32, 64 or 128 on a CPU with AVX-512F the chunk needs no blocks: each
//!   pair's products are fused multiply-added straight into its output row, held in
//!   registers (`Fused`); chunks are then FUSED_CHUNK_ROWS pairs, so that their prefetched
//!   rows are still in L1.
//!
//! Determinism: every output element is `bias`, then plus d(k, j) for its pairs in (k, j)
//! order, each sum rounded to float32, where d(k, j) is the float32 dot product
//! `features[src, :] . filters[k][:, c]` as the GEMM computes it (fused multiply-adds in the
//! GEMM's order) within its chunk. On the fused path each pair instead adds its Cin products
//! to the output element one fused multiply-add at a time, in input-channel order. The
//! chunks (and so each GEMM's shape and each row's place in it), the way the pairs are read
//! and the path are a function of the inputs' shapes, the rulebook and the CPU alone: not
//! of the thread count, of how tasks are split, or of the plan's pieces. So the result is
//! bit-identical across runs and thread counts. (The path and the GEMM's kernels are picked
//! by the CPU's instruction set: another CPU may round differently, within the accumulating
//! class.)
//! Epilogue: after a tile's last pair, while its block is still in L2, each row gets
//! scale, shift, residual and the activation (`Epilogue::apply`), one float32 operation at a
//! time, as the unfused graph's Mul, Add, Add and Relu would; a node without them skips it.
//! On the card: MLU-OPS only (mluops.rs), the epilogue by our kernel after the library's call.

mod epilogue;
#[cfg(target_arch = "x86_64")]
mod fused;
mod gemm;
pub mod mluops;
mod rulebook;

use epilogue::Epilogue;
#[cfg(target_arch = "x86_64")]
use fused::*;
use gemm::copy_row;
pub use gemm::gemm_rows;
pub use rulebook::tile_shift;
use rulebook::*;

use crate::cache;
use crate::error::{Error, Result};
use crate::ops::operator::Operator;
use crate::ops::rules::{Broken, Check, RowValues, ValueRule};
use crate::parallel::{Parallel, balanced_cuts, for_each_chunk_mut, for_each_part_mut, pieces};
use crate::schema::Attrs;
use crate::scratch::{self, FirstError};
use crate::tensor::{DType, Inputs, OutputSpec, Outputs};

pub(super) const FEATURES: usize = 0;
pub(super) const FILTERS: usize = 1;
pub(super) const PAIRS: usize = 2;
const NUM: usize = 3;
const OUT_INDICES: usize = 4;
pub(super) const BIAS: usize = 5;
pub(super) const SCALE: usize = 6;
pub(super) const SHIFT: usize = 7;
pub(super) const RESIDUAL: usize = 8;
/// A row tile's output block, at most: it stays in L2 while the tile's offsets are walked.
const TILE_OUT_BYTES: usize = 128 * 1024;
/// Pairs per offset that a tile aims at (the GEMMs' m), density permitting.
const TILE_PAIRS_PER_OFFSET: usize = 256;
/// Fewest rows in a tile.
const MIN_TILE_ROWS: usize = 16;
/// A chunk's gathered block plus its product, at most (rows of Cin + Cout floats).
const CHUNK_BYTES: usize = 128 * 1024;
/// A chunk's pairs on the fused path (Cout 16, 32, 64 or 128 with AVX-512F: no blocks, only
/// prefetched rows); 16-128 measured within 5% of each other, 512-2048 8-15% slower.
const FUSED_CHUNK_ROWS: usize = 32;
/// Multiply-adds per execution task, roughly.
const GRAIN: usize = 4 << 20;
/// Pairs per piece of the plan's parallel grouping, and the most pieces.
const PLAN_GRAIN: usize = 128 * 1024;
const MAX_PLAN_PIECES: usize = 8;

/// The configured node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndiceConv {
    /// Gather from slot 1 and scatter to slot 0 of each pair.
    pub inverse: bool,
    /// The epilogue's last step.
    pub activation: Activation,
}

/// The `activation` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    None,
    /// y < 0 -> 0; every other value (NaN, -0) kept, as ONNX Runtime's Relu does.
    Relu,
}

/// Which of the epilogue's optional inputs the node has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EpilogueInputs {
    pub(super) scale: bool,
    pub(super) shift: bool,
    pub(super) residual: bool,
}

/// What IndiceConv's shape rules learn: the sizes and each offset's pair count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvDims {
    pub(super) l: usize,
    pub(super) cin: usize,
    pub(super) k: usize,
    pub(super) cout: usize,
    /// indice_pairs' last dimension.
    pub(super) p: usize,
    /// num_out, the output's rows.
    pub(super) rows: usize,
    /// indice_num, each in [0, P].
    pub(super) counts: Vec<usize>,
    pub(super) bias: bool,
    pub(super) epilogue: EpilogueInputs,
}

impl IndiceConv {
    /// The slot each pair is read from (source) and the one it is written to.
    pub(super) fn slots(&self) -> [usize; 2] {
        if self.inverse { [1, 0] } else { [0, 1] }
    }
}

impl Operator for IndiceConv {
    const NAME: &'static str = "IndiceConv";
    const SCHEMA: &'static str = include_str!("../../../../schemas/sparse_conv/indice_conv.json");
    const SIZE_INPUTS: &'static [usize] = &[NUM];
    type Dims = ConvDims;
    type Found = Rulebook;

    fn from_attributes(attrs: &Attrs<'_>) -> Result<Self> {
        let inverse = match attrs.int("inverse")? {
            0 => false,
            1 => true,
            v => return Err(Error::attribute("inverse", format!("must be 0 or 1, got {v}"))),
        };
        let activation = match attrs.string("activation")?.as_str() {
            "none" => Activation::None,
            "relu" => Activation::Relu,
            v => {
                return Err(Error::attribute(
                    "activation",
                    format!("must be \"none\" or \"relu\", got \"{v}\""),
                ));
            }
        };
        Ok(IndiceConv { inverse, activation })
    }

    /// Shapes, dtypes and indice_num (read on the host on both paths).
    fn shape_rules(&self, inputs: &Inputs<'_>) -> Result<ConvDims> {
        let &[l, cin] = inputs.shaped::<f32>(FEATURES, &[None, None], "[L, Cin]")? else {
            unreachable!("rank checked")
        };
        let filters = inputs.shaped::<f32>(
            FILTERS,
            &[None, Some(cin), None],
            &format!("[K, Cin, Cout] (Cin = {cin} of features)"),
        )?;
        let (k_count, cout) = (filters[0], filters[2]);
        let p = inputs.shaped::<i32>(
            PAIRS,
            &[Some(k_count), Some(2), None],
            &format!("[K, 2, P] (K = {k_count} of filters)"),
        )?[2];
        let num = inputs.get_shaped::<i32>(
            NUM,
            &[Some(k_count)],
            &format!("[K] (K = {k_count} of filters)"),
        )?;
        let out_indices = inputs.shape_of::<i32>(OUT_INDICES)?;
        if out_indices.len() != 2 {
            return Err(inputs
                .error(OUT_INDICES, format!("expected shape [num_out, D], got {out_indices:?}")));
        }
        let rows = out_indices[0];
        let bias = inputs.dtype(BIAS).is_some();
        if bias {
            let shape = inputs.shape_of::<f32>(BIAS)?;
            if shape != [cout] {
                return Err(
                    inputs.error(BIAS, format!("expected shape [Cout] = [{cout}], got {shape:?}"))
                );
            }
        }
        let per_channel = |i: usize| -> Result<bool> {
            if inputs.dtype(i).is_none() {
                return Ok(false);
            }
            let shape = inputs.shape_of::<f32>(i)?;
            if shape != [cout] {
                return Err(
                    inputs.error(i, format!("expected shape [Cout] = [{cout}], got {shape:?}"))
                );
            }
            Ok(true)
        };
        let (scale, shift) = (per_channel(SCALE)?, per_channel(SHIFT)?);
        let residual = inputs.dtype(RESIDUAL).is_some();
        if residual {
            let shape = inputs.shape_of::<f32>(RESIDUAL)?;
            if shape != [rows, cout] {
                return Err(inputs.error(
                    RESIDUAL,
                    format!("expected shape [num_out, Cout] = [{rows}, {cout}] (the output's), got {shape:?}"),
                ));
            }
        }
        let numel = rows.checked_mul(cout).filter(|&n| n <= isize::MAX as usize / size_of::<f32>());
        if numel.is_none() {
            return Err(Error::output(
                "output",
                format!("[num_out, Cout] = [{rows}, {cout}] is too large"),
            ));
        }
        let mut counts = scratch::with_capacity(k_count, "indice_num")?;
        for (k, &n) in num.data.iter().enumerate() {
            let n = usize::try_from(n).ok().filter(|&n| n <= p).ok_or_else(|| {
                inputs.error(NUM, format!("indice_num[{k}] = {n} is outside [0, P] with P = {p} (indice_pairs' last dimension)"))
            })?;
            counts.push(n);
        }
        if l > u32::MAX as usize || rows > u32::MAX as usize || k_count > u32::MAX as usize {
            return Err(inputs.error(
                FEATURES,
                format!("L = {l}, num_out = {rows} or K = {k_count} is too large"),
            ));
        }
        let epilogue = EpilogueInputs { scale, shift, residual };
        Ok(ConvDims { l, cin, k: k_count, cout, p, rows, counts, bias, epilogue })
    }

    /// output [num_out, Cout].
    fn output_specs(&self, d: &ConvDims) -> Vec<OutputSpec> {
        vec![OutputSpec::new(DType::F32, [d.rows, d.cout])]
    }

    /// For each offset k with pairs, in order: its sources in [0, L), then its destinations
    /// in [0, num_out), over its first indice_num[k] slots.
    fn value_rules(&self, d: &ConvDims) -> Vec<ValueRule> {
        let slots = self.slots();
        let limits = [d.l, d.rows];
        let mut rules = Vec::new();
        for (k, &n) in d.counts.iter().enumerate().filter(|(_, n)| **n > 0) {
            for (slot, limit) in slots.into_iter().zip(limits) {
                let (lo, hi) = Check::half_open(0, limit);
                rules.push(ValueRule::part(
                    PAIRS,
                    (k * 2 + slot) * d.p,
                    n,
                    Check::int_range(lo, hi),
                ));
            }
        }
        rules
    }

    fn describe(&self, inputs: &Inputs<'_>, d: &ConvDims, broken: &Broken) -> Error {
        let rule = self.value_rules(d).get(broken.rule).copied();
        match (rule.and_then(|r| r.part), &broken.values) {
            (Some((first, _)), RowValues::I32(v)) if d.p > 0 => {
                let (k, slot) = (first / (2 * d.p), first / d.p % 2);
                let source = slot == self.slots()[0];
                let limit = if source { d.l } else { d.rows };
                pair_error(
                    inputs,
                    k,
                    slot,
                    broken.row,
                    v.first().copied().unwrap_or(0),
                    limit,
                    source,
                )
            }
            (_, values) => Error::Runtime(format!(
                "IndiceConv: value rule {} reported {values:?}",
                broken.rule
            )),
        }
    }

    /// The value rules are checked while the pairs are grouped ([`Operator::find`]), not in
    /// a pass of their own: the same rules, in the same order, with the same errors.
    fn plan(
        &self,
        inputs: &Inputs<'_>,
        par: &dyn Parallel,
    ) -> Result<(Vec<OutputSpec>, ConvDims, Rulebook)> {
        let dims = self.shape_rules(inputs)?;
        let found = self.find(inputs, &dims, par)?;
        Ok((self.output_specs(&dims), dims, found))
    }

    /// The rulebook by row tile, read in place where every offset's pairs ascend by
    /// destination, else grouped; checks the value rules on the way.
    fn find(&self, inputs: &Inputs<'_>, dims: &ConvDims, par: &dyn Parallel) -> Result<Rulebook> {
        let ConvDims { l, k: k_count, cout, p, rows, ref counts, .. } = *dims;
        let pairs = inputs.get::<i32>(PAIRS)?;
        let slots = self.slots();
        let total: usize = counts.iter().sum();
        let active = counts.iter().filter(|&&n| n > 0).count();
        let shift = tile_shift(rows, cout, total, active, k_count);
        let tiles = rows.div_ceil(1 << shift);

        match in_place(pairs.data, counts, p, slots, [l, rows], shift, par)? {
            InPlace::Found(reads, starts) => {
                return Ok(Rulebook { shift, tiles, book: Book::InPlace { reads, starts } });
            }
            InPlace::OutOfRange => {
                return Err(first_bad_pair(inputs, pairs.data, counts, p, slots, [l, rows]));
            }
            InPlace::Unordered => {}
        }
        // Pieces of the (k, j) sequence: piece q covers flat positions [q*len, (q+1)*len).
        let n_pieces = pieces(total, PLAN_GRAIN).min(MAX_PLAN_PIECES);
        let piece_len = total.div_ceil(n_pieces).max(1);
        // The (k, j) pairs of flat positions [lo, hi), as (k, src slice, dst slice) runs.
        let runs = |lo: usize, hi: usize| {
            let (mut flat, counts) = (0usize, counts.as_slice());
            counts.iter().enumerate().filter_map(move |(k, &n)| {
                let (a, b) = (lo.max(flat), hi.min(flat + n));
                let first = flat;
                flat += n;
                (a < b).then(|| {
                    let (src, dst) = offset_pairs(pairs.data, counts, p, slots, k, Read::Own);
                    (k as u32, &src[a - first..b - first], &dst[a - first..b - first])
                })
            })
        };
        let mut books: Vec<Piece> = Vec::new();
        books.resize_with(n_pieces, Piece::default);
        let errors = FirstError::default();
        let invalid = std::sync::atomic::AtomicBool::new(false);
        for_each_chunk_mut(par, &mut books, 1, |q, slot| {
            let (lo, hi) = (q * piece_len, ((q + 1) * piece_len).min(total));
            errors.record((|| {
                let mut starts =
                    scratch::filled(tiles + 1, 0usize, "IndiceConv's grouped rulebook")?;
                for (_, src, dst) in runs(lo, hi) {
                    // Unsigned maxima (vectorised): a negative index reads as >= 2^31.
                    let max = |v: &[i32]| v.iter().fold(0u32, |m, &x| m.max(x as u32)) as usize;
                    if max(src) >= l || max(dst) >= rows {
                        invalid.store(true, std::sync::atomic::Ordering::Relaxed);
                        return Ok(());
                    }
                    // Runs of pairs in one tile (common: a k's pairs ascend by source row, and
                    // so, roughly, by destination) are counted in a register.
                    let (mut tile, mut run) = (usize::MAX, 0usize);
                    for &d in dst {
                        let t = (d as u32 >> shift) as usize;
                        if t != tile {
                            if run > 0 {
                                starts[tile + 1] += run;
                            }
                            (tile, run) = (t, 0);
                        }
                        run += 1;
                    }
                    if run > 0 {
                        starts[tile + 1] += run;
                    }
                }
                for t in 0..tiles {
                    starts[t + 1] += starts[t];
                }
                let mut cursor = starts.clone();
                let mut grouped = scratch::filled(
                    hi.saturating_sub(lo),
                    Pair::default(),
                    "IndiceConv's grouped rulebook",
                )?;
                let mask = (1u32 << shift) - 1;
                for (k, src, dst) in runs(lo, hi) {
                    // The current tile's cursor lives in a register while its run lasts.
                    let (mut tile, mut at) = (usize::MAX, 0usize);
                    for (&s, &d) in src.iter().zip(dst) {
                        let d = d as u32;
                        let t = (d >> shift) as usize;
                        if t != tile {
                            if tile != usize::MAX {
                                cursor[tile] = at;
                            }
                            (tile, at) = (t, cursor[t]);
                        }
                        grouped[at] = Pair { src: s as u32, kd: k << shift | (d & mask) };
                        at += 1;
                    }
                    if tile != usize::MAX {
                        cursor[tile] = at;
                    }
                }
                slot[0] = Piece { starts, pairs: grouped };
                Ok(())
            })());
        });
        if invalid.into_inner() {
            return Err(first_bad_pair(inputs, pairs.data, counts, p, slots, [l, rows]));
        }
        errors.into_result()?;
        Ok(Rulebook { shift, tiles, book: Book::Grouped(books) })
    }

    fn execute(
        &self,
        dims: ConvDims,
        r: Rulebook,
        inputs: &Inputs<'_>,
        outputs: &mut Outputs<'_>,
        par: &dyn Parallel,
    ) -> Result<()> {
        let features = inputs.get::<f32>(FEATURES)?.data;
        let filters = inputs.get::<f32>(FILTERS)?.data;
        let bias = inputs.get_optional::<f32>(BIAS)?.map(|b| b.data);
        let pairs = inputs.get::<i32>(PAIRS)?.data;
        let epilogue = Epilogue {
            scale: inputs.get_optional::<f32>(SCALE)?.map(|v| v.data),
            shift: inputs.get_optional::<f32>(SHIFT)?.map(|v| v.data),
            residual: inputs.get_optional::<f32>(RESIDUAL)?.map(|v| v.data),
            activation: self.activation,
        };
        let out = outputs.take::<f32>(0)?;
        let (cin, cout) = (dims.cin, dims.cout);
        if out.len() != dims.rows * cout
            || features.len() != dims.l * cin
            || filters.len() % (cin * cout).max(1) != 0
            || epilogue.residual.is_some_and(|r| r.len() != out.len())
        {
            return Err(Error::Runtime("IndiceConv: buffers do not match the plan".into()));
        }
        if out.is_empty() {
            return Ok(());
        }
        let tile_rows = 1usize << r.shift;
        let tiles = r.tiles;
        // Tasks of whole tiles, about GRAIN multiply-adds each (any split gives the same bits).
        // (Saturating: with no pairs, Cin and Cout are bounded by no tensor's size.)
        let weight = |t: usize| {
            r.tile_len(t)
                .saturating_mul(cin.saturating_mul(cout))
                .saturating_add(tile_rows.saturating_mul(cout)) as u64
        };
        let work = (0..tiles).map(weight).fold(0u64, u64::saturating_add);
        let cuts = balanced_cuts(
            (0..tiles).map(weight),
            pieces(usize::try_from(work).unwrap_or(usize::MAX), GRAIN),
        );
        let bounds: Vec<usize> =
            cuts.iter().map(|&t| (t * tile_rows).min(dims.rows) * cout).collect();
        #[cfg(target_arch = "x86_64")]
        let fused = Fused::detect(cout);
        #[cfg(not(target_arch = "x86_64"))]
        let fused: Option<()> = None;
        // The fused path loads whole filter rows: from a 64-byte-aligned copy when the input
        // is not aligned (a load across two cache lines costs two; 128 -> 128 measured 18%
        // slower with the filters 16 bytes off).
        let aligned: Vec<f32>;
        let filters = match fused {
            Some(_) if filters.as_ptr().align_offset(64) != 0 => {
                let mut copy =
                    scratch::filled(filters.len() + 15, 0f32, "IndiceConv's aligned filters")?;
                // (At most 15 floats; align_offset may decline, and then the copy is as is.)
                let at = copy.as_ptr().align_offset(64).min(15);
                copy[at..at + filters.len()].copy_from_slice(filters);
                aligned = copy;
                &aligned[at..at + filters.len()]
            }
            _ => filters,
        };
        let chunk_rows = match fused {
            // Prefetched source rows must still be in L1 when the fused kernel reads them.
            Some(_) => FUSED_CHUNK_ROWS,
            None => {
                (CHUNK_BYTES / cin.saturating_add(cout).saturating_mul(size_of::<f32>())).max(1)
            }
        };
        let (shift, mask) = (r.shift, (1u32 << r.shift) - 1);
        let errors = FirstError::default();
        for_each_part_mut(par, out, &bounds, |task, part| {
            errors.record((|| {
                // Chunk buffers only for tasks with work (Cin may be huge when no pair is valid).
                let work = cin > 0 && (cuts[task]..cuts[task + 1]).any(|t| r.tile_len(t) > 0);
                let rows = if work { chunk_rows } else { 0 };
                // The fused path has no gathered or product block.
                let blocks = if fused.is_some() { 0 } else { rows };
                let mut gathered =
                    scratch::filled(blocks * cin, 0f32, "IndiceConv's gathered rows")?;
                let mut product =
                    scratch::filled(blocks * cout, 0f32, "IndiceConv's product rows")?;
                // Index buffers only for grouped pairs (in-place chunks are the rulebook's).
                let indexed = if matches!(r.book, Book::Grouped(_)) { rows } else { 0 };
                let mut srcs = scratch::filled(indexed, 0i32, "IndiceConv's chunk")?;
                let mut dsts = scratch::filled(indexed, 0i32, "IndiceConv's chunk")?;
                for (t, block) in (cuts[task]..cuts[task + 1])
                    .zip(part.chunks_mut(tile_rows.saturating_mul(cout)))
                {
                    match bias {
                        Some(bias) => {
                            block.chunks_exact_mut(cout).for_each(|row| copy_row(row, bias))
                        }
                        None => block.fill(0.0),
                    }
                    // The tile's first output element, for the residual's rows.
                    let at = t * tile_rows * cout;
                    if cin == 0 {
                        // Every product is an empty sum: the output is the bias.
                        epilogue.apply(block, cout, at);
                        continue;
                    }
                    // One chunk: consecutive pairs of one offset k, at most chunk_rows, source
                    // rows and output rows (minus `base`, within the tile). Its source rows
                    // are gathered (unless they are consecutive rows) and multiplied by
                    // filters[k]; the product rows are added to their output rows in order.
                    let mut flush =
                        |k: usize, srcs: &[i32], dsts: &[i32], base: i32, distinct: bool| {
                            let m = srcs.len();
                            let (s0, w) =
                                (srcs[0] as usize, &filters[k * cin * cout..(k + 1) * cin * cout]);
                            #[cfg(not(target_arch = "x86_64"))]
                            let _ = distinct; // only the fused path uses it
                            #[cfg(target_arch = "x86_64")]
                            if let Some(fused) = fused {
                                fused.accumulate(
                                    cin,
                                    Chunk { srcs, dsts, base, distinct },
                                    features,
                                    w,
                                    block,
                                );
                                return;
                            }
                            let lhs = if srcs.iter().enumerate().all(|(i, &s)| s as usize == s0 + i)
                            {
                                &features[s0 * cin..(s0 + m) * cin]
                            } else {
                                for (row, &s) in gathered.chunks_exact_mut(cin).zip(srcs) {
                                    let s = s as usize;
                                    copy_row(row, &features[s * cin..(s + 1) * cin]);
                                }
                                &gathered[..m * cin]
                            };
                            gemm_rows(m, cin, cout, lhs, w, &mut product[..m * cout]);
                            for (&d, prod) in dsts.iter().zip(product.chunks_exact(cout)) {
                                let d = d.wrapping_sub(base) as usize;
                                for (o, &v) in block[d * cout..(d + 1) * cout].iter_mut().zip(prod)
                                {
                                    *o += v;
                                }
                            }
                        };
                    match &r.book {
                        Book::InPlace { reads, starts } => {
                            // A tile holding a destination starts below 2^31.
                            let first = i32::try_from(t << shift).unwrap_or(i32::MAX);
                            for (k, &how) in reads.iter().enumerate() {
                                let js = Rulebook::in_place_range(starts, tiles, k, t);
                                let (src, dst) =
                                    offset_pairs(pairs, &dims.counts, dims.p, self.slots(), k, how);
                                let (src, dst) = (&src[js.clone()], &dst[js]);
                                // (Validated: sources in [0, L), destinations in this tile.)
                                for (src, dst) in src.chunks(chunk_rows).zip(dst.chunks(chunk_rows))
                                {
                                    // A mirrored offset's sources are in the sites' order, not
                                    // the tile's: prefetched. (An own offset's, in a submanifold
                                    // rulebook over sorted sites, ascend with their destinations:
                                    // prefetching them measured 6-8% slower at 32 and 64 channels.)
                                    if how == Read::Mirror {
                                        for &s in src {
                                            let s = s as usize;
                                            cache::prefetch_read(&features[s * cin..(s + 1) * cin]);
                                        }
                                    }
                                    // Strictly ascending destinations: no row repeats.
                                    flush(k, src, dst, first, true);
                                }
                            }
                        }
                        Book::Grouped(pieces) => {
                            let (mut m, mut chunk_k) = (0usize, 0usize);
                            for pair in
                                pieces.iter().flat_map(|p| &p.pairs[p.starts[t]..p.starts[t + 1]])
                            {
                                let k = (pair.kd >> shift) as usize;
                                if m == chunk_rows || (m > 0 && k != chunk_k) {
                                    flush(chunk_k, &srcs[..m], &dsts[..m], 0, false);
                                    m = 0;
                                }
                                chunk_k = k;
                                let s = pair.src as usize;
                                cache::prefetch_read(&features[s * cin..(s + 1) * cin]);
                                // (Sources came from int32 values, local rows are below 2^shift <= 2^31.)
                                (srcs[m], dsts[m]) = (pair.src as i32, (pair.kd & mask) as i32);
                                m += 1;
                            }
                            if m > 0 {
                                flush(chunk_k, &srcs[..m], &dsts[..m], 0, false);
                            }
                        }
                    }
                    epilogue.apply(block, cout, at);
                }
                Ok(())
            })());
        });
        errors.into_result()
    }
}

/// The error of the first pair out of range, in (k, slot, j) order: for each k, its source
/// slot, then its destination slot (the order of the value rules).
fn first_bad_pair(
    inputs: &Inputs<'_>,
    data: &[i32],
    counts: &[usize],
    p: usize,
    slots: [usize; 2],
    limits: [usize; 2],
) -> Error {
    for (k, &n) in counts.iter().enumerate() {
        let base = k * 2 * p;
        for ((slot, limit), source) in slots.into_iter().zip(limits).zip([true, false]) {
            let vals = &data[base + slot * p..base + slot * p + n];
            if let Some(j) = vals.iter().position(|&x| x as u32 as usize >= limit) {
                return pair_error(inputs, k, slot, j, vals[j], limit, source);
            }
        }
    }
    Error::Runtime("IndiceConv: a pair was out of range but could not be found again".into())
}

/// indice_pairs[k, slot, j] = `value` outside [0, `limit`), in the contract's words; `source`
/// when the slot holds the pairs' sources (features rows), else their destinations.
fn pair_error(
    inputs: &Inputs<'_>,
    k: usize,
    slot: usize,
    j: usize,
    value: i32,
    limit: usize,
    source: bool,
) -> Error {
    let row = if slot == 0 { "input row (slot 0)" } else { "output row (slot 1)" };
    let what = if source { "L (features' rows)" } else { "num_out (out_indices' rows)" };
    inputs.error(PAIRS, format!("indice_pairs[{k}, {slot}, {j}] = {value} ({row}) is outside [0, {limit}) with {limit} = {what}"))
}

#[cfg(test)]
mod tests;
