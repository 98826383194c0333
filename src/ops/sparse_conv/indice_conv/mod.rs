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
//! On the card: MLU-OPS only (mluops.rs).

pub mod mluops;

use crate::ops::Operator;
use crate::ops::rules::{Broken, Check, RowValues, Rules, ValueRule};
use crate::cache;
use crate::error::{Error, Result};
use crate::parallel::{Parallel, balanced_cuts, for_each_chunk_mut, for_each_part_mut, pieces};
use crate::scratch::{self, FirstError};
use crate::schema::Attrs;
use crate::tensor::{DType, Inputs, OutputSpec, Outputs};

pub(super) const FEATURES: usize = 0;
pub(super) const FILTERS: usize = 1;
pub(super) const PAIRS: usize = 2;
const NUM: usize = 3;
const OUT_INDICES: usize = 4;
pub(super) const BIAS: usize = 5;
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
}

/// One valid pair: its source row, and its kernel offset k and destination row's place in
/// its tile packed as `k << shift | (dst - tile start)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Pair {
    src: u32,
    kd: u32,
}

/// The pairs of one consecutive piece of the (k, j) sequence, grouped by row tile.
#[derive(Debug, Default)]
struct Piece {
    /// `pairs[starts[t]..starts[t + 1]]` are tile t's pairs of this piece, in (k, j) order.
    starts: Vec<usize>,
    pairs: Vec<Pair>,
}

/// How the execution finds a tile's pairs.
#[derive(Debug)]
enum Book {
    /// Every offset's pairs are read in place, as `reads` says (own or mirror), ascending by
    /// destination: `starts[k * (tiles + 1) + t]` is the first of them whose destination is
    /// at or past tile t's first row; P is indice_pairs' last dimension, `slots` the source
    /// and destination slots. (Strictly ascending also means no output row repeats within
    /// an offset.)
    InPlace { reads: Vec<Read>, starts: Vec<usize>, p: usize, counts: Vec<usize>, slots: [usize; 2] },
    /// Otherwise: a grouped copy, made in pieces.
    Grouped(Vec<Piece>),
}

/// The validated rulebook, by row tile.
#[derive(Debug)]
pub struct ConvPlan {
    l: usize,
    cin: usize,
    cout: usize,
    rows: usize,
    /// log2 of the rows per tile: tile t holds output rows [t << shift, (t + 1) << shift).
    shift: u32,
    book: Book,
}

impl ConvPlan {
    fn tiles(&self) -> usize {
        self.rows.div_ceil(1 << self.shift)
    }

    /// Tile t's pairs of offset k read in place: the range of j.
    fn in_place(starts: &[usize], tiles: usize, k: usize, t: usize) -> std::ops::Range<usize> {
        starts[k * (tiles + 1) + t]..starts[k * (tiles + 1) + t + 1]
    }

    fn tile_len(&self, t: usize) -> usize {
        match &self.book {
            Book::InPlace { reads, starts, .. } => (0..reads.len()).map(|k| Self::in_place(starts, self.tiles(), k, t).len()).sum(),
            Book::Grouped(pieces) => pieces.iter().map(|p| p.starts[t + 1] - p.starts[t]).sum(),
        }
    }
}

/// log2 of the rows per tile: about TILE_PAIRS_PER_OFFSET pairs per active offset at the
/// rulebook's mean density, within [MIN_TILE_ROWS, TILE_OUT_BYTES of output], and small
/// enough that `k << shift` fits 32 bits for every k < `k_count`; a function of the shapes
/// and counts alone.
/// (Public for benches/indice_conv.rs, which times the kernel's pieces.)
#[doc(hidden)]
pub fn tile_shift(rows: usize, cout: usize, total: usize, active: usize, k_count: usize) -> u32 {
    let k_bits = usize::BITS - k_count.saturating_sub(1).leading_zeros();
    tile_shift_unbounded(rows, cout, total, active).min(32u32.saturating_sub(k_bits))
}

fn tile_shift_unbounded(rows: usize, cout: usize, total: usize, active: usize) -> u32 {
    let cap = (TILE_OUT_BYTES / (cout.max(1) * size_of::<f32>())).max(MIN_TILE_ROWS);
    let want = if total == 0 {
        cap
    } else {
        // rows * TILE_PAIRS_PER_OFFSET * active / total, in u128 (no overflow).
        let w = (rows as u128 * (TILE_PAIRS_PER_OFFSET * active) as u128).div_ceil(total as u128);
        usize::try_from(w).unwrap_or(usize::MAX)
    };
    let rows_per_tile = want.clamp(MIN_TILE_ROWS, cap).min(rows.checked_next_power_of_two().unwrap_or(usize::MAX).max(MIN_TILE_ROWS));
    // Largest power of two not above it.
    usize::BITS - 1 - rows_per_tile.leading_zeros()
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
}

impl IndiceConv {
    /// The slot each pair is read from (source) and the one it is written to.
    pub(super) fn slots(&self) -> [usize; 2] {
        if self.inverse { [1, 0] } else { [0, 1] }
    }
}

