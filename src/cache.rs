//! Cache hints for streaming kernels.

/// Hints the CPU to fetch the first `len` elements of `data` (a row that will be read once)
/// without keeping it in the outer caches, so a streamed input does not evict the data a
/// kernel keeps re-using (e.g. an accumulation grid).
#[inline]
pub fn prefetch_stream(data: &[f32], len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_NTA, _mm_prefetch};
        let row = &data[..len.min(data.len())];
        for line in row.chunks(16) {
            // SAFETY: prefetch never faults and has no architectural effect; the pointer comes
            // from a live slice. SSE is part of the x86-64 baseline.
            unsafe { _mm_prefetch::<_MM_HINT_NTA>(line.as_ptr().cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, len);
}
