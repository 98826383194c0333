//! The stable LSD radix sort of records by an integer key, shared by the operators that
//! sort packed coordinates (GetIndicePairs' sites, DynamicScatter's voxels).

use crate::error::Result;
use crate::scratch;

/// An unsigned integer key whose bits a radix sort takes a digit at a time.
pub trait Digits: Copy + Ord {
    /// `(self >> shift) & mask`: a radix digit, or (mask = usize::MAX) a key prefix that
    /// the caller knows fits in usize.
    fn digit(self, shift: u32, mask: usize) -> usize;
}

macro_rules! digits_impl {
    ($t:ty) => {
        impl Digits for $t {
            fn digit(self, shift: u32, mask: usize) -> usize {
                (self.wrapping_shr(shift) as usize) & mask
            }
        }
    };
}
digits_impl!(u64);
digits_impl!(u128);

/// Radix digit width: 2048 buckets keep the histogram in L1.
const DIGIT_BITS: u32 = 11;

/// Stable LSD radix sort of `v` by the low `bits` bits of `key` (the other bits zero).
pub fn radix_sort<T: Copy, K: Digits>(
    v: &mut Vec<T>,
    bits: u32,
    key: impl Fn(&T) -> K,
) -> Result<()> {
    if bits == 0 {
        // Every key is 0: the order stays.
        return Ok(());
    }
    if v.len() <= 256 {
        // Small inputs: the histograms would cost more than the sort (also stable).
        v.sort_by_key(|t| key(t));
        return Ok(());
    }
    let mask = (1usize << DIGIT_BITS) - 1;
    let mut buf: Vec<T> = Vec::new();
    scratch::reserve(&mut buf, v.len(), "the radix sort's second buffer")?;
    buf.extend_from_slice(v);
    let mut starts = [0usize; 1 << DIGIT_BITS];
    let mut shift = 0;
    while shift < bits {
        starts.fill(0);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn radix_sort_is_a_stable_sort() {
        let mut next = crate::test_rng::xorshift(0x1234_5678);
        for (len, bits) in [(5000, 16), (100, 16), (3000, 40), (2000, 0)] {
            let mask = if bits == 0 { 0 } else { (1u64 << bits) - 1 };
            // Few distinct keys at 16 bits, so equal keys must keep their order.
            let mut v: Vec<(u64, u32)> = (0..len)
                .map(|i| (next() & mask & if bits == 16 { 0xF0F } else { !0 }, i))
                .collect();
            let mut want = v.clone();
            want.sort_by_key(|x| x.0);
            radix_sort(&mut v, bits as u32, |x| x.0).unwrap();
            assert_eq!(v, want, "{len} records, {bits} bits");
        }
    }
}
