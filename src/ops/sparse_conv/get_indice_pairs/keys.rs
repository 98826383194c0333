//! Site keys: every site (batch, z, y, x) packed into one integer with just enough bits
//! per field, the LSD radix sort of keys, and sorted unique sites with a prefix table.

use super::*;

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

/// An unsigned integer holding packed sites.
pub(super) trait Key: Copy + Ord + Send + Sync + 'static {
    /// Packs field values that fit the layout's masks.
    fn pack(l: &Layout, c: [u32; 4]) -> Self;
    fn unpack(self, l: &Layout) -> [u32; 4];
    /// `(self >> shift) & mask`: a radix digit, or (mask = usize::MAX) a key prefix that
    /// the caller knows fits in usize.
    fn digit(self, shift: u32, mask: usize) -> usize;
    /// The key with x (the lowest field, 0 in `self`) set to `x`, which fits its mask.
    fn with_x(self, x: u32) -> Self;
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
            fn digit(self, shift: u32, mask: usize) -> usize {
                (self.wrapping_shr(shift) as usize) & mask
            }
            fn with_x(self, x: u32) -> Self {
                self | <$t>::from(x)
            }
        }
    };
}
key_impl!(u64);
key_impl!(u128);

/// Radix digit width: 2048 buckets keep the histogram in L1.
const DIGIT_BITS: u32 = 11;

/// Stable LSD radix sort of `v` by the low `bits` bits of `key`.
pub(super) fn radix_sort<T: Copy, K: Key>(v: &mut Vec<T>, bits: u32, key: impl Fn(&T) -> K) -> Result<()> {
    if v.len() <= 256 {
        // Small inputs: the histograms would cost more than the sort (also stable).
        v.sort_by_key(|t| key(t));
        return Ok(());
    }
    let mask = (1usize << DIGIT_BITS) - 1;
    let mut buf: Vec<T> = Vec::new();
    scratch::reserve(&mut buf, v.len(), "the radix sort's second buffer")?;
    buf.extend_from_slice(v);
    let mut shift = 0;
    while shift < bits {
        let mut starts = vec![0usize; mask + 1];
        for t in v.iter() {
            starts[key(t).digit(shift, mask)] += 1;
        }
        // A digit shared by every key would only copy the data.
        if !starts.contains(&v.len()) {
            let mut sum = 0;
            for s in starts.iter_mut() {
                let c = *s;
                *s = sum;
                sum += c;
            }
            for t in v.iter() {
                let d = key(t).digit(shift, mask);
                buf[starts[d]] = *t;
                starts[d] += 1;
            }
            std::mem::swap(v, &mut buf);
        }
        shift += DIGIT_BITS;
    }
    Ok(())
}

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
        let first = self.starts.get(key.digit(self.shift, usize::MAX)).and_then(|&lo| self.keys.get(lo as usize));
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