impl Rules for IndiceConv {
    const SIZE_INPUTS: &'static [usize] = &[NUM];
    type Dims = ConvDims;

    /// Shapes, dtypes and indice_num (read on the host on both paths).
    fn shape_rules(&self, inputs: &Inputs<'_>) -> Result<ConvDims> {
        let &[l, cin] = inputs.shaped::<f32>(FEATURES, &[None, None], "[L, Cin]")? else { unreachable!("rank checked") };
        let filters = inputs.shaped::<f32>(FILTERS, &[None, Some(cin), None], &format!("[K, Cin, Cout] (Cin = {cin} of features)"))?;
        let (k_count, cout) = (filters[0], filters[2]);
        let p = inputs.shaped::<i32>(PAIRS, &[Some(k_count), Some(2), None], &format!("[K, 2, P] (K = {k_count} of filters)"))?[2];
        let num = inputs.get_shaped::<i32>(NUM, &[Some(k_count)], &format!("[K] (K = {k_count} of filters)"))?;
        let out_indices = inputs.shape_of::<i32>(OUT_INDICES)?;
        if out_indices.len() != 2 {
            return Err(inputs.error(OUT_INDICES, format!("expected shape [num_out, D], got {out_indices:?}")));
        }
        let rows = out_indices[0];
        let bias = inputs.dtype(BIAS).is_some();
        if bias {
            let shape = inputs.shape_of::<f32>(BIAS)?;
            if shape != [cout] {
                return Err(inputs.error(BIAS, format!("expected shape [Cout] = [{cout}], got {shape:?}")));
            }
        }
        let numel = rows.checked_mul(cout).filter(|&n| n <= isize::MAX as usize / size_of::<f32>());
        if numel.is_none() {
            return Err(Error::output("output", format!("[num_out, Cout] = [{rows}, {cout}] is too large")));
        }
        let mut counts = scratch::with_capacity(k_count, "indice_num")?;
        for (k, &n) in num.data.iter().enumerate() {
            let n = usize::try_from(n).ok().filter(|&n| n <= p).ok_or_else(|| {
                inputs.error(NUM, format!("indice_num[{k}] = {n} is outside [0, P] with P = {p} (indice_pairs' last dimension)"))
            })?;
            counts.push(n);
        }
        if l > u32::MAX as usize || rows > u32::MAX as usize || k_count > u32::MAX as usize {
            return Err(inputs.error(FEATURES, format!("L = {l}, num_out = {rows} or K = {k_count} is too large")));
        }
        Ok(ConvDims { l, cin, k: k_count, cout, p, rows, counts, bias })
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
                rules.push(ValueRule::part(PAIRS, (k * 2 + slot) * d.p, n, Check::int_range(lo, hi)));
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
                pair_error(inputs, k, slot, broken.row, v.first().copied().unwrap_or(0), limit, source)
            }
            (_, values) => Error::Runtime(format!("IndiceConv: value rule {} reported {values:?}", broken.rule)),
        }
    }
}

impl Operator for IndiceConv {
    const NAME: &'static str = "IndiceConv";
    const SCHEMA: &'static str = include_str!("../../../../schemas/sparse_conv/indice_conv.json");
    type Plan = ConvPlan;

    fn from_attributes(attrs: &Attrs<'_>) -> Result<Self> {
        match attrs.int("inverse")? {
            0 => Ok(IndiceConv { inverse: false }),
            1 => Ok(IndiceConv { inverse: true }),
            v => Err(Error::attribute("inverse", format!("must be 0 or 1, got {v}"))),
        }
    }

    fn plan(&self, inputs: &Inputs<'_>, par: &dyn Parallel) -> Result<(Vec<OutputSpec>, ConvPlan)> {
        let ConvDims { l, cin, k: k_count, cout, p, rows, counts, .. } = self.shape_rules(inputs)?;
        let pairs = inputs.get::<i32>(PAIRS)?;
        let slots = self.slots();
        let total: usize = counts.iter().sum();
        let active = counts.iter().filter(|&&n| n > 0).count();
        let shift = tile_shift(rows, cout, total, active, k_count);
        let tiles = rows.div_ceil(1 << shift);

        match in_place(pairs.data, &counts, p, slots, [l, rows], shift, par)? {
            InPlace::Found(reads, starts) => {
                let specs = vec![OutputSpec::new(DType::F32, [rows, cout])];
                let book = Book::InPlace { reads, starts, p, counts, slots };
                return Ok((specs, ConvPlan { l, cin, cout, rows, shift, book }));
            }
            InPlace::OutOfRange => return Err(first_bad_pair(inputs, pairs.data, &counts, p, slots, [l, rows])),
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
                let mut starts = scratch::filled(tiles + 1, 0usize, "IndiceConv's grouped rulebook")?;
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
                let mut grouped = scratch::filled(hi.saturating_sub(lo), Pair::default(), "IndiceConv's grouped rulebook")?;
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
            return Err(first_bad_pair(inputs, pairs.data, &counts, p, slots, [l, rows]));
        }
        errors.into_result()?;
        let specs = vec![OutputSpec::new(DType::F32, [rows, cout])];
        Ok((specs, ConvPlan { l, cin, cout, rows, shift, book: Book::Grouped(books) }))
    }

