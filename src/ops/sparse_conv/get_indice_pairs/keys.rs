//! Site keys: every site (batch, z, y, x) packed into one integer with just enough bits
//! per field (sorted with crate::ops::radix), and the sorted unique sites: a key array with a
//! prefix table, or a bitmap of a small output grid.

use super::*;
use crate::ops::radix::Digits;
use crate::parallel::for_each_part_mut;
use std::sync::atomic::AtomicU64;

// ---------------------------------------------------------------------------------------
// Site keys
// ---------------------------------------------------------------------------------------

/// Bit layout of a site key: fields (batch, z, y, x), x in the lowest bits.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    shifts: [u32; 4],
    masks: [u32; 4],
    pub(super) bits: u32,
}

impl Layout {
    /// A layout holding every field value up to `max[f]` (each < 2^31).
    pub(super) fn new(max: [u32; 4]) -> Self {
        let widths = max.map(|m| u32::BITS - m.leading_zeros());
        let mut shifts = [0; 4];
        let mut acc = 0;
        for f in (0..4).rev() {
            shifts[f] = acc;
            acc += widths[f];
        }
        let masks = widths.map(|w| if w == 0 { 0 } else { u32::MAX >> (u32::BITS - w) });
        Layout { shifts, masks, bits: acc }
    }

    /// The x field's mask (x is the lowest field, at shift 0).
    pub(super) fn x_mask(&self) -> u32 {
        self.masks[3]
    }
}

/// An unsigned integer holding packed sites (or, for [`DenseSites`], a site's index in the
/// output grid, from `u64`).
pub(super) trait Key: Copy + Ord + Send + Sync + From<u64> + Digits + 'static {
    /// Packs field values that fit the layout's masks.
    fn pack(l: &Layout, c: [u32; 4]) -> Self;
    fn unpack(self, l: &Layout) -> [u32; 4];
    /// The key with x (the lowest field, 0 in `self`) set to `x`, which fits its mask.
    fn with_x(self, x: u32) -> Self;
    /// The key with x (the lowest field, whose mask is `x_mask`) set to 0: its x line's.
    fn without_x(self, x_mask: u32) -> Self;
}

macro_rules! key_impl {
    ($t:ty) => {
        impl Key for $t {
            fn pack(l: &Layout, c: [u32; 4]) -> Self {
                // A zero-width field holds 0, so wrapping shifts (by the full width) are
                // harmless there; other shifts are below the layout's total bits.
                (0..4).fold(0, |k, f| k | <$t>::from(c[f] & l.masks[f]).wrapping_shl(l.shifts[f]))
            }
            fn unpack(self, l: &Layout) -> [u32; 4] {
                std::array::from_fn(|f| (self.wrapping_shr(l.shifts[f]) as u32) & l.masks[f])
            }
            fn with_x(self, x: u32) -> Self {
                self | <$t>::from(x)
            }
            fn without_x(self, x_mask: u32) -> Self {
                self & !<$t>::from(x_mask)
            }
        }
    };
}
key_impl!(u64);
key_impl!(u128);

/// Sorted unique keys with a table of where each key prefix starts, so a lookup is one table
/// read and a binary search over the few keys sharing the prefix. The prefix has about
/// log2(keys) bits (at least 16, at most the key's): one to two keys per prefix on average,
/// and a table of at most half the keys' own size.
pub(super) struct SortedSites<K> {
    pub(super) keys: Vec<K>,
    shift: u32,
    pub(super) starts: Vec<u32>,
}

impl<K: Key> SortedSites<K> {
    pub(super) fn new(keys: Vec<K>, bits: u32) -> Result<Self> {
        let top = bits.min(keys.len().checked_ilog2().unwrap_or(0).max(16));
        let shift = bits - top;
        let buckets = 1usize << top;
        let mut starts = Vec::new();
        scratch::reserve(&mut starts, buckets + 1, "the output sites' prefix table")?;
        let mut pos = 0usize;
        for b in 0..=buckets {
            while pos < keys.len() && keys[pos].digit(shift, usize::MAX) < b {
                pos += 1;
            }
            // keys.len() <= K * L <= i32::MAX, checked in plan.
            starts.push(pos as u32);
        }
        Ok(SortedSites { keys, shift, starts })
    }

    /// First step of a lookup ahead of time: hints the CPU to fetch `key`'s table entry.
    pub(super) fn prefetch_entry(&self, key: K) {
        if let Some(entry) = self.starts.get(key.digit(self.shift, usize::MAX)) {
            crate::cache::prefetch_item(entry);
        }
    }

    /// Second step (after [`Self::prefetch_entry`]): reads the table entry and hints the CPU
    /// to fetch the first key of `key`'s prefix.
    pub(super) fn prefetch_keys(&self, key: K) {
        let first = self
            .starts
            .get(key.digit(self.shift, usize::MAX))
            .and_then(|&lo| self.keys.get(lo as usize));
        if let Some(first) = first {
            crate::cache::prefetch_item(first);
        }
    }

    pub(super) fn find(&self, key: K) -> Option<usize> {
        let b = key.digit(self.shift, usize::MAX);
        let lo = *self.starts.get(b)? as usize;
        let hi = *self.starts.get(b + 1)? as usize;
        self.keys.get(lo..hi)?.binary_search(&key).ok().map(|p| lo + p)
    }
}

