//! Cache hints for streaming kernels.

/// Hints the CPU to fetch the first `len` elements of `data` (a row that will be read once)
/// without keeping it in the outer caches, so a streamed input does not evict the data a
/// kernel keeps re-using (e.g. an accumulation grid).
#[inline]
pub fn prefetch_stream(data: &[f32], len: usize) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_NTA }, f32>(&data[..len.min(data.len())]);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, len);
}

/// Hints the CPU to fetch `data` (a row about to be read, e.g. a gathered one) into all
/// cache levels.
#[inline]
pub fn prefetch_read(data: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_T0 }, f32>(data);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Hints the CPU to fetch `data` (rows read soon, side by side with others) into L2 but not
/// L1: rows a multiple of 4 KiB apart have their lines at one offset in one L1 set (8 ways),
/// so more than 8 such rows prefetched into L1 evict each other before they are read.
#[inline]
pub fn prefetch_l2<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    prefetch_lines::<{ std::arch::x86_64::_MM_HINT_T1 }, T>(data);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Hints the CPU to fetch the cache line holding `item` (e.g. a table entry a lookup will
/// read soon) into all cache levels.
#[inline]
pub fn prefetch_item<T>(item: &T) {
    // SAFETY: prefetch never faults and has no architectural effect; the pointer comes from
    // a live reference. SSE is part of the x86-64 baseline.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            std::ptr::from_ref(item).cast(),
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = item;
}

/// One prefetch with hint `HINT` per 64 bytes of `data`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_lines<const HINT: i32, T>(data: &[T]) {
    for offset in (0..size_of_val(data)).step_by(64) {
        // SAFETY: prefetch never faults and has no architectural effect; the address lies
        // inside `data` (offset < its size in bytes). SSE is part of the x86-64 baseline.
        unsafe { std::arch::x86_64::_mm_prefetch::<HINT>(data.as_ptr().cast::<i8>().add(offset)) };
    }
}

/// Outputs at least this large are written with non-temporal stores ([`copy_out`], and
/// ThreeInterpolate's write-back of whole lines): they
/// would not stay cached until their consumer reads them anyway. Smaller ones are written
/// through the cache, where the next node finds them.
pub const STREAM_MIN_BYTES: usize = 4 << 20;

/// Whether an output of `bytes` is large enough to stream (see [`STREAM_MIN_BYTES`]).
pub fn worth_streaming(bytes: usize) -> bool {
    bytes >= STREAM_MIN_BYTES
}

/// `dst.copy_from_slice(src)`, with [`copy_stream`] when `stream` is set.
#[inline]
pub fn copy_out(dst: &mut [f32], src: &[f32], stream: bool) {
    if stream { copy_stream(dst, src) } else { dst.copy_from_slice(src) }
}

/// Copies `src` into `dst` (same length, else it panics as `copy_from_slice` does) with
/// non-temporal stores where `dst` is 16-byte aligned: output rows written once go to
/// memory without first being read into the cache (no read-for-ownership), which halves
/// the traffic of a scattered or streamed output.
/// The caller must call [`stream_fence`] before other threads read `dst`.
#[inline]
pub fn copy_stream(dst: &mut [f32], src: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if dst.len() == src.len() && dst.as_ptr().align_offset(16) == 0 {
        use std::arch::x86_64::{_mm_loadu_ps, _mm_stream_ps};
        let mut d = dst.chunks_exact_mut(4);
        let mut s = src.chunks_exact(4);
        for (d, s) in (&mut d).zip(&mut s) {
            // SAFETY: `s` holds 4 readable floats (unaligned load); `d` holds 4 writable
            // floats and is 16-byte aligned (dst is, and every chunk is 16 bytes further).
            // SSE is part of the x86-64 baseline.
            unsafe { _mm_stream_ps(d.as_mut_ptr(), _mm_loadu_ps(s.as_ptr())) };
        }
        d.into_remainder().copy_from_slice(s.remainder());
        return;
    }
    dst.copy_from_slice(src);
}

/// Orders this thread's non-temporal stores ([`copy_stream`]'s and any kernel's own)
/// before everything it does next (in particular before it reports its task done).
#[inline]
pub fn stream_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a store fence has no preconditions. SSE is part of the x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_stream_copies_every_length_and_alignment() {
        let src: Vec<f32> = (0..67).map(|i| i as f32 - 0.5).collect();
        for offset in 0..5 {
            for len in 0..60 {
                let mut buf = vec![f32::NAN; 72];
                copy_stream(&mut buf[offset..offset + len], &src[..len]);
                stream_fence();
                assert_eq!(&buf[offset..offset + len], &src[..len], "offset {offset} len {len}");
                // Nothing outside the destination is touched.
                assert!(buf[..offset].iter().chain(&buf[offset + len..]).all(|v| v.is_nan()));
            }
        }
    }

    #[test]
    #[should_panic]
    fn copy_stream_rejects_a_length_mismatch() {
        copy_stream(&mut [0.0; 4], &[1.0; 3]);
    }

    #[test]
    fn prefetches_accept_any_slice() {
        prefetch_read(&[]);
        prefetch_read(&[1.0; 33]);
        prefetch_stream(&[1.0; 33], 100);
    }
}
