//! The rulebooks: which input row reaches which output site through each kernel offset,
//! built (conv / transpose in parallel blocks, subm by a sorted site list) and written out
//! as `indice_pairs`.

use super::keys::{DenseSites, Key, Layout, SortedSites};
use super::*;
use crate::ops::radix::radix_sort;

// ---------------------------------------------------------------------------------------
// Per-axis output coordinates
// ---------------------------------------------------------------------------------------

/// One axis of a conv or transposed conv: which (tap, output coordinate) an input
/// coordinate reaches.
pub(super) enum AxisMap {
    /// o = (i + p - kk*d) / s when exact. With i = q*s + r (0 <= r < s) this is exact iff
    /// r == m_kk, and then o = q + j_kk; taps that no int32 coordinate can use are dropped,
    /// which keeps every per-row value in i64.
    Conv { s: u64, out: i64, taps: Vec<(u32, i64, i64)> },
    /// o = i*s - p + kk*d.
    Transpose { s: i128, p: i128, d: i128, k: u32, out: i128 },
}

impl AxisMap {
    pub(super) fn new(op: &GetIndicePairs, a: usize) -> Self {
        let (k, s, p, d, out) =
            (op.filter_space[a], op.stride[a], op.pad[a], op.dilation[a], op.output_space[a]);
        if op.transpose {
            return AxisMap::Transpose {
                s: s.into(),
                p: p.into(),
                d: d.into(),
                k: k as u32,
                out: out.into(),
            };
        }
        let mut taps = Vec::new();
        for kk in 0..k {
            let c = i128::from(p) - i128::from(kk) * i128::from(d);
            let m = (-c).rem_euclid(s.into());
            let j = (m + c) / i128::from(s);
            // r < 2^31 and q < 2^31, so m >= 2^31, j >= out or j <= -2^31 never yields a
            // valid o for an int32 input coordinate.
            if m <= i128::from(i32::MAX) && j < i128::from(out) && j > -(1i128 << 31) {
                taps.push((kk as u32, m as i64, j as i64));
            }
        }
        AxisMap::Conv { s: s as u64, out, taps }
    }