    fn execute(&self, r: ConvPlan, inputs: &Inputs<'_>, outputs: &mut Outputs<'_>, par: &dyn Parallel) -> Result<()> {
        let features = inputs.get::<f32>(FEATURES)?.data;
        let filters = inputs.get::<f32>(FILTERS)?.data;
        let bias = inputs.get_optional::<f32>(BIAS)?.map(|b| b.data);
        let pairs = inputs.get::<i32>(PAIRS)?.data;
        let out = outputs.take::<f32>(0)?;
        let (cin, cout) = (r.cin, r.cout);
        if out.len() != r.rows * cout || features.len() != r.l * cin || filters.len() % (cin * cout).max(1) != 0 {
            return Err(Error::Runtime("IndiceConv: buffers do not match the plan".into()));
        }
        if out.is_empty() {
            return Ok(());
        }
        let tile_rows = 1usize << r.shift;
        let tiles = r.tiles();
        // Tasks of whole tiles, about GRAIN multiply-adds each (any split gives the same bits).
        // (Saturating: with no pairs, Cin and Cout are bounded by no tensor's size.)
        let weight = |t: usize| r.tile_len(t).saturating_mul(cin.saturating_mul(cout)).saturating_add(tile_rows.saturating_mul(cout)) as u64;
        let work = (0..tiles).map(weight).fold(0u64, u64::saturating_add);
        let cuts = balanced_cuts((0..tiles).map(weight), pieces(usize::try_from(work).unwrap_or(usize::MAX), GRAIN));
        let bounds: Vec<usize> = cuts.iter().map(|&t| (t * tile_rows).min(r.rows) * cout).collect();
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
                let mut copy = scratch::filled(filters.len() + 15, 0f32, "IndiceConv's aligned filters")?;
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
            None => (CHUNK_BYTES / cin.saturating_add(cout).saturating_mul(size_of::<f32>())).max(1),
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
                let mut gathered = scratch::filled(blocks * cin, 0f32, "IndiceConv's gathered rows")?;
                let mut product = scratch::filled(blocks * cout, 0f32, "IndiceConv's product rows")?;
                // Index buffers only for grouped pairs (in-place chunks are the rulebook's).
                let indexed = if matches!(r.book, Book::Grouped(_)) { rows } else { 0 };
                let mut srcs = scratch::filled(indexed, 0i32, "IndiceConv's chunk")?;
                let mut dsts = scratch::filled(indexed, 0i32, "IndiceConv's chunk")?;
                for (t, block) in (cuts[task]..cuts[task + 1]).zip(part.chunks_mut(tile_rows.saturating_mul(cout))) {
                    match bias {
                        Some(bias) => block.chunks_exact_mut(cout).for_each(|row| copy_row(row, bias)),
                        None => block.fill(0.0),
                    }
                    if cin == 0 {
                        continue; // every product is an empty sum: the output is the bias
                    }
                    // One chunk: consecutive pairs of one offset k, at most chunk_rows, source
                    // rows and output rows (minus `base`, within the tile). Its source rows
                    // are gathered (unless they are consecutive rows) and multiplied by
                    // filters[k]; the product rows are added to their output rows in order.
                    let mut flush = |k: usize, srcs: &[i32], dsts: &[i32], base: i32, distinct: bool| {
                        let m = srcs.len();
                        let (s0, w) = (srcs[0] as usize, &filters[k * cin * cout..(k + 1) * cin * cout]);
                        #[cfg(not(target_arch = "x86_64"))]
                        let _ = distinct; // only the fused path uses it
                        #[cfg(target_arch = "x86_64")]
                        if let Some(fused) = fused {
                            fused.accumulate(cin, Chunk { srcs, dsts, base, distinct }, features, w, block);
                            return;
                        }
                        let lhs = if srcs.iter().enumerate().all(|(i, &s)| s as usize == s0 + i) {
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
                            for (o, &v) in block[d * cout..(d + 1) * cout].iter_mut().zip(prod) {
                                *o += v;
                            }
                        }
                    };
                    match &r.book {
                        Book::InPlace { reads, starts, p, counts, slots } => {
                            // A tile holding a destination starts below 2^31.
                            let first = i32::try_from(t << shift).unwrap_or(i32::MAX);
                            for (k, &how) in reads.iter().enumerate() {
                                let js = ConvPlan::in_place(starts, tiles, k, t);
                                let (src, dst) = offset_pairs(pairs, counts, *p, *slots, k, how);
                                let (src, dst) = (&src[js.clone()], &dst[js]);
                                // (Validated: sources in [0, L), destinations in this tile.)
                                for (src, dst) in src.chunks(chunk_rows).zip(dst.chunks(chunk_rows)) {
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
                            for pair in pieces.iter().flat_map(|p| &p.pairs[p.starts[t]..p.starts[t + 1]]) {
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
                }
                Ok(())
            })());
        });
        errors.into_result()
    }
}

