//! IndiceConv's GEMM path: one single-threaded GEMM per chunk, and the row copies around it.

/// dst[m, cout] = lhs[m, cin] @ w[cin, cout] (row-major), one single-threaded GEMM.
/// (Public for benches/indice_conv.rs, which times the kernel's own call.)
#[doc(hidden)]
pub fn gemm_rows(m: usize, cin: usize, cout: usize, lhs: &[f32], w: &[f32], dst: &mut [f32]) {
    assert!(lhs.len() == m * cin && w.len() == cin * cout && dst.len() == m * cout);
    // SAFETY: row-major lhs [m, cin] (row stride cin), w [cin, cout] (row stride cout) and
    // dst [m, cout] (row stride cout), sizes checked just above; dst does not alias the
    // inputs (a distinct &mut). read_dst = false: dst = 1 * lhs @ w, single-threaded.
    unsafe {
        ::gemm::gemm(
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
            ::gemm::Parallelism::None,
        );
    }
}

/// `dst.copy_from_slice(src)` for short rows, inlined in 16-float pieces (a call to memcpy
/// per 64-512 byte row costs about as much as the copy).
#[inline(always)]
pub(super) fn copy_row(dst: &mut [f32], src: &[f32]) {
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
