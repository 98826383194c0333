//! IndiceConv's rulebook (what `plan` finds): the validated pairs by row tile, read in place
//! or grouped.

use super::*;

/// One valid pair: its source row, and its kernel offset k and destination row's place in
/// its tile packed as `k << shift | (dst - tile start)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Pair {
    pub(super) src: u32,
    pub(super) kd: u32,
}

/// The pairs of one consecutive piece of the (k, j) sequence, grouped by row tile.
#[derive(Debug, Default)]
pub(super) struct Piece {
    /// `pairs[starts[t]..starts[t + 1]]` are tile t's pairs of this piece, in (k, j) order.
    pub(super) starts: Vec<usize>,
    pub(super) pairs: Vec<Pair>,
}

/// How the execution finds a tile's pairs.
#[derive(Debug)]
pub(super) enum Book {
    /// Every offset's pairs are read in place, as `reads` says (own or mirror), ascending by
    /// destination: `starts[k * (tiles + 1) + t]` is the first of them whose destination is
    /// at or past tile t's first row. (Strictly ascending also means no output row repeats
    /// within an offset.)
    InPlace { reads: Vec<Read>, starts: Vec<usize> },
    /// Otherwise: a grouped copy, made in pieces.
    Grouped(Vec<Piece>),
}

/// The validated rulebook, by row tile: what `execute` needs beyond the sizes.
#[derive(Debug)]
pub struct Rulebook {
    /// log2 of the rows per tile: tile t holds output rows [t << shift, (t + 1) << shift).
    pub(super) shift: u32,
    /// The tiles of num_out rows.
    pub(super) tiles: usize,
    pub(super) book: Book,
}

impl Rulebook {
    /// Tile t's pairs of offset k read in place: the range of j.
    pub(super) fn in_place_range(
        starts: &[usize],
        tiles: usize,
        k: usize,
        t: usize,
    ) -> std::ops::Range<usize> {
        starts[k * (tiles + 1) + t]..starts[k * (tiles + 1) + t + 1]
    }

    pub(super) fn tile_len(&self, t: usize) -> usize {
        match &self.book {
            Book::InPlace { reads, starts, .. } => {
                (0..reads.len()).map(|k| Self::in_place_range(starts, self.tiles, k, t).len()).sum()
            }
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

pub(super) fn tile_shift_unbounded(rows: usize, cout: usize, total: usize, active: usize) -> u32 {
    let cap = (TILE_OUT_BYTES / (cout.max(1) * size_of::<f32>())).max(MIN_TILE_ROWS);
    let want = if total == 0 {
        cap
    } else {
        // rows * TILE_PAIRS_PER_OFFSET * active / total, in u128 (no overflow).
        let w = (rows as u128 * (TILE_PAIRS_PER_OFFSET * active) as u128).div_ceil(total as u128);
        usize::try_from(w).unwrap_or(usize::MAX)
    };
    let rows_per_tile = want
        .clamp(MIN_TILE_ROWS, cap)
        .min(rows.checked_next_power_of_two().unwrap_or(usize::MAX).max(MIN_TILE_ROWS));
    // Largest power of two not above it.
    usize::BITS - 1 - rows_per_tile.leading_zeros()
}

/// Where offset k's pairs are read in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Read {
    /// Its own, whose destinations strictly ascend.
    Own,
    /// Those of the mirror offset K - 1 - k with the slots swapped: the same set of pairs
    /// (checked), ascending by destination. A submanifold rulebook is symmetric this way:
    /// site a reaches site b at offset k exactly when b reaches a at the opposite offset,
    /// and each offset's pairs ascend by source, so the mirror's ascend by destination.
    Mirror,
}

/// What [`in_place`] found.
pub(super) enum InPlace {
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
pub(super) fn offset_pairs<'a>(
    data: &'a [i32],
    counts: &[usize],
    p: usize,
    slots: [usize; 2],
    k: usize,
    how: Read,
) -> (&'a [i32], &'a [i32]) {
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
pub(super) fn ascending_end(keys: &[i32], values: &[i32]) -> Option<usize> {
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
pub(super) fn mirror_matches(
    table: &mut Vec<u64>,
    rows: usize,
    k: usize,
    mirror: [&[i32]; 2],
    these: [&[i32]; 2],
) -> Result<bool> {
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
pub(super) fn in_place(
    data: &[i32],
    counts: &[usize],
    p: usize,
    slots: [usize; 2],
    limits: [usize; 2],
    shift: u32,
    par: &dyn Parallel,
) -> Result<InPlace> {
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
    let in_rows = |d: &[i32]| {
        d.first().is_none_or(|&d| d >= 0) && d.last().is_none_or(|&d| (d as usize) < rows)
    };
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