/// Where offset k's pairs are read in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Its own, whose destinations strictly ascend.
    Own,
    /// Those of the mirror offset K - 1 - k with the slots swapped: the same set of pairs
    /// (checked), ascending by destination. A submanifold rulebook is symmetric this way:
    /// site a reaches site b at offset k exactly when b reaches a at the opposite offset,
    /// and each offset's pairs ascend by source, so the mirror's ascend by destination.
    Mirror,
}

/// What [`in_place`] found.
enum InPlace {
    /// Every offset can be read in place and every pair is in range: how to read each, and
    /// the tile starts of [`Book::InPlace`].
    Found(Vec<Read>, Vec<usize>),
    /// Some offset cannot (or the table of tile starts would be large against the
    /// rulebook): the pairs are grouped instead (which also finds any pair out of range).
    Unordered,
    /// A pair is out of range.
    OutOfRange,
}

/// The pairs of offset k as (sources, destinations), read as `how` says.
fn offset_pairs<'a>(data: &'a [i32], counts: &[usize], p: usize, slots: [usize; 2], k: usize, how: Read) -> (&'a [i32], &'a [i32]) {
    let (from, [s, d]) = match how {
        Read::Mirror => (counts.len() - 1 - k, [slots[1], slots[0]]),
        Read::Own => (k, slots),
    };
    let (n, base) = (counts[from], from * 2 * p);
    (&data[base + s * p..base + s * p + n], &data[base + d * p..base + d * p + n])
}

/// Whether `keys` strictly ascend, and if so the largest of `values` read as unsigned (a
/// negative index reads as >= 2^31), plus one (0 when empty): one pass, in blocks so that
/// it vectorises and a disorder stops it early.
fn ascending_end(keys: &[i32], values: &[i32]) -> Option<usize> {
    const BLOCK: usize = 256;
    let mut max = 0u32;
    for (i, v) in values.chunks(BLOCK).enumerate() {
        let k = &keys[i * BLOCK..(i * BLOCK + v.len() + 1).min(keys.len())];
        let ascending = k.iter().zip(&k[1..]).fold(true, |ok, (x, y)| ok & (x < y));
        if !ascending {
            return None;
        }
        max = v.iter().fold(max, |m, &x| m.max(x as u32));
    }
    Some(max as usize + usize::from(!values.is_empty()))
}