/// Sorted unique sites as a bitmap over a small output grid: site (b, z, y, x) is bit
/// `((b * D + z) * H + y) * W + x`, so set bits ascend in key order, with the number of set
/// bits before each word. A site's position is that count plus the set bits below it in its
/// word: no sort and no search. Marked from many threads at once (a word is read before
/// its atomic OR, which is skipped when the bit is already set, the common case: a site is
/// reached from up to K input rows); read after the marking with relaxed loads (plain
/// loads on x86-64), the threads having been joined.
pub(super) struct DenseSites {
    /// Grid extents (batches, D, H, W).
    dims: [u64; 4],
    words: Vec<AtomicU64>,
    /// Set bits before each word. (One count per word, not per cache line of words: the
    /// crate's baseline x86-64 has no popcnt instruction, so each count_ones is a dozen
    /// instructions, and a lookup makes one.)
    ranks: Vec<u32>,
    count: usize,
}

impl DenseSites {
    /// An empty grid of `dims`, when its bitmap has at most `max_words` words.
    pub(super) fn new(dims: [u64; 4], max_words: usize) -> Result<Option<Self>> {
        let volume = dims.iter().try_fold(1u64, |v, &d| v.checked_mul(d));
        let Some(words) = volume
            .map(|v| v.div_ceil(64))
            .and_then(|w| usize::try_from(w).ok())
            .filter(|&w| w <= max_words)
        else {
            return Ok(None);
        };
        let words =
            scratch::collect((0..words).map(|_| AtomicU64::new(0)), "the output grid's bitmap")?;
        Ok(Some(DenseSites { dims, words, ranks: Vec::new(), count: 0 }))
    }

    /// Marks site (b, z, y, x) (each within the grid) and returns its index.
    pub(super) fn mark(&self, c: [u32; 4]) -> u64 {
        let [_, d, h, w] = self.dims;
        let i =
            ((u64::from(c[0]) * d + u64::from(c[1])) * h + u64::from(c[2])) * w + u64::from(c[3]);
        let bit = 1u64 << (i % 64);
        if let Some(word) = usize::try_from(i / 64).ok().and_then(|w| self.words.get(w))
            && word.load(Ordering::Relaxed) & bit == 0
        {
            word.fetch_or(bit, Ordering::Relaxed);
        }
        i
    }

    /// After marking: the ranks.
    pub(super) fn finish(&mut self) -> Result<()> {
        let mut count = 0usize;
        self.ranks = scratch::collect(
            self.words.iter().map(|w| {
                let before = count;
                count += w.load(Ordering::Relaxed).count_ones() as usize;
                // count <= emitted pairs <= K * L <= i32::MAX (checked in plan).
                before as u32
            }),
            "the output grid's ranks",
        )?;
        self.count = count;
        Ok(())
    }

    pub(super) fn len(&self) -> usize {
        self.count
    }

    /// The position of site index `i` among the sites, if marked.
    pub(super) fn find(&self, i: u64) -> Option<usize> {
        let w = usize::try_from(i / 64).ok()?;
        let (word, bit) = (self.words.get(w)?.load(Ordering::Relaxed), i % 64);
        if (word >> bit) & 1 == 0 {
            return None;
        }
        Some(*self.ranks.get(w)? as usize + (word & ((1u64 << bit) - 1)).count_ones() as usize)
    }

    /// Hints the CPU to fetch what [`Self::find`] reads for `i`.
    pub(super) fn prefetch(&self, i: u64) {
        let Ok(w) = usize::try_from(i / 64) else { return };
        if let (Some(word), Some(rank)) = (self.words.get(w), self.ranks.get(w)) {
            crate::cache::prefetch_item(word);
            crate::cache::prefetch_item(rank);
        }
    }

    /// Writes the sites in order as (b, z, y, x) rows of `out` (4 * len values), in parallel
    /// parts of about `grain` sites, each starting at a word.
    pub(super) fn write(&self, out: &mut [i32], grain: usize, par: &dyn Parallel) -> Result<()> {
        if out.len() != 4 * self.count {
            return Err(Error::Runtime(format!(
                "GetIndicePairs: {} output-site values for {} sites",
                out.len(),
                self.count
            )));
        }
        let before = |w: usize| self.ranks.get(w).map_or(self.count, |&r| r as usize);
        // Parts of whole words weighted by their sites (the ranks' differences).
        let sites = (0..self.words.len()).map(|w| (before(w + 1) - before(w)) as u64);
        let cuts = balanced_cuts(sites, pieces(self.count, grain));
        let bounds =
            scratch::collect(cuts.iter().map(|&w| 4 * before(w)), "the output sites' parts")?;
        let [_, d, h, w] = self.dims;
        for_each_part_mut(par, out, &bounds, |t, part| {
            let mut rows = part.chunks_exact_mut(4);
            for (j, word) in
                self.words.get(cuts[t]..cuts[t + 1]).unwrap_or_default().iter().enumerate()
            {
                let mut bits = word.load(Ordering::Relaxed);
                while bits != 0 {
                    let i = (cuts[t] + j) as u64 * 64 + u64::from(bits.trailing_zeros());
                    bits &= bits - 1;
                    let (rest, x) = (i / w, i % w);
                    let (rest, y) = (rest / h, rest % h);
                    let (b, z) = (rest / d, rest % d);
                    if let Some(row) = rows.next() {
                        // Every extent is at most i32::MAX (output_space, batch).
                        row.copy_from_slice(&[b as i32, z as i32, y as i32, x as i32]);
                    }
                }
            }
        });
        Ok(())
    }
}