    /// Appends to `buf` the (tap, output coordinate) pairs of input coordinate `i` (>= 0).
    fn reach(&self, i: i32, buf: &mut Vec<(u32, u32)>) {
        buf.clear();
        match self {
            AxisMap::Conv { s, out, taps } => {
                let i = u64::from(i.unsigned_abs());
                let (q, r) = ((i / s) as i64, (i % s) as i64);
                for &(kk, m, j) in taps {
                    let o = q + j;
                    if m == r && (0..*out).contains(&o) {
                        buf.push((kk, o as u32));
                    }
                }
            }
            AxisMap::Transpose { s, p, d, k, out } => {
                let base = i128::from(i) * s - p;
                for kk in 0..*k {
                    let o = base + i128::from(kk) * d;
                    if (0..*out).contains(&o) {
                        buf.push((kk, o as u32));
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Building the rulebooks (`find`)
// ---------------------------------------------------------------------------------------

/// Conv / transpose rulebook: per kernel offset, the input rows (ascending) and the key of
/// each row's output site; and the sorted unique output sites.
pub(super) struct ConvBook<K> {
    layout: Layout,
    /// What each block of input rows emitted, in row order.
    pub(super) blocks: Vec<Emitted<K>>,
    pub(super) sites: Sites<K>,
}

/// The unique output sites: sorted keys, or (a small output grid) a bitmap of it, whose
/// emitted keys are then grid indices.
pub(super) enum Sites<K> {
    Sorted(SortedSites<K>),
    Dense(DenseSites),
}

impl<K: Key> Sites<K> {
    pub(super) fn len(&self) -> usize {
        match self {
            Sites::Sorted(s) => s.keys.len(),
            Sites::Dense(d) => d.len(),
        }
    }

    /// The position of an emitted key among the sites.
    fn find(&self, key: K) -> Option<usize> {
        match self {
            Sites::Sorted(s) => s.find(key),
            Sites::Dense(d) => d.find(key.digit(0, usize::MAX) as u64),
        }
    }

    /// Lookup ahead of time, first step (see [`SortedSites::prefetch_entry`]).
    fn prefetch_entry(&self, key: K) {
        match self {
            Sites::Sorted(s) => s.prefetch_entry(key),
            Sites::Dense(d) => d.prefetch(key.digit(0, usize::MAX) as u64),
        }
    }

    /// Second step (a dense lookup has none).
    fn prefetch_keys(&self, key: K) {
        if let Sites::Sorted(s) = self {
            s.prefetch_keys(key);
        }
    }
}

/// What one block of consecutive input rows emits: per kernel offset, its rows (ascending)
/// and the key of each row's output site (its grid index with the bitmap). Without the
/// bitmap, until the sites are sorted, also the same keys grouped by key prefix: prefix
/// p's keys are `by_prefix[starts[p]..starts[p + 1]]`.
pub(super) struct Emitted<K> {
    pub(super) rows: Vec<Vec<u32>>,
    pub(super) keys: Vec<Vec<K>>,
    by_prefix: Vec<K>,
    starts: Vec<usize>,
}

impl<K> Emitted<K> {
    fn empty() -> Self {
        Emitted { rows: Vec::new(), keys: Vec::new(), by_prefix: Vec::new(), starts: Vec::new() }
    }

    /// The keys under prefixes `prefixes` (empty if out of range).
    fn keys_under(&self, prefixes: std::ops::Range<usize>) -> &[K] {
        let span = self.starts.get(prefixes.start).zip(self.starts.get(prefixes.end));
        span.and_then(|(&a, &b)| self.by_prefix.get(a..b)).unwrap_or_default()
    }
}

/// Subm rulebook: the input sites sorted by key (unique), with their rows.
pub(super) struct SubmBook<K> {
    layout: Layout,
    pub(super) sites: Vec<(K, u32)>,
    /// Largest coordinate present per spatial axis: targets beyond it cannot be active.
    max: [i64; DIM_NB],
    /// Per axis, the coordinate shift o - i = p - kk*d of each tap, or None if it exceeds
    /// the largest coordinate (no two active sites are that far apart).
    taps: [Vec<Option<i64>>; DIM_NB],
    /// Unit dilation on x: the taps of an (kz, ky) pair are one contiguous x window.
    x_window: Option<i64>,
}

impl GetIndicePairs {
    pub(super) fn conv_book<K: Key>(
        &self,
        data: &[i32],
        max_batch: u32,
        par: &dyn Parallel,
    ) -> Result<ConvBook<K>> {
        // A bitmap of the output grid (8 bytes per word, and 4 of rank) of at most a quarter
        // word per pair the rows can emit (3 bytes; an emitted pair takes 8-24): its memory
        // and its scans stay within the pairs' own. A row reaches at most k outputs per axis
        // (ceil(k / s) with stride s > 1, which the contract allows only with dilation 1).
        let per_row = (0..DIM_NB)
            .map(|a| {
                let (k, s) = (self.filter_space[a] as usize, self.stride[a] as usize);
                if self.transpose { k } else { k.div_ceil(s.max(1)) }
            })
            .fold(1usize, usize::saturating_mul);
        let dense_words = (data.len() / 4).saturating_mul(per_row) / 4;
        self.conv_book_in(
            data,
            max_batch,
            par,
            EMIT_ROWS,
            SORT_KEYS,
            dense_words.max(DENSE_MIN_WORDS),
        )
    }

    /// The conv rulebook, built in parallel: blocks of `emit_rows` input rows emit their
    /// pairs. With an output grid of at most `dense_words` 64-bit words, each pair marks
    /// its site in a bitmap of the grid ([`DenseSites`]); otherwise the key space is cut (at
    /// key prefixes) into ranges of about `sort_keys` emitted keys, each sorted and
    /// deduplicated on its own, and the ranges in order are the sorted unique sites. The
    /// rulebook does not depend on any of the three sizes.
    pub(super) fn conv_book_in<K: Key>(
        &self,
        data: &[i32],
        max_batch: u32,
        par: &dyn Parallel,
        emit_rows: usize,
        sort_keys: usize,
        dense_words: usize,
    ) -> Result<ConvBook<K>> {
        let o = self.output_space;
        // Output extents are in [1, i32::MAX].
        let dims = [u64::from(max_batch) + 1, o[0] as u64, o[1] as u64, o[2] as u64];
        let dense = DenseSites::new(dims, dense_words)?;
        // Output coordinates are < output_space <= i32::MAX.
        let layout =
            Layout::new([max_batch, (o[0] - 1) as u32, (o[1] - 1) as u32, (o[2] - 1) as u32]);
        let maps: [AxisMap; DIM_NB] = std::array::from_fn(|a| AxisMap::new(self, a));
        let kernel_volume = self.kernel_volume();
        let (kh, kw) = (self.filter_space[1] as usize, self.filter_space[2] as usize);
        let prefix_bits = layout.bits.min(SPLIT_BITS);
        let (shift, prefix_mask) = (layout.bits - prefix_bits, (1usize << prefix_bits) - 1);
        // The pairs a block emits are only known by emitting them (up to K per row): their
        // buffers grow without the allocator's abort when memory runs out.
        const PAIRS: &str = "the conv rulebook's pairs";
        let emit = |first: usize, block: &[i32]| -> Result<Emitted<K>> {
            let mut e = Emitted {
                rows: vec![Vec::new(); kernel_volume],
                keys: vec![Vec::new(); kernel_volume],
                by_prefix: Vec::new(),
                // (Prefix counts only for the sort: the bitmap needs none.)
                starts: if dense.is_some() { Vec::new() } else { vec![0; prefix_mask + 2] },
            };
            let mut reach: [Vec<(u32, u32)>; DIM_NB] = Default::default();
            'rows: for (r, row) in rows4(block).enumerate() {
                for a in 0..DIM_NB {
                    maps[a].reach(row[a + 1], &mut reach[a]);
                    if reach[a].is_empty() {
                        continue 'rows;
                    }
                }
                for &(kz, oz) in &reach[0] {
                    for &(ky, oy) in &reach[1] {
                        let base = (kz as usize * kh + ky as usize) * kw;
                        for &(kx, ox) in &reach[2] {
                            let k = base + kx as usize;
                            let site = [row[0] as u32, oz, oy, ox];
                            let key = match &dense {
                                Some(grid) => K::from(grid.mark(site)),
                                None => {
                                    let key = K::pack(&layout, site);
                                    if let Some(n) =
                                        e.starts.get_mut(key.digit(shift, prefix_mask) + 1)
                                    {
                                        *n += 1;
                                    }
                                    key
                                }
                            };
                            if let (Some(rs), Some(ks)) = (e.rows.get_mut(k), e.keys.get_mut(k)) {
                                // first + r < L <= i32::MAX (checked in plan).
                                scratch::push(rs, (first + r) as u32, PAIRS)?;
                                scratch::push(ks, key, PAIRS)?;
                            }
                        }
                    }
                }
            }
            if dense.is_some() {
                return Ok(e); // no grouping by prefix: the bitmap holds the sites
            }
            // Group the keys by prefix: starts[p + 1] holds prefix p's count until here.
            for p in 1..e.starts.len() {
                e.starts[p] += e.starts[p - 1];
            }
            let mut next = e.starts.clone();
            let Some(&first_key) = e.keys.iter().flatten().next() else { return Ok(e) };
            e.by_prefix = scratch::filled(e.starts.last().copied().unwrap_or(0), first_key, PAIRS)?;
            for &key in e.keys.iter().flatten() {
                if let Some(at) = next.get_mut(key.digit(shift, prefix_mask)) {
                    if let Some(slot) = e.by_prefix.get_mut(*at) {
                        *slot = key;
                    }
                    *at += 1;
                }
            }
            Ok(e)
        };
        let mut blocks: Vec<Emitted<K>> = Vec::new();
        blocks.resize_with(pieces(data.len() / 4, emit_rows), Emitted::empty);
        let block_len = (data.len() / 4).div_ceil(blocks.len()) * 4;
        let errors = FirstError::default();
        for_each_chunk_mut(par, &mut blocks, 1, |b, slot| {
            if let (Some(e), Some(rows)) = (slot.first_mut(), data.chunks(block_len.max(4)).nth(b))
            {
                errors.record(emit(b * block_len / 4, rows).map(|emitted| *e = emitted));
            }
        });
        errors.into_result()?;
        if let Some(mut grid) = dense {
            grid.finish()?;
            return Ok(ConvBook { sites: Sites::Dense(grid), layout, blocks });
        }

        // Key ranges of about `sort_keys` emitted keys each, cut at prefix boundaries.
        let mut counts = vec![0usize; prefix_mask + 1];
        for e in &blocks {
            for (c, w) in counts.iter_mut().zip(e.starts.windows(2)) {
                *c += w[1] - w[0];
            }
        }
        let cuts =
            balanced_cuts(counts.iter().map(|&c| c as u64), pieces(counts.iter().sum(), sort_keys));
        let mut ranges: Vec<Vec<K>> = vec![Vec::new(); cuts.len() - 1];
        let errors = FirstError::default();
        for_each_chunk_mut(par, &mut ranges, 1, |t, slot| {
            let (Some(out), Some(&lo), Some(&hi)) =
                (slot.first_mut(), cuts.get(t), cuts.get(t + 1))
            else {
                return;
            };
            errors.record((|| {
                let mut keys = Vec::new();
                scratch::reserve(
                    &mut keys,
                    counts.get(lo..hi).map_or(0, |c| c.iter().sum()),
                    "the output sites' keys",
                )?;
                for e in &blocks {
                    keys.extend_from_slice(e.keys_under(lo..hi));
                }
                radix_sort(&mut keys, layout.bits, |&k| k)?;
                keys.dedup();
                *out = keys;
                Ok(())
            })());
        });
        errors.into_result()?;
        for e in &mut blocks {
            e.by_prefix = Vec::new();
        }
        let mut sites = Vec::new();
        scratch::reserve(&mut sites, ranges.iter().map(Vec::len).sum(), "the output sites' keys")?;
        for range in ranges {
            sites.extend_from_slice(&range);
        }
        Ok(ConvBook { sites: Sites::Sorted(SortedSites::new(sites, layout.bits)?), layout, blocks })
    }

    pub(super) fn subm_book<K: Key>(
        &self,
        inputs: &Inputs<'_>,
        data: &[i32],
        max: [u32; 4],
    ) -> Result<SubmBook<K>> {
        let layout = Layout::new(max);
        let mut sites = scratch::collect(
            rows4(data)
                .enumerate()
                .map(|(r, row)| (K::pack(&layout, row.map(|v| v as u32)), r as u32)),
            "the sorted input sites",
        )?;
        // Stable: equal sites keep ascending rows, so a duplicate is reported by its rows.
        radix_sort(&mut sites, layout.bits, |s| s.0)?;
        if let Some(w) = sites.windows(2).find(|w| w[0].0 == w[1].0) {
            let (a, b) = (w[0].1 as usize, w[1].1 as usize);
            let site: Vec<i32> = data.get(a * 4..a * 4 + 4).map_or_else(Vec::new, <[i32]>::to_vec);
            return Err(inputs.error(
                INDICES,
                format!("rows {a} and {b} hold the same site {site:?} (batch, z, y, x): duplicate input sites are not allowed in subm mode"),
            ));
        }
        let max3 = [i64::from(max[1]), i64::from(max[2]), i64::from(max[3])];
        // Stride 1: o = i + p - kk*d.
        let taps: [Vec<Option<i64>>; DIM_NB] = std::array::from_fn(|a| {
            (0..self.filter_space[a])
                .map(|kk| {
                    let shift =
                        i128::from(self.pad[a]) - i128::from(kk) * i128::from(self.dilation[a]);
                    (shift.abs() <= i128::from(max3[a])).then_some(shift as i64)
                })
                .collect()
        });
        // With d = 1 the x taps cover [x - p, x + p] one by one (p = (kw - 1) / 2 <= 2047).
        let x_window = (self.dilation[2] == 1).then_some(self.pad[2]);
        Ok(SubmBook { layout, sites, max: max3, taps, x_window })
    }
}

// ---------------------------------------------------------------------------------------
// Writing `indice_pairs` out (`execute`)
// ---------------------------------------------------------------------------------------

/// Fills `indice_pairs[k]` (`chunk`, 2L values) for one conv kernel offset. Returns false if
/// an emitted key is missing from the unique sites (a bug, not an input error).
pub(super) fn conv_offset<K: Key>(book: &ConvBook<K>, k: usize, chunk: &mut [i32]) -> bool {
    let l = chunk.len() / 2;
    let (ins, outs) = chunk.split_at_mut(l);
    let mut n = 0;
    let mut ok = true;
    for e in &book.blocks {
        let (Some(rows), Some(keys)) = (e.rows.get(k), e.keys.get(k)) else { return false };
        let (Some(ins), Some(outs)) = (ins.get_mut(n..), outs.get_mut(n..)) else { return false };
        for (p, ((i, o), (&r, &key))) in
            ins.iter_mut().zip(outs.iter_mut()).zip(rows.iter().zip(keys)).enumerate()
        {
            // The keys come in row order, so lookups land anywhere in the sites: fetch the
            // table entry LOOKUP_AHEAD * 2 pairs ahead and the keys it points to LOOKUP_AHEAD.
            if let Some(&ahead) = keys.get(p + 2 * LOOKUP_AHEAD) {
                book.sites.prefetch_entry(ahead);
            }
            if let Some(&ahead) = keys.get(p + LOOKUP_AHEAD) {
                book.sites.prefetch_keys(ahead);
            }
            *i = r as i32;
            *o = match book.sites.find(key) {
                // Positions are < num_out <= K * L <= i32::MAX.
                Some(p) => p as i32,
                None => {
                    ok = false;
                    -1
                }
            };
        }
        n += rows.len();
    }
    // Each row has at most one pair per offset, so n <= L.
    ins.get_mut(n..).unwrap_or_default().fill(-1);
    outs.get_mut(n..).unwrap_or_default().fill(-1);
    ok && n <= l
}

/// Pairs of the subm offsets (kz, ky, 0..kw): calls `set(kx, row, to)` where input row
/// `row` reaches the active site of row `to` through tap (kz, ky, kx).
///
/// The sites are walked once in key order. For a fixed (kz, ky) the targets of a site lie
/// in one x line (sites sharing batch, z and y), found once per source line, and the start
/// of that line window increases with the source key (adding fixed in-range shifts never
/// carries between key fields), so each search pointer only moves forward: a merge join,
/// O(L + pairs) for all kw offsets together. (With dilation > 1 on x, one pointer per x
/// tap.)
pub(super) fn subm_line<K: Key>(
    book: &SubmBook<K>,
    dz: i64,
    dy: i64,
    mut set: impl FnMut(usize, usize, i32),
) {
    let (sites, layout, max) = (&book.sites, &book.layout, book.max);
    let x_mask = layout.x_mask();
    let x_of = |key: K| key.digit(0, x_mask as usize) as i64;
    // The key (x = 0) of the target line of a site or line (b, z, y, _), when in range.
    let target = |c: [u32; 4]| {
        let (tz, ty) = (i64::from(c[1]) + dz, i64::from(c[2]) + dy);
        ((0..=max[0]).contains(&tz) && (0..=max[1]).contains(&ty))
            .then(|| K::pack(layout, [c[0], tz as u32, ty as u32, 0]))
    };
    match book.x_window {
        Some(p) => {
            // The target line (x = 0) of the current source line, found once per line.
            let (mut j, mut line, mut target_line) = (0, None, None);
            for &(key, row) in sites {
                let x = x_of(key);
                let this = key.without_x(x_mask);
                if line != Some(this) {
                    line = Some(this);
                    target_line = target(this.unpack(layout));
                }
                let Some(goal) = target_line else { continue };
                // x values in [0, max[2]] fit the x mask.
                let (start, end) =
                    (goal.with_x((x - p).max(0) as u32), goal.with_x((x + p).min(max[2]) as u32));
                while sites.get(j).is_some_and(|s| s.0 < start) {
                    j += 1;
                }
                // At most kw active sites lie in the window (sites are unique).
                for &(found, to) in sites[j.min(sites.len())..].iter().take_while(|s| s.0 <= end) {
                    set((x + p - x_of(found)) as usize, row as usize, to as i32);
                }
            }
        }
        None => {
            let x_taps: Vec<(usize, i64)> =
                book.taps[2].iter().enumerate().filter_map(|(kx, t)| Some((kx, (*t)?))).collect();
            let mut ptrs = vec![0usize; x_taps.len()];
            for &(key, row) in sites {
                let c = key.unpack(layout);
                let Some(line) = target(c) else { continue };
                let x = i64::from(c[3]);
                for (&(kx, dx), ptr) in x_taps.iter().zip(ptrs.iter_mut()) {
                    let tx = x + dx;
                    if !(0..=max[2]).contains(&tx) {
                        continue;
                    }
                    let goal = line.with_x(tx as u32);
                    while *ptr < sites.len() && sites[*ptr].0 < goal {
                        *ptr += 1;
                    }
                    if let Some(&(_, to)) = sites.get(*ptr).filter(|s| s.0 == goal) {
                        set(kx, row as usize, to as i32);
                    }
                }
            }
        }
    }
}

/// Turns `outs[row]` (the output row of each input row, or -1) into the pairs of one
/// offset, ascending by input row, then -1; returns the pair count.
pub(super) fn compact(ins: &mut [i32], outs: &mut [i32]) -> usize {
    let mut n = 0;
    for r in 0..ins.len().min(outs.len()) {
        let to = outs[r];
        // Branch-free: always write, advance only for a pair. n <= r, so the slot written
        // has already been read.
        ins[n] = r as i32;
        outs[n] = to;
        n += usize::from(to >= 0);
    }
    ins[n..].fill(-1);
    outs[n..].fill(-1);
    n
}

pub(super) fn write_conv<K: Key>(
    book: &ConvBook<K>,
    pairs: &mut [i32],
    out: &mut [i32],
    num: &mut [i32],
    l: usize,
    par: &dyn Parallel,
) -> Result<()> {
    let missing = AtomicBool::new(false);
    for_each_chunk_mut(par, pairs, 2 * l, |k, chunk| {
        if !conv_offset(book, k, chunk) {
            missing.store(true, Ordering::Relaxed);
        }
    });
    if missing.load(Ordering::Relaxed) {
        return Err(Error::Runtime(
            "GetIndicePairs: an output site is missing from its own rulebook".into(),
        ));
    }
    for (k, n) in num.iter_mut().enumerate() {
        // At most L per offset (conv_offset checked it).
        *n = book.blocks.iter().map(|e| e.rows.get(k).map_or(0, Vec::len)).sum::<usize>() as i32;
    }
    match &book.sites {
        Sites::Sorted(sites) => for_each_chunk_mut(par, out, 4 * GRAIN, |t, chunk| {
            let keys = sites.keys.get(t * GRAIN..).unwrap_or(&[]);
            for (dst, key) in chunk.chunks_exact_mut(4).zip(keys) {
                let c = key.unpack(&book.layout);
                for (d, v) in dst.iter_mut().zip(c) {
                    *d = v as i32;
                }
            }
        }),
        Sites::Dense(grid) => grid.write(out, GRAIN, par)?,
    }
    Ok(())
}

pub(super) fn write_subm<K: Key>(
    book: &SubmBook<K>,
    pairs: &mut [i32],
    num: &mut [i32],
    l: usize,
    par: &dyn Parallel,
) {
    let (kh, kw) = (book.taps[1].len(), book.taps[2].len());
    let counts: Vec<AtomicUsize> = (0..num.len()).map(|_| AtomicUsize::new(0)).collect();
    // One task per (kz, ky): its kw offsets are consecutive [2, L] blocks of indice_pairs.
    for_each_chunk_mut(par, pairs, kw * 2 * l, |t, chunk| {
        let (kz, ky) = (t / kh, t % kh);
        let shifts =
            (book.taps[0].get(kz).copied().flatten(), book.taps[1].get(ky).copied().flatten());
        let mut halves: Vec<(&mut [i32], &mut [i32])> =
            chunk.chunks_exact_mut(2 * l).map(|c| c.split_at_mut(l)).collect();
        // Scatter straight into the output rows (one slot per input row), then compact each
        // in place: no scratch memory.
        for (_, outs) in halves.iter_mut() {
            outs.fill(-1);
        }
        if let (Some(dz), Some(dy)) = shifts {
            subm_line(book, dz, dy, |kx, row, to| {
                if let Some(slot) = halves.get_mut(kx).and_then(|h| h.1.get_mut(row)) {
                    *slot = to;
                }
            });
        }
        for (kx, (ins, outs)) in halves.iter_mut().enumerate() {
            let n = compact(ins, outs);
            if let Some(c) = counts.get(t * kw + kx) {
                c.store(n, Ordering::Relaxed);
            }
        }
    });
    for (n, c) in num.iter_mut().zip(&counts) {
        *n = c.load(Ordering::Relaxed) as i32;
    }
}