/// Whether `these` pairs are distinct (their sources strictly ascend) and each is one of
/// `mirror`'s, given that the mirror's destinations are distinct and its pairs in range:
/// the mirror's are written to `table` (one entry per output row, allocated on first use)
/// by destination, tagged with k so that a stale entry of another offset never matches,
/// and each of these is looked up.
fn mirror_matches(table: &mut Vec<u64>, rows: usize, k: usize, mirror: [&[i32]; 2], these: [&[i32]; 2]) -> Result<bool> {
    if table.is_empty() {
        *table = scratch::filled(rows, u64::MAX, "IndiceConv's mirror check")?;
    }
    let tag = |s: i32| (k as u64) << 32 | u64::from(s as u32);
    for (&s, &d) in mirror[0].iter().zip(mirror[1]) {
        table[d as usize] = tag(s);
    }
    // In blocks, so that a rulebook that is not symmetric stops early.
    let mut previous = None;
    for (src, dst) in these[0].chunks(256).zip(these[1].chunks(256)) {
        let mut ok = true;
        for (&s, &d) in src.iter().zip(dst) {
            ok &= previous < Some(s) && table.get(d as u32 as usize) == Some(&tag(s));
            previous = Some(s);
        }
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// How each offset can be read in place, checking the pairs' ranges on the way, and the
/// tile starts: one pass over each offset's pairs (a mirrored offset: three, one of them
/// reading a table of the output rows at random), offsets in parallel.
fn in_place(data: &[i32], counts: &[usize], p: usize, slots: [usize; 2], limits: [usize; 2], shift: u32, par: &dyn Parallel) -> Result<InPlace> {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let [l, rows] = limits;
    let tiles = rows.div_ceil(1 << shift);
    let total: usize = counts.iter().sum();
    // The table (K x (tiles + 1) positions) stays well below the grouped copy's size.
    let len = counts.len().checked_mul(tiles + 1).filter(|&n| n <= total / 2 + 4096);
    let Some(len) = len else { return Ok(InPlace::Unordered) };
    // (Every entry is set below, or the answer is Unordered.)
    let mut reads = scratch::filled(counts.len(), Read::Own, "IndiceConv's offsets")?;
    let (unordered, invalid) = (AtomicBool::new(false), AtomicBool::new(false));
    let errors = FirstError::default();
    // A few offsets per task, which share one table for the mirror checks.
    let per_task = counts.len().div_ceil(MAX_PLAN_PIECES).max(1);
    // Strictly ascending destinations are in range when the first and last are.
    let in_rows = |d: &[i32]| d.first().is_none_or(|&d| d >= 0) && d.last().is_none_or(|&d| (d as usize) < rows);
    for_each_chunk_mut(par, &mut reads, per_task, |task, reads| {
        let mut table: Vec<u64> = Vec::new();
        for (i, read) in reads.iter_mut().enumerate() {
            if unordered.load(Relaxed) {
                return;
            }
            let k = task * per_task + i;
            let (src, dst) = offset_pairs(data, counts, p, slots, k, Read::Own);
            if let Some(src_end) = ascending_end(dst, src) {
                if src_end > l || !in_rows(dst) {
                    invalid.store(true, Relaxed);
                    return;
                }
                *read = Read::Own;
                continue;
            }
            // The mirror holds the same pairs when its count is the same, its pairs are
            // distinct with each destination once (destinations strictly ascend) and in
            // range, these pairs are distinct (sources strictly ascend) and each of them
            // is one of the mirror's (looked up by destination, so also in range).
            let (m_src, m_dst) = offset_pairs(data, counts, p, slots, k, Read::Mirror);
            let same = m_src.len() == src.len()
                && ascending_end(m_dst, m_src).is_some_and(|end| end <= l)
                && in_rows(m_dst)
                && match mirror_matches(&mut table, rows, k, [m_src, m_dst], [src, dst]) {
                    Ok(same) => same,
                    Err(e) => {
                        errors.record(Err(e));
                        false
                    }
                };
            if !same {
                unordered.store(true, Relaxed);
                return;
            }
            *read = Read::Mirror;
        }
    });
    errors.into_result()?;
    if unordered.into_inner() {
        return Ok(InPlace::Unordered);
    }
    if invalid.into_inner() {
        return Ok(InPlace::OutOfRange);
    }
    let mut starts = scratch::filled(len, 0usize, "IndiceConv's tile starts")?;
    for_each_chunk_mut(par, &mut starts, tiles + 1, |k, row| {
        let (_, dst) = offset_pairs(data, counts, p, slots, k, reads[k]);
        let mut j = 0;
        for (t, slot) in row.iter_mut().enumerate() {
            let first = t << shift;
            j += dst[j..].partition_point(|&d| (d as usize) < first);
            *slot = j;
        }
    });
    Ok(InPlace::Found(reads, starts))
}

/// dst[m, cout] = lhs[m, cin] @ w[cin, cout] (row-major), one single-threaded GEMM.
/// (Public for benches/indice_conv.rs, which times the kernel's own call.)
#[doc(hidden)]
pub fn gemm_rows(m: usize, cin: usize, cout: usize, lhs: &[f32], w: &[f32], dst: &mut [f32]) {
    assert!(lhs.len() == m * cin && w.len() == cin * cout && dst.len() == m * cout);
    // SAFETY: row-major lhs [m, cin] (row stride cin), w [cin, cout] (row stride cout) and
    // dst [m, cout] (row stride cout), sizes checked just above; dst does not alias the
    // inputs (a distinct &mut). read_dst = false: dst = 1 * lhs @ w, single-threaded.
    unsafe {
        gemm::gemm(
            m,
            cout,
            cin,
            dst.as_mut_ptr(),
            1,
            cout as isize,
            false,
            lhs.as_ptr(),
            1,
            cin as isize,
            w.as_ptr(),
            1,
            cout as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Proof that this CPU has AVX-512F and that Cout is 16, 32, 64 or 128: only
/// [`Fused::detect`] makes one. At those widths a chunk's products are accumulated straight
/// into the output rows (no gathered block, no product block, no adds): at 16-64 the
/// gathers and adds around a GEMM took about as long as the GEMM (benches/indice_conv.rs).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Fused {
    /// Vectors of 16 floats per column block (1, 2 or 4).
    vectors: usize,
    cout: usize,
}

#[cfg(target_arch = "x86_64")]
impl Fused {
    fn detect(cout: usize) -> Option<Self> {
        // std caches the CPU's features after the first query. Cout 128 is four blocks of 32
        // columns (benches/indice_conv.rs at 128 -> 128: 5% faster than the GEMM path; two
        // blocks of 64, 15% slower).
        let vectors = match cout {
            16 | 32 | 64 => cout / 16,
            128 => 2,
            _ => return None,
        };
        std::arch::is_x86_feature_detected!("avx512f").then_some(Fused { vectors, cout })
    }

    /// block[d - base] += features[s] @ w for each pair (s, d) of one offset k: each output
    /// element gets x[s, i] * w[i, c] added for i = 0, 1, ..., one fused multiply-add (one
    /// rounding) each, pair after pair in the chunk's order, one column block after another.
    /// Pairs are taken 8, 8 or 4 at a time (blocks of 16, 32, 64 columns: 8-16 vector
    /// registers of rows, enough to hide the multiply-adds' latency; 16 pairs of 16 columns,
    /// whose row pointers no longer fit the registers, measured 3-4% slower) when their
    /// output rows are distinct (a rulebook from GetIndicePairs never repeats one within an
    /// offset; where a group would, or the chunk ends first, `fused_groups` takes fewer
    /// pairs, down to one, so each pair still adds in order). `distinct`: the caller knows
    /// the output rows are distinct (a strictly ascending offset), so groups are not
    /// checked. (A group holding one row twice would lose one of its two sums: a wrong
    /// result, but every access stays within the asserted rows.)
    fn accumulate(self, cin: usize, chunk: Chunk<'_>, features: &[f32], w: &[f32], block: &mut [f32]) {
        let (cout, Chunk { srcs, dsts, base, .. }) = (self.cout, chunk);
        assert!(w.len() == cin * cout && srcs.len() == dsts.len() && cout.is_multiple_of(16 * self.vectors));
        let (l, rows) = (features.len() / cin.max(1), block.len() / cout);
        // SAFETY: `self` exists only on a CPU with AVX-512F.
        assert!(unsafe { all_below(srcs, 0, l) } || cin == 0);
        // SAFETY: as above.
        assert!(unsafe { all_below(dsts, base, rows) });
        for col in (0..cout).step_by(16 * self.vectors) {
            let at = Columns { cout, col };
            match self.vectors {
                // SAFETY: `self` exists only on a CPU with AVX-512F; every source row, output
                // row and the filters are in bounds (asserted above), and the block of
                // columns lies within Cout (a multiple of its width).
                1 => unsafe { fused_groups::<1, 8>(cin, chunk, features, w, block, at) },
                2 => unsafe { fused_groups::<2, 8>(cin, chunk, features, w, block, at) },
                4 => unsafe { fused_groups::<4, 4>(cin, chunk, features, w, block, at) },
                // `detect` makes only these three.
                v => unreachable!("IndiceConv's fused path has no kernel for {v} vectors per block"),
            }
        }
    }
}

/// Whether every `v - base` (wrapping, read as unsigned) is below `limit`: a fold of
/// comparisons, vectorised with AVX-512 (it runs once per chunk).
/// SAFETY (caller): AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn all_below(v: &[i32], base: i32, limit: usize) -> bool {
    // (Rows are below 2^31: a limit beyond u32 can be taken as u32::MAX.)
    let limit = u32::try_from(limit).unwrap_or(u32::MAX);
    v.iter().fold(true, |ok, &x| ok & ((x.wrapping_sub(base) as u32) < limit))
}

/// One chunk's pairs: source rows, output rows (row `d - base` of the tile's block), and
/// whether the caller knows those output rows to be distinct.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Chunk<'a> {
    srcs: &'a [i32],
    dsts: &'a [i32],
    base: i32,
    distinct: bool,
}

/// A block of 16Z columns starting at `col` of rows (and filter rows) of `cout` floats.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Columns {
    cout: usize,
    col: usize,
}

/// [`Fused::accumulate`] for one block of Z vectors, P pairs at a time, or P / 2, P / 4, ...
/// 1 where the next P pairs run out or repeat an output row (the bits do not depend on it).
/// SAFETY (caller): AVX-512F; col + 16Z <= cout; w holds cin * cout floats; every (s + 1) *
/// cin <= features.len() and every (d - base + 1) * cout <= block.len().
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fused_groups<const Z: usize, const P: usize>(cin: usize, chunk: Chunk<'_>, features: &[f32], w: &[f32], block: &mut [f32], at: Columns) {
    let Chunk { srcs, dsts, base, distinct } = chunk;
    let (x, out) = (features.as_ptr(), block.as_mut_ptr());
    let mut j = 0;
    while j < srcs.len() {
        let mut n = P.min(srcs.len() - j).next_power_of_two();
        while n > 1 && !(j + n <= srcs.len() && (distinct || (1..n).all(|a| !dsts[j..j + a].contains(&dsts[j + a])))) {
            n /= 2;
        }
        // SAFETY: the caller's bounds hold for every pair, and j + n <= srcs.len().
        unsafe {
            match n {
                8 => fused_pairs::<Z, 8>(cin, &srcs[j..], &dsts[j..], base, x, out, w, at),
                4 => fused_pairs::<Z, 4>(cin, &srcs[j..], &dsts[j..], base, x, out, w, at),
                2 => fused_pairs::<Z, 2>(cin, &srcs[j..], &dsts[j..], base, x, out, w, at),
                _ => fused_pairs::<Z, 1>(cin, &srcs[j..], &dsts[j..], base, x, out, w, at),
            }
        }
        j += n;
    }
}

/// The first N pairs of srcs / dsts through [`fused_group`].
/// SAFETY (caller): as [`fused_groups`]'; at least N pairs. (Their output rows should be
/// distinct for the right sums; repeated ones stay in bounds.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn fused_pairs<const Z: usize, const N: usize>(cin: usize, srcs: &[i32], dsts: &[i32], base: i32, x: *const f32, out: *mut f32, w: &[f32], at: Columns) {
    // SAFETY: the caller's bounds hold for these N pairs and this block of columns.
    unsafe {
        let rows = std::array::from_fn(|p| out.add(dsts[p].wrapping_sub(base) as u32 as usize * at.cout + at.col));
        fused_group::<Z, N>(cin, std::array::from_fn(|p| x.add(srcs[p] as u32 as usize * cin)), rows, w.as_ptr().add(at.col), at.cout)
    }
}

