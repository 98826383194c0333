//! The element types T of the family (float32, float16), computed in float32: widening and
//! rounding, with F16C instructions where the CPU has them.

use crate::error::Result;
use crate::scratch;
use crate::tensor::OutElement;
use half::f16;
use half::slice::HalfFloatSliceExt;

/// `s` as float32: itself, or widened into `buf` (a batch's float16 weights).
pub(super) fn as_f32s<'a, T: Real>(s: &'a [T], buf: &'a mut Vec<f32>) -> Result<&'a [f32]> {
    if let Some(s) = T::as_f32(s) {
        return Ok(s);
    }
    *buf = scratch::filled(s.len(), 0.0, "the widened float16 weights of a batch")?;
    T::widen(s, buf);
    Ok(buf)
}

/// float32 or float16, computed in float32.
pub(super) trait Real: OutElement {
    /// The data as float32 without a copy, when it already is float32.
    fn as_f32(s: &[Self]) -> Option<&[f32]>;
    /// Widens `src` into `dst` (same length).
    fn widen(src: &[Self], dst: &mut [f32]);
    /// One value as float32 (exact).
    fn to_f32(self) -> f32;
    /// The 8 values at `p` as float32 (exact), in one vector.
    ///
    /// # Safety
    /// The CPU must support AVX2 and F16C (with AVX state); `p` must point at 8 readable
    /// values. Inlined into the caller, whose target features it then shares.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    /// One float32 rounded to T (to nearest even).
    fn from_f32(x: f32) -> Self;
    /// Stores the 8 values of `v` at `p`, rounded to T (to nearest even).
    ///
    /// # Safety
    /// As [`Real::load8`], with `p` pointing at 8 writable values.
    #[cfg(target_arch = "x86_64")]
    unsafe fn store8(p: *mut Self, v: std::arch::x86_64::__m256);
    /// Stores the 16 values of `lo` then `hi` at `p`, rounded to T, with 256-bit non-temporal
    /// stores (no read for ownership; VEX-encoded, as AVX code needs: a legacy-SSE store
    /// there costs a state transition on some Intel cores).
    ///
    /// # Safety
    /// As [`Real::store8`], with `p` pointing at 16 writable values and aligned to 32 bytes.
    #[cfg(target_arch = "x86_64")]
    unsafe fn stream16(p: *mut Self, lo: std::arch::x86_64::__m256, hi: std::arch::x86_64::__m256);
}

