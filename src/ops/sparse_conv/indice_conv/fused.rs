//! IndiceConv's fused path (AVX-512F, Cout 16, 32, 64 or 128): each pair's products
//! fused-multiply-added straight into its output row.

/// Proof that this CPU has AVX-512F and that Cout is 16, 32, 64 or 128: only
/// [`Fused::detect`] makes one. At those widths a chunk's products are accumulated straight
/// into the output rows (no gathered block, no product block, no adds): at 16-64 the
/// gathers and adds around a GEMM took about as long as the GEMM (benches/indice_conv.rs).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Fused {
    /// Vectors of 16 floats per column block (1, 2 or 4).
    pub(super) vectors: usize,
    pub(super) cout: usize,
}

#[cfg(target_arch = "x86_64")]
impl Fused {
    pub(super) fn detect(cout: usize) -> Option<Self> {
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
    pub(super) fn accumulate(
        self,
        cin: usize,
        chunk: Chunk<'_>,
        features: &[f32],
        w: &[f32],
        block: &mut [f32],
    ) {
        let (cout, Chunk { srcs, dsts, base, .. }) = (self.cout, chunk);
        assert!(
            w.len() == cin * cout
                && srcs.len() == dsts.len()
                && cout.is_multiple_of(16 * self.vectors)
        );
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
                v => {
                    unreachable!("IndiceConv's fused path has no kernel for {v} vectors per block")
                }
            }
        }
    }
}

/// Whether every `v - base` (wrapping, read as unsigned) is below `limit`: a fold of
/// comparisons, vectorised with AVX-512 (it runs once per chunk).
/// SAFETY (caller): AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) fn all_below(v: &[i32], base: i32, limit: usize) -> bool {
    // (Rows are below 2^31: a limit beyond u32 can be taken as u32::MAX.)
    let limit = u32::try_from(limit).unwrap_or(u32::MAX);
    v.iter().fold(true, |ok, &x| ok & ((x.wrapping_sub(base) as u32) < limit))
}

/// One chunk's pairs: source rows, output rows (row `d - base` of the tile's block), and
/// whether the caller knows those output rows to be distinct.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Chunk<'a> {
    pub(super) srcs: &'a [i32],
    pub(super) dsts: &'a [i32],
    pub(super) base: i32,
    pub(super) distinct: bool,
}

/// A block of 16Z columns starting at `col` of rows (and filter rows) of `cout` floats.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
pub(super) struct Columns {
    pub(super) cout: usize,
    pub(super) col: usize,
}

/// [`Fused::accumulate`] for one block of Z vectors, P pairs at a time, or P / 2, P / 4, ...
/// 1 where the next P pairs run out or repeat an output row (the bits do not depend on it).
/// SAFETY (caller): AVX-512F; col + 16Z <= cout; w holds cin * cout floats; every (s + 1) *
/// cin <= features.len() and every (d - base + 1) * cout <= block.len().
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn fused_groups<const Z: usize, const P: usize>(
    cin: usize,
    chunk: Chunk<'_>,
    features: &[f32],
    w: &[f32],
    block: &mut [f32],
    at: Columns,
) {
    let Chunk { srcs, dsts, base, distinct } = chunk;
    let (x, out) = (features.as_ptr(), block.as_mut_ptr());
    let mut j = 0;
    while j < srcs.len() {
        let mut n = P.min(srcs.len() - j).next_power_of_two();
        while n > 1
            && !(j + n <= srcs.len()
                && (distinct || (1..n).all(|a| !dsts[j..j + a].contains(&dsts[j + a]))))
        {
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
pub(super) unsafe fn fused_pairs<const Z: usize, const N: usize>(
    cin: usize,
    srcs: &[i32],
    dsts: &[i32],
    base: i32,
    x: *const f32,
    out: *mut f32,
    w: &[f32],
    at: Columns,
) {
    // SAFETY: the caller's bounds hold for these N pairs and this block of columns.
    unsafe {
        let rows = std::array::from_fn(|p| {
            out.add(dsts[p].wrapping_sub(base) as u32 as usize * at.cout + at.col)
        });
        fused_group::<Z, N>(
            cin,
            std::array::from_fn(|p| x.add(srcs[p] as u32 as usize * cin)),
            rows,
            w.as_ptr().add(at.col),
            at.cout,
        )
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
pub(super) unsafe fn fused_group<const Z: usize, const P: usize>(
    cin: usize,
    x: [*const f32; P],
    out: [*mut f32; P],
    w: *const f32,
    stride: usize,
) {
    use std::arch::x86_64::{_mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_storeu_ps};
    // SAFETY: every pointer stays within the rows the caller vouches for.
    unsafe {
        let mut acc: [[_; Z]; P] =
            std::array::from_fn(|p| std::array::from_fn(|z| _mm512_loadu_ps(out[p].add(16 * z))));
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