/// out[p] += x[p] @ w for P pairs, the P output rows' 16Z floats held in registers while
/// the cin products are added in i order; filter row i starts at w + i * stride.
/// SAFETY (caller): AVX-512F; each x[p] readable for cin floats, each out[p] readable and
/// writable for 16Z floats (all rows are loaded before any is stored, so a repeated row
/// loses a sum but touches nothing else), w + i * stride for 16Z floats for every i < cin.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn fused_group<const Z: usize, const P: usize>(cin: usize, x: [*const f32; P], out: [*mut f32; P], w: *const f32, stride: usize) {
    use std::arch::x86_64::{_mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_storeu_ps};
    // SAFETY: every pointer stays within the rows the caller vouches for.
    unsafe {
        let mut acc: [[_; Z]; P] = std::array::from_fn(|p| std::array::from_fn(|z| _mm512_loadu_ps(out[p].add(16 * z))));
        for i in 0..cin {
            let wi: [_; Z] = std::array::from_fn(|z| _mm512_loadu_ps(w.add(i * stride + 16 * z)));
            for (row, xp) in acc.iter_mut().zip(x) {
                let xi = _mm512_set1_ps(*xp.add(i));
                for (a, wz) in row.iter_mut().zip(wi) {
                    *a = _mm512_fmadd_ps(xi, wz, *a);
                }
            }
        }
        for (row, op) in acc.iter().zip(out) {
            for (z, &a) in row.iter().enumerate() {
                _mm512_storeu_ps(op.add(16 * z), a);
            }
        }
    }
}