impl Real for f32 {
    fn as_f32(s: &[f32]) -> Option<&[f32]> {
        Some(s)
    }
    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn to_f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: AVX and 8 readable floats at `p` are the caller's guarantee.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
    fn from_f32(x: f32) -> f32 {
        x
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store8(p: *mut f32, v: std::arch::x86_64::__m256) {
        // SAFETY: AVX and 8 writable floats at `p` are the caller's guarantee.
        unsafe { std::arch::x86_64::_mm256_storeu_ps(p, v) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn stream16(p: *mut f32, lo: std::arch::x86_64::__m256, hi: std::arch::x86_64::__m256) {
        use std::arch::x86_64::_mm256_stream_ps;
        // SAFETY: AVX and 16 writable floats at a 32-byte aligned `p` are the caller's
        // guarantee, so `p + 8` is 32-byte aligned too.
        unsafe {
            _mm256_stream_ps(p, lo);
            _mm256_stream_ps(p.add(8), hi);
        }
    }
}

impl Real for f16 {
    fn as_f32(_: &[f16]) -> Option<&[f32]> {
        None
    }
    fn widen(src: &[f16], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if has_f16c() {
            // SAFETY: the CPU supports F16C and the OS the AVX state it uses (detected just above).
            return unsafe { widen_f16c(src, dst) };
        }
        src.convert_to_f32_slice(dst);
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm256_cvtph_ps};
        // SAFETY: F16C with AVX state and 16 readable bytes at `p` (8 values, unaligned
        // load) are the caller's guarantee.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>())) }
    }
    fn from_f32(x: f32) -> f16 {
        f16::from_f32(x)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn store8(p: *mut f16, v: std::arch::x86_64::__m256) {
        use std::arch::x86_64::{
            __m128i, _MM_FROUND_TO_NEAREST_INT, _mm_storeu_si128, _mm256_cvtps_ph,
        };
        // SAFETY: F16C with AVX state and 16 writable bytes at `p` (8 values, unaligned
        // store) are the caller's guarantee.
        unsafe {
            _mm_storeu_si128(p.cast::<__m128i>(), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn stream16(p: *mut f16, lo: std::arch::x86_64::__m256, hi: std::arch::x86_64::__m256) {
        use std::arch::x86_64::{
            __m256i, _MM_FROUND_TO_NEAREST_INT, _mm256_cvtps_ph, _mm256_set_m128i,
            _mm256_stream_si256,
        };
        // SAFETY: F16C with AVX state and 32 writable bytes at a 32-byte aligned `p` are the
        // caller's guarantee.
        unsafe {
            let halves = _mm256_set_m128i(
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(hi),
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(lo),
            );
            _mm256_stream_si256(p.cast::<__m256i>(), halves)
        }
    }
}

/// Whether this CPU converts float16 in hardware (F16C) and the OS lets it (AVX state).
#[cfg(target_arch = "x86_64")]
pub(super) fn has_f16c() -> bool {
    // std caches the CPU's features after the first query. The F16C instructions are
    // VEX-encoded and use ymm registers: they also need the OS to have enabled AVX state,
    // which std reports with "avx" but not with "f16c".
    std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx")
}

/// `dst[i] = src[i]` as float32, 8 values per instruction (the half crate's slice
/// conversion calls a function per 8 values and returns them through memory). Exact, NaN payloads included (the same bits
/// as the half crate, tested).
///
/// # Safety
/// The CPU must support F16C, and the OS its AVX state ([`has_f16c`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c")]
unsafe fn widen_f16c(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm256_cvtph_ps, _mm256_storeu_ps};
    by_eights(src, dst, f16::to_f32, |s, d| {
        // SAFETY: F16C (with AVX state) is the caller's guarantee; the load reads the 16
        // bytes of `s` (8 f16 values, unaligned load), the store writes the 8 floats of `d`.
        unsafe {
            _mm256_storeu_ps(
                d.as_mut_ptr(),
                _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast::<__m128i>())),
            )
        }
    });
}

/// `dst[i] = one(src[i])`, whole blocks of 8 through `eight` (inlined into the caller, whose
/// target features its closure shares). The slices must be equally long, as for the half
/// crate's conversions (a mismatch is a bug: it panics rather than leave `dst` partly
/// unwritten).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn by_eights<S: Copy, D>(
    src: &[S],
    dst: &mut [D],
    one: impl Fn(S) -> D,
    eight: impl Fn(&[S], &mut [D]),
) {
    assert_eq!(src.len(), dst.len(), "float16 conversion between slices of different lengths");
    let mut d8 = dst.chunks_exact_mut(8);
    let mut s8 = src.chunks_exact(8);
    for (d, s) in d8.by_ref().zip(s8.by_ref()) {
        eight(s, d);
    }
    for (d, &s) in d8.into_remainder().iter_mut().zip(s8.remainder()) {
        *d = one(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The F16C conversions give the half crate's bits: every float16 widened, and float32
    /// values of every kind (ties, subnormals, overflow, NaN payloads) rounded as the tiles
    /// are written back (`store8` for whole blocks of 8, `from_f32` for the rest), at lengths
    /// that are and are not multiples of 8.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16c_conversions_match_the_half_crate() {
        if !has_f16c() {
            return;
        }
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        for len in [all.len(), all.len() - 3, 7, 0] {
            let mut got = vec![0f32; len];
            <f16 as Real>::widen(&all[..len], &mut got);
            let want: Vec<u32> = all[..len].iter().map(|h| h.to_f32().to_bits()).collect();
            assert_eq!(got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want);
        }
        let mut next = crate::test_rng::xorshift(0x9E37_79B9_7F4A_7C15);
        let mut values: Vec<f32> =
            (0..100_000).map(|_| f32::from_bits((next() >> 32) as u32)).collect();
        // Halfway between neighbouring float16 values, around the subnormal and overflow edges.
        values.extend(
            (0..=u16::MAX)
                .map(|b| f32::from_bits(f16::from_bits(b).to_f32().to_bits() + (1 << 12))),
        );
        values.extend([
            65504.0,
            65519.99,
            65520.0,
            1e-8,
            -0.0,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7F80_0001),
        ]);
        for len in [values.len(), values.len() - 5, 3] {
            let mut got = vec![f16::ZERO; len];
            by_eights(&values[..len], &mut got, <f16 as Real>::from_f32, |s, d| {
                // SAFETY: F16C with AVX state was detected above; the load reads the 8 floats
                // of `s`, the store writes the 8 values of `d`.
                unsafe { <f16 as Real>::store8(d.as_mut_ptr(), <f32 as Real>::load8(s.as_ptr())) }
            });
            let want: Vec<u16> =
                values[..len].iter().map(|&x| f16::from_f32(x).to_bits()).collect();
            assert_eq!(got.iter().map(|h| h.to_bits()).collect::<Vec<_>>(), want);
        }
    }
}