/// `dst.copy_from_slice(src)` for short rows, inlined in 16-float pieces (a call to memcpy
/// per 64-512 byte row costs about as much as the copy).
#[inline(always)]
fn copy_row(dst: &mut [f32], src: &[f32]) {
    let mut d = dst.chunks_exact_mut(16);
    let mut s = src.chunks_exact(16);
    for (d, s) in (&mut d).zip(&mut s) {
        let s: &[f32; 16] = s.try_into().expect("16 floats");
        d.copy_from_slice(s);
    }
    for (d, &s) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d = s;
    }
}

/// The error of the first pair out of range, in (k, slot, j) order: for each k, its source
/// slot, then its destination slot (the order of the value rules).
fn first_bad_pair(inputs: &Inputs<'_>, data: &[i32], counts: &[usize], p: usize, slots: [usize; 2], limits: [usize; 2]) -> Error {
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
fn pair_error(inputs: &Inputs<'_>, k: usize, slot: usize, j: usize, value: i32, limit: usize, source: bool) -> Error {
    let row = if slot == 0 { "input row (slot 0)" } else { "output row (slot 1)" };
    let what = if source { "L (features' rows)" } else { "num_out (out_indices' rows)" };
    inputs.error(PAIRS, format!("indice_pairs[{k}, {slot}, {j}] = {value} ({row}) is outside [0, {limit}) with {limit} = {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How `in_place` reads a rulebook of offsets given as (slot 0, slot 1), P = 4 (padded
    /// with -1), L = num_out = 4, one tile.
    fn reads_of(offsets: &[(&[i32], &[i32])], slots: [usize; 2]) -> Option<Vec<Read>> {
        let pad = |v: &[i32]| (0..4).map(|j| v.get(j).copied().unwrap_or(-1)).collect::<Vec<_>>();
        let data: Vec<i32> = offsets.iter().flat_map(|&(a, b)| [pad(a), pad(b)].concat()).collect();
        let counts: Vec<usize> = offsets.iter().map(|o| o.0.len()).collect();
        match in_place(&data, &counts, 4, slots, [4, 4], 4, &crate::parallel::Serial).expect("no allocation fails") {
            InPlace::Found(reads, starts) => {
                // One tile: each offset's range is all of its pairs.
                assert_eq!(starts, counts.iter().flat_map(|&n| [0, n]).collect::<Vec<_>>());
                Some(reads)
            }
            InPlace::Unordered => None,
            InPlace::OutOfRange => Some(vec![]),
        }
    }

    /// [`reads_of`] for K = 3: offsets 0 and 2 of two pairs, offset 1 of four.
    fn reads(k0: [[i32; 2]; 2], k1: [[i32; 4]; 2], k2: [[i32; 2]; 2], counts: [usize; 3], slots: [usize; 2]) -> Option<Vec<Read>> {
        let (k0, k2) = ([&k0[0][..counts[0]], &k0[1][..counts[0]]], [&k2[0][..counts[2]], &k2[1][..counts[2]]]);
        reads_of(&[(k0[0], k0[1]), (&k1[0][..counts[1]], &k1[1][..counts[1]]), (k2[0], k2[1])], slots)
    }

    #[test]
    fn offsets_are_read_in_place_directly_or_through_a_mirror_holding_the_same_pairs() {
        use Read::{Mirror, Own};
        // Submanifold over sites x = 5, 3, 4, 9 (rows 0-3), kernel 3 along x: offset 0
        // maps x to x + 1 (rows 1 -> 2, 2 -> 0), offset 2 to x - 1 (0 -> 2, 2 -> 1), each
        // ascending by source; offset 1 is the identity.
        let (k0, k1, k2) = ([[1, 2], [2, 0]], [[0, 1, 2, 3], [0, 1, 2, 3]], [[0, 2], [2, 1]]);
        assert_eq!(reads(k0, k1, k2, [2, 4, 2], [0, 1]), Some(vec![Mirror, Own, Mirror]));
        // Inverse (slots swapped): the destinations ([1, 2] and [0, 2]) ascend themselves.
        assert_eq!(reads(k0, k1, k2, [2, 4, 2], [1, 0]), Some(vec![Own, Own, Own]));
        assert_eq!(reads([[2, 0], [1, 2]], k1, [[2, 1], [0, 2]], [2, 4, 2], [1, 0]), Some(vec![Mirror, Own, Mirror]));
        // The mirror differs by one pair, or holds one pair more: grouped instead.
        assert_eq!(reads(k0, k1, [[0, 2], [3, 1]], [2, 4, 2], [0, 1]), None);
        assert_eq!(reads(k0, k1, [[0, 3], [2, 1]], [2, 4, 2], [0, 1]), None);
        assert_eq!(reads(k0, k1, k2, [1, 4, 2], [0, 1]), None);
        // A repeated pair (sources not strictly ascending), though each is in the mirror,
        // whose own destinations ascend.
        assert_eq!(reads([[1, 1], [1, 1]], k1, [[0, 1], [0, 1]], [2, 4, 2], [0, 1]), None);
        // The mirror holds these pairs and one more (its own check then fails too).
        assert_eq!(reads_of(&[(&[1, 2], &[2, 0]), (&k1[0], &k1[1]), (&[0, 2, 3], &[2, 1, 3])], [0, 1]), None);
        // A mirror pair out of range: grouped (whose checks name it).
        assert_eq!(reads(k0, k1, [[0, 2], [2, 4]], [2, 4, 2], [0, 1]), None);
        // Out of range in an offset read directly.
        assert_eq!(reads(k0, [[0, 1, 2, 4], [0, 1, 2, 3]], k2, [2, 4, 2], [0, 1]), Some(vec![]));
        assert_eq!(reads(k0, [[0, 1, 2, -1], [0, 1, 2, 3]], k2, [2, 4, 2], [0, 1]), Some(vec![]));
        assert_eq!(reads(k0, [[0, 1, 2, 3], [0, 1, 2, 4]], k2, [2, 4, 2], [0, 1]), Some(vec![]));
        assert_eq!(reads(k0, [[0, 1, 2, 3], [-1, 1, 2, 3]], k2, [2, 4, 2], [0, 1]), Some(vec![]));
    }

    #[test]
    fn a_stale_mirror_entry_of_another_offset_never_matches() {
        // K = 9: one task checks offsets 0 and 1 with one table. Offset 1's pairs are those
        // of offset 0, whose mirror (8) left them in the table; its own mirror (7) holds
        // others. Untagged entries would let offset 1 through.
        type Offset<'a> = (&'a [i32], &'a [i32]);
        let (a, b): Offset = (&[1, 2], &[2, 0]);
        let (empty, seven, eight): (Offset, Offset, Offset) = ((&[], &[]), (&[1, 3], &[1, 3]), (&[0, 2], &[2, 1]));
        let offsets = [(a, b), (a, b), empty, empty, empty, empty, empty, seven, eight];
        assert_eq!(reads_of(&offsets, [0, 1]), None);
        // With offset 1 emptied (and its mirror, 7) the rest is read in place.
        let offsets = [(a, b), empty, empty, empty, empty, empty, empty, empty, eight];
        assert_eq!(reads_of(&offsets, [0, 1]), Some([vec![Read::Mirror], vec![Read::Own; 7], vec![Read::Mirror]].concat()));
    }

    #[test]
    fn tiles_follow_the_density_within_the_cache_bound() {
        // 100k rows, 16 channels, ~10 pairs per row over 27 offsets: 256 * 27 / 10 = 691 -> 512.
        assert_eq!(tile_shift(100_000, 16, 1_000_000, 27, 27), 9);
        // 128 channels cap the output block at 128 KiB = 256 rows.
        assert_eq!(tile_shift(10_000, 128, 10_000, 27, 27), 8);
        // Sparse: capped by the output block (2048 rows of 16 channels).
        assert_eq!(tile_shift(100_000, 16, 100_000, 27, 27), 11);
        // Dense: at least MIN_TILE_ROWS; no pairs: the cap; few rows: no larger than needed.
        assert_eq!(tile_shift(1000, 16, 1_000_000, 2, 27), 4);
        assert_eq!(tile_shift(1000, 16, 0, 0, 27), 10);
        assert_eq!(tile_shift(3, 16, 5, 1, 1), 4);
        assert_eq!(tile_shift(0, 0, 0, 0, 0), 4);
        assert_eq!(tile_shift(usize::MAX / 8, 1 << 20, usize::MAX / 8, 1, 1), 4);
        // k << shift must fit 32 bits: K = 2^30 leaves 2 bits, K = 2^32 none.
        assert_eq!(tile_shift(1000, 16, 0, 0, 1 << 30), 2);
        assert_eq!(tile_shift(1000, 16, 0, 0, 1 << 32), 0);
        assert_eq!(tile_shift(1000, 16, 0, 0, (1 << 28) + 1), 3);
    }
}
