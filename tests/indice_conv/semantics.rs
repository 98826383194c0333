//! The operator's semantics against the two references, its summation order and its
//! bit-identity across threads, site orders and CPU paths.

use super::*;

#[test]
fn hand_computed_example_with_duplicate_destinations() {
    // L 3, Cin 1, Cout 2, K 2, P 3, num_out 2; pairs of k 0: 0->1, 2->1, 1->1 (three sources
    // into one row); k 1: 2->0 only (slot 2 unused, holds garbage).
    let conv = Conv {
        l: 3,
        cin: 1,
        cout: 2,
        k: 2,
        p: 3,
        num_out: 2,
        features: vec![1.0, 2.0, 4.0],
        filters: vec![1.0, 10.0, 0.5, -1.0],
        pairs: vec![0, 2, 1, 1, 1, 1, 2, -7, 99, 0, 12345, i32::MIN],
        num: vec![3, 1],
        out_indices: vec![0; 2 * 4],
        out_d: 4,
        bias: Some(vec![100.0, 200.0]),
    };
    let got = check(&conv, false);
    // row 0: bias + 4*[0.5, -1] = [102, 196]; row 1: bias + (1+4+2)*[1, 10] = [107, 270].
    assert_eq!(got, vec![102.0, 196.0, 107.0, 270.0]);
    let no_bias = Conv { bias: None, ..conv.clone() };
    assert_eq!(check(&no_bias, false), vec![2.0, -4.0, 7.0, 70.0]);
}

#[test]
fn inverse_swaps_the_slots() {
    // The same rulebook read backwards: gather slot 1, scatter to slot 0; L is now the
    // number of rows slot 1 refers to (2), num_out those of slot 0 (3).
    let conv = Conv {
        l: 2,
        cin: 1,
        cout: 1,
        k: 2,
        p: 3,
        num_out: 3,
        features: vec![1.0, 10.0],
        filters: vec![2.0, 3.0],
        pairs: vec![0, 2, 1, 1, 1, 1, 2, -7, 99, 0, 12345, i32::MIN],
        num: vec![3, 1],
        out_indices: vec![0; 3],
        out_d: 1,
        bias: None,
    };
    // k 0 (w 2): 1->0, 1->2, 1->1 each 20; k 1 (w 3): 0->2 gives 3.
    assert_eq!(check(&conv, true), vec![20.0, 20.0, 23.0]);
    let mut rng = Rng(4);
    for (l, num_out) in [(5, 9), (9, 5), (1, 30), (30, 1)] {
        // Valid for inverse = 1: slot 1 < L, slot 0 < num_out.
        let base = random_conv(&mut rng, num_out, 3, 4, 5, 7, l, true);
        let inv = Conv {
            l,
            num_out,
            out_indices: vec![0; num_out * 4],
            features: rng.floats(l * 3),
            ..base.clone()
        };
        let got = check(&inv, true);
        let plain = swapped(&inv, inv.features.clone(), l, num_out);
        assert_eq!(bits(&check(&plain, false)), bits(&got));
    }
}

#[test]
fn random_rulebooks_with_and_without_bias() {
    let mut rng = Rng(7);
    // (L, Cin, Cout, K, P, num_out)
    for (l, cin, cout, k, p, num_out) in [
        (1, 1, 1, 1, 1, 1),
        (10, 3, 5, 27, 10, 12),
        (40, 16, 8, 8, 40, 15),
        (100, 5, 33, 3, 100, 7),
        (7, 64, 2, 1, 50, 100),
    ] {
        for bias in [false, true] {
            let conv = random_conv(&mut rng, l, cin, cout, k, p, num_out, bias);
            check(&conv, false);
        }
    }
}

#[test]
fn zero_size_dimensions() {
    let mut rng = Rng(8);
    // (L, Cin, Cout, K, P, num_out): each zero in turn.
    for (l, cin, cout, k, p, num_out) in [
        (0, 3, 4, 2, 0, 5),
        (0, 3, 4, 2, 3, 5),
        (4, 0, 3, 2, 4, 5),
        (4, 3, 0, 2, 4, 5),
        (4, 3, 2, 0, 4, 5),
        (4, 3, 2, 2, 0, 5),
        (4, 3, 2, 2, 4, 0),
        (0, 0, 0, 0, 0, 0),
    ] {
        for bias in [false, true] {
            let conv = random_conv(&mut rng, l, cin, cout, k, p, num_out, bias);
            let got = check(&conv, false);
            assert_eq!(got.len(), num_out * cout);
            // No pair contributes anything readable when L, Cin, K or P is zero: output = bias.
            if l == 0 || cin == 0 || k == 0 || p == 0 {
                let want: Vec<f32> = (0..num_out * cout)
                    .map(|e| conv.bias.as_ref().map_or(0.0, |b| b[e % cout]))
                    .collect();
                assert_eq!(got, want);
            }
        }
    }
}

#[test]
fn out_indices_values_are_not_read() {
    let mut rng = Rng(9);
    let conv = random_conv(&mut rng, 6, 2, 3, 4, 5, 7, true);
    let base = check(&conv, false);
    for (d, fill) in [(1, 0), (4, i32::MIN), (4, -1), (9, i32::MAX)] {
        let other = Conv { out_d: d, out_indices: vec![fill; 7 * d], ..conv.clone() };
        assert_eq!(bits(&check(&other, false)), bits(&base));
    }
}

#[test]
fn submanifold_convolutions_match_dense_reference() {
    let mut rng = Rng(11);
    check_geometry(&mut rng, &Geometry::subm(2, [6, 7, 5], [3, 3, 3], [1; 3]), 80, 3, 4, true);
    check_geometry(&mut rng, &Geometry::subm(1, [8, 8, 8], [3, 3, 3], [1; 3]), 200, 4, 2, false);
    check_geometry(&mut rng, &Geometry::subm(2, [7, 9, 6], [3, 3, 3], [2, 1, 2]), 90, 2, 3, true);
    check_geometry(&mut rng, &Geometry::subm(1, [5, 6, 7], [5, 1, 3], [1; 3]), 60, 3, 3, true);
    check_geometry(&mut rng, &Geometry::subm(3, [4, 4, 4], [1, 1, 1], [1; 3]), 30, 5, 2, false);
    // Dense: every site active.
    check_geometry(&mut rng, &Geometry::subm(1, [3, 3, 3], [3, 3, 3], [1; 3]), 27, 2, 2, true);
}

#[test]
fn strided_convolutions_match_dense_reference() {
    let mut rng = Rng(12);
    let seed_like =
        Geometry { stride: [2; 3], padding: [0, 1, 1], ..Geometry::new(2, [9, 10, 11], [3, 3, 3]) };
    check_geometry(&mut rng, &seed_like, 120, 3, 4, true);
    check_geometry(&mut rng, &seed_like, 120, 2, 5, false);
    let down = Geometry { stride: [2; 3], ..Geometry::new(1, [8, 6, 10], [2, 2, 2]) };
    check_geometry(&mut rng, &down, 100, 4, 3, true);
    let mixed = Geometry {
        stride: [1, 2, 3],
        padding: [1, 0, 2],
        ..Geometry::new(2, [5, 9, 11], [3, 2, 4])
    };
    check_geometry(&mut rng, &mixed, 80, 2, 2, true);
    let plain = Geometry::new(1, [6, 6, 6], [3, 3, 3]);
    check_geometry(&mut rng, &plain, 50, 3, 3, false);
}

#[test]
fn dilated_and_transposed_convolutions_match_dense_reference() {
    let mut rng = Rng(13);
    let dilated = Geometry {
        dilation: [2, 1, 3],
        padding: [1, 1, 0],
        ..Geometry::new(2, [9, 7, 12], [3, 3, 3])
    };
    check_geometry(&mut rng, &dilated, 90, 3, 2, true);
    let transposed = Geometry {
        stride: [2; 3],
        padding: [1; 3],
        output_padding: [1, 0, 1],
        transpose: true,
        ..Geometry::new(1, [4, 5, 3], [3, 3, 3])
    };
    check_geometry(&mut rng, &transposed, 30, 2, 3, true);
    let transposed =
        Geometry { stride: [2, 1, 2], transpose: true, ..Geometry::new(2, [3, 4, 4], [2, 3, 2]) };
    check_geometry(&mut rng, &transposed, 25, 3, 2, false);
}

#[test]
fn empty_site_lists() {
    let mut rng = Rng(14);
    check_geometry(&mut rng, &Geometry::subm(1, [4, 4, 4], [3, 3, 3], [1; 3]), 0, 3, 2, true);
    let g = Geometry { stride: [2; 3], ..Geometry::new(1, [6, 6, 6], [3, 3, 3]) };
    check_geometry(&mut rng, &g, 0, 3, 2, true);
}

#[test]
fn bit_identical_across_thread_counts_and_runs() {
    // Large enough for many tasks: a submanifold convolution on ~5000 sites, Cin 16, Cout 32.
    let mut rng = Rng(15);
    let g = Geometry::subm(2, [16, 16, 16], [3, 3, 3], [1; 3]);
    let sites = random_sites(&mut rng, &g, 5000, true);
    let rb = get_indice_pairs(&g, &sites);
    let (cin, cout) = (16, 32);
    let mut features = rng.floats(sites.len() * cin);
    // Mixed magnitudes so that any change of summation order shows up.
    for (k, v) in features.iter_mut().enumerate() {
        *v *= [1.0, 1e-3, 1e3, 7.0][k % 4];
    }
    let conv = conv_over(
        &rb,
        sites.len(),
        features,
        rng.floats(27 * cin * cout),
        cin,
        cout,
        Some(rng.floats(cout)),
        sites.len(),
        sites.concat(),
    );
    let first = check(&conv, false);
    for par in [&Threads(2) as &dyn Parallel, &Threads(3), &Threads(2), &Serial] {
        assert_eq!(bits(&conv.run(0, par).expect("runs")), bits(&first));
    }
    let inv = check(&conv, true);
    for par in [&Threads(3) as &dyn Parallel, &Threads(2)] {
        assert_eq!(bits(&conv.run(1, par).expect("runs")), bits(&inv));
    }
}

/// Features of mixed magnitudes, so that a change of summation order shows in the bits.
fn mixed_floats(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|i| rng.float() * [1.0, 1e-3, 1e3, 7.0, 3e4][i % 5]).collect()
}

/// Sites clustered in blobs (as lidar voxels are), so that submanifold neighbourhoods are
/// populated, rows in generation order.
pub(super) fn clustered_sites(rng: &mut Rng, g: &Geometry, n: usize) -> Vec<[i32; 4]> {
    let mut seen = HashSet::new();
    let mut sites = Vec::new();
    let mut centre = [0i32; 4];
    while sites.len() < n {
        if rng.below(40) == 0 || sites.is_empty() {
            centre = [
                rng.below(g.batch as usize) as i32,
                rng.below(g.spatial[0] as usize) as i32,
                rng.below(g.spatial[1] as usize) as i32,
                rng.below(g.spatial[2] as usize) as i32,
            ];
        }
        let jitter = |rng: &mut Rng, c: i32, r: usize, hi: i64| {
            (c + rng.below(2 * r + 1) as i32 - r as i32).clamp(0, hi as i32 - 1)
        };
        let s = [
            centre[0],
            jitter(rng, centre[1], 2, g.spatial[0]),
            jitter(rng, centre[2], 4, g.spatial[1]),
            jitter(rng, centre[3], 4, g.spatial[2]),
        ];
        if seen.insert(s) {
            sites.push(s);
        }
    }
    sites
}

/// A forward convolution over GetIndicePairs' rulebook of `sites`, mixed-magnitude features.
pub(super) fn conv_on_sites(
    rng: &mut Rng,
    g: &Geometry,
    sites: &[[i32; 4]],
    cin: usize,
    cout: usize,
    bias: bool,
) -> Conv {
    let rb = get_indice_pairs(g, sites);
    let num_out = rb.out_indices.shape[0];
    let out_indices = rb.out_indices.data.i32().expect("int32").to_vec();
    let features = mixed_floats(rng, sites.len() * cin);
    let filters = rng.floats(g.volume() * cin * cout);
    conv_over(
        &rb,
        sites.len(),
        features,
        filters,
        cin,
        cout,
        bias.then(|| rng.floats(cout)),
        num_out,
        out_indices,
    )
}

#[test]
fn bit_identical_at_1_2_3_4_threads_at_backbone_channel_counts() {
    // The CenterPoint backbone's channel counts, submanifold and strided, each case large
    // enough for many row tiles and tasks (more sites where the channels are few), compared
    // bit for bit at 1, 2, 3 and 4 threads (in `check`) and against the reference.
    let mut rng = Rng(16);
    let subm = Geometry::subm(2, [12, 48, 48], [3, 3, 3], [1; 3]);
    let strided =
        Geometry { stride: [2; 3], padding: [1; 3], ..Geometry::new(2, [12, 48, 48], [3, 3, 3]) };
    for (cin, cout, n) in [
        (5, 16, 12000),
        (16, 16, 12000),
        (16, 32, 8000),
        (32, 32, 6000),
        (64, 64, 2500),
        (64, 128, 1500),
        (128, 128, 1200),
    ] {
        let sites = clustered_sites(&mut rng, &subm, n);
        for g in [&subm, &strided] {
            let conv = conv_on_sites(&mut rng, g, &sites, cin, cout, cin % 2 == 0);
            let first = check(&conv, false);
            for par in [&Threads(4) as &dyn Parallel, &Threads(2), &Threads(3), &Serial] {
                assert_eq!(
                    bits(&conv.run(0, par).expect("runs")),
                    bits(&first),
                    "Cin {cin} Cout {cout} subm {}",
                    g.subm
                );
            }
        }
    }
}

#[test]
fn large_channel_counts_match_dense_reference() {
    let mut rng = Rng(17);
    let subm = Geometry::subm(1, [6, 10, 10], [3, 3, 3], [1; 3]);
    let strided =
        Geometry { stride: [2; 3], padding: [0, 1, 1], ..Geometry::new(1, [7, 10, 10], [3, 3, 3]) };
    let extra = Geometry { stride: [2, 1, 1], ..Geometry::new(1, [5, 6, 6], [3, 1, 1]) };
    for (cin, cout) in [(16, 16), (32, 32), (64, 64), (128, 128), (16, 32), (64, 128)] {
        check_geometry(&mut rng, &subm, 250, cin, cout, true);
        check_geometry(&mut rng, &strided, 250, cin, cout, false);
    }
    check_geometry(&mut rng, &extra, 120, 128, 128, true);
}

/// Features and bias drawn from values whose float32 sums depend on their order, and
/// filters of ones with Cin = 1, so that every product is exact: the output must then be
/// the float32 sum in exactly the contract's order (bias, then k ascending, then j
/// ascending), which this computes.
fn in_contract_order(c: &Conv, inverse: bool) -> Vec<f32> {
    assert_eq!(c.cin, 1);
    let mut out = vec![0f32; c.num_out * c.cout];
    for (e, v) in out.iter_mut().enumerate() {
        *v = c.bias.as_ref().map_or(0.0, |b| b[e % c.cout]);
    }
    for k in 0..c.k {
        for j in 0..c.num[k] as usize {
            let (a, b) =
                (c.pairs[(k * 2) * c.p + j] as usize, c.pairs[(k * 2 + 1) * c.p + j] as usize);
            let (src, dst) = if inverse { (b, a) } else { (a, b) };
            for co in 0..c.cout {
                out[dst * c.cout + co] += c.features[src] * c.filters[k * c.cout + co];
            }
        }
    }
    out
}

#[test]
fn sums_follow_k_then_j_across_chunks_and_row_tiles() {
    // Dense rulebooks with many repeated destinations: an offset's pairs into one row tile
    // outnumber a GEMM chunk (so runs are cut into several chunks), destinations fall on
    // both sides of tile boundaries, and offsets interleave. Cin = 1 and filters of ones make
    // every product exact, so the bits must be the float32 sums in (k, j) order.
    let mut rng = Rng(18);
    let magnitudes = [16777216.0f32, 1.0, -16777216.0, 0.75, 3.0e-3, -1.0, 4096.5, -0.125];
    for (k, p, l, num_out, cout) in [
        (3, 6000, 50, 40, 128),
        (5, 3000, 700, 600, 64),
        (2, 20000, 90, 300, 16),
        (27, 800, 400, 1000, 128),
    ] {
        for inverse in [false, true] {
            let (src_rows, dst_rows) = (l, num_out);
            let mut pairs = vec![0i32; k * 2 * p];
            let mut num = vec![0i32; k];
            for kk in 0..k {
                num[kk] = (p - rng.below(p / 4)) as i32;
                for j in 0..p {
                    // Destinations cluster on a few rows around tile-sized boundaries.
                    let dst = if rng.below(2) == 0 {
                        rng.below(dst_rows)
                    } else {
                        (rng.below(8) * 16 + rng.below(3)).min(dst_rows - 1)
                    };
                    let (s0, s1) = if inverse {
                        (dst, rng.below(src_rows))
                    } else {
                        (rng.below(src_rows), dst)
                    };
                    pairs[(kk * 2) * p + j] = s0 as i32;
                    pairs[(kk * 2 + 1) * p + j] = s1 as i32;
                }
            }
            let conv = Conv {
                l,
                cin: 1,
                cout,
                k,
                p,
                num_out,
                features: (0..l).map(|_| magnitudes[rng.below(magnitudes.len())]).collect(),
                filters: vec![1.0; k * cout],
                pairs,
                num,
                out_indices: vec![0; num_out * 2],
                out_d: 2,
                bias: Some((0..cout).map(|_| magnitudes[rng.below(magnitudes.len())]).collect()),
            };
            let want = in_contract_order(&conv, inverse);
            for par in [&Serial as &dyn Parallel, &Threads(2), &Threads(3), &Threads(4)] {
                let got = conv.run(inverse as i64, par).expect("runs");
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "K {k} P {p} num_out {num_out} Cout {cout} inverse {inverse}"
                );
            }
        }
    }
}

/// The fused path's arithmetic: for each pair in (k, j) order, each product added to the
/// output element by one fused multiply-add, in input-channel order.
fn fused_order(c: &Conv) -> Vec<f32> {
    let mut out = vec![0f32; c.num_out * c.cout];
    for (e, v) in out.iter_mut().enumerate() {
        *v = c.bias.as_ref().map_or(0.0, |b| b[e % c.cout]);
    }
    for k in 0..c.k {
        for j in 0..c.num[k] as usize {
            let (src, dst) =
                (c.pairs[(k * 2) * c.p + j] as usize, c.pairs[(k * 2 + 1) * c.p + j] as usize);
            for co in 0..c.cout {
                let o = &mut out[dst * c.cout + co];
                for ci in 0..c.cin {
                    *o = c.features[src * c.cin + ci]
                        .mul_add(c.filters[(k * c.cin + ci) * c.cout + co], *o);
                }
            }
        }
    }
    out
}

#[test]
fn cout_16_32_64_128_on_avx512_add_each_product_by_one_fma_in_channel_order() {
    // On a CPU with AVX-512F (this machine's) Cout 16, 32, 64 and 128 take the fused path:
    // the bits must be exactly its order; elsewhere the GEMM path's, within the class.
    // Random rulebooks repeat destinations within an offset, so groups of pairs with a
    // repeated row (taken pair by pair) are covered too.
    let fused = cfg!(target_arch = "x86_64") && is_avx512f();
    let mut rng = Rng(19);
    for (l, cin, cout, k, p, num_out) in [
        (300, 7, 16, 27, 200, 250),
        (200, 32, 32, 8, 300, 90),
        (90, 5, 64, 3, 400, 60),
        (50, 16, 16, 1, 600, 9),
        (80, 24, 128, 5, 150, 70),
    ] {
        for bias in [false, true] {
            let conv = random_conv(&mut rng, l, cin, cout, k, p, num_out, bias);
            let got = check(&conv, false);
            if fused {
                assert_eq!(bits(&got), bits(&fused_order(&conv)), "Cin {cin} Cout {cout} K {k}");
            }
        }
    }
}

/// `c` with the valid pairs of every offset in a random order: the same pairs, so with no
/// destination repeated within an offset every output element sums the same products in
/// the same order, but no offset's sources or destinations ascend any more.
fn shuffled_within_offsets(rng: &mut Rng, c: &Conv) -> Conv {
    let mut s = c.clone();
    for k in 0..c.k {
        let n = c.num[k] as usize;
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, rng.below(i + 1));
        }
        for slot in 0..2 {
            let base = (k * 2 + slot) * c.p;
            for (j, &o) in order.iter().enumerate() {
                s.pairs[base + j] = c.pairs[base + o];
            }
        }
    }
    s
}

#[test]
fn submanifold_rulebooks_in_any_site_order_give_the_bits_of_the_same_pairs_shuffled() {
    // A submanifold rulebook over sites in (batch, z, y, x) order has every offset's
    // destinations ascending; over sites in generation order its offsets ascend by source
    // and their mirror offsets by destination; shuffled within each offset, neither. The
    // kernel reads the first two in place (directly, or through the mirror offset) and
    // groups the third: at the fused path's widths (AVX-512F) all three must give the bits
    // of the fused order exactly, elsewhere results within the class (in `check`).
    let fused = cfg!(target_arch = "x86_64") && is_avx512f();
    let mut rng = Rng(23);
    let g = Geometry::subm(2, [8, 40, 40], [3, 3, 3], [1; 3]);
    for (cin, cout, n) in [
        (5, 16, 6000),
        (16, 16, 6000),
        (16, 32, 4000),
        (32, 64, 2000),
        (24, 128, 1200),
        (16, 48, 1500),
    ] {
        let sites = clustered_sites(&mut rng, &g, n);
        let mut sorted = sites.clone();
        sorted.sort();
        for sites in [&sites, &sorted] {
            let conv = conv_on_sites(&mut rng, &g, sites, cin, cout, true);
            let shuffled = shuffled_within_offsets(&mut rng, &conv);
            let (got, got_shuffled) = (check(&conv, false), check(&shuffled, false));
            if fused && cout != 48 {
                assert_eq!(bits(&got), bits(&fused_order(&conv)), "Cin {cin} Cout {cout}");
                assert_eq!(bits(&got_shuffled), bits(&got), "Cin {cin} Cout {cout}, shuffled");
            }
        }
    }
}

#[test]
fn a_mirror_offset_that_differs_by_one_pair_is_not_read_in_its_place() {
    // An offset whose pairs still ascend by source while its mirror offset holds other
    // pairs (one source moved up by one, one destination changed, or one pair fewer):
    // reading the mirror would be wrong, so the result must follow the offset's own pairs
    // (the rulebook reference in `check`, and the fused order exactly on AVX-512F).
    let mut rng = Rng(24);
    let g = Geometry::subm(1, [6, 30, 30], [3, 3, 3], [1; 3]);
    let sites = clustered_sites(&mut rng, &g, 1500);
    let base = conv_on_sites(&mut rng, &g, &sites, 16, 16, false);
    let (k, p) = (3, base.p);
    let n = base.num[k] as usize;
    let src = |j: usize| base.pairs[(k * 2) * p + j];
    // A source with a gap above it, so that moving it up keeps the sources ascending.
    let j = (0..n - 1).find(|&j| src(j + 1) - src(j) >= 2).expect("a gap between two sources");
    let mut one_source = base.clone();
    one_source.pairs[(k * 2) * p + j] += 1;
    let mut one_destination = base.clone();
    let d = &mut one_destination.pairs[(k * 2 + 1) * p + n / 2];
    *d = (*d + 1) % base.num_out as i32;
    let mut one_fewer = base.clone();
    one_fewer.num[k] -= 1;
    for (what, conv) in [
        ("one source", &one_source),
        ("one destination", &one_destination),
        ("one pair fewer", &one_fewer),
    ] {
        let got = check(conv, false);
        if cfg!(target_arch = "x86_64") && is_avx512f() {
            assert_eq!(bits(&got), bits(&fused_order(conv)), "{what}");
        }
    }
}

fn is_avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512f");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[test]
fn inverse_convolutions_at_backbone_channel_counts() {
    // An inverse convolution over a strided rulebook (features on the strided output sites,
    // results on its input sites), against the rulebook reference at 1-4 threads, and equal
    // bit for bit to a forward node over the slot-swapped rulebook.
    let mut rng = Rng(19);
    let g =
        Geometry { stride: [2; 3], padding: [1; 3], ..Geometry::new(2, [12, 48, 48], [3, 3, 3]) };
    for (cin, cout, n) in [(32, 16, 8000), (64, 32, 4000), (128, 64, 2000)] {
        let sites = clustered_sites(&mut rng, &g, n);
        let fwd = conv_on_sites(&mut rng, &g, &sites, cin, cout, true);
        let y = mixed_floats(&mut rng, fwd.num_out * cin);
        let inv = Conv {
            l: fwd.num_out,
            features: y.clone(),
            num_out: sites.len(),
            out_indices: sites.concat(),
            ..fwd.clone()
        };
        let got = check(&inv, true);
        let plain = swapped(&fwd, y, fwd.num_out, sites.len());
        assert_eq!(bits(&check(&plain, false)), bits(&got), "Cin {cin} Cout {cout}");
    }
}

#[test]
fn empty_offsets_and_rows_without_pairs() {
    // A 27-offset rulebook with offsets emptied (first, middle, last, all but one, all), and
    // output rows that no pair reaches (they must equal the bias exactly).
    let mut rng = Rng(20);
    let g = Geometry::subm(2, [12, 32, 32], [3, 3, 3], [1; 3]);
    let sites = clustered_sites(&mut rng, &g, 3000);
    let base = conv_on_sites(&mut rng, &g, &sites, 32, 64, true);
    let all: Vec<usize> = (0..27).collect();
    let empty_sets: [Vec<usize>; 6] = [
        vec![0],
        vec![13],
        vec![26],
        vec![0, 5, 13, 20, 26],
        all.iter().copied().filter(|&k| k != 7).collect(),
        all.clone(),
    ];
    for (case, emptied) in empty_sets.iter().enumerate() {
        let mut conv = base.clone();
        for &k in emptied {
            conv.num[k] = 0;
        }
        // Extra output rows past every destination: whole row tiles without pairs.
        conv.num_out = sites.len() + 5000;
        conv.out_indices = vec![0; conv.num_out * 4];
        let got = check(&conv, false);
        let bias = conv.bias.as_ref().expect("bias");
        for (row, out) in got.chunks(64).enumerate().skip(sites.len()) {
            assert_eq!(bits(out), bits(bias), "case {case}: row {row} has no pair");
        }
        if emptied.len() == 27 {
            assert!(
                got.chunks(64).all(|r| bits(r) == bits(bias)),
                "no pairs at all: every row is the bias"
            );
        }
    }
}

#[test]
fn huge_channel_counts_without_pairs_give_the_bias() {
    // No pair, so nothing is multiplied: Cin (and K) bound no buffer the kernel needs.
    for (l, cin) in [(0usize, 1usize << 40), (3, 0)] {
        let conv = Conv {
            l,
            cin,
            cout: 3,
            k: 0,
            p: 4,
            num_out: 70,
            features: vec![0.5; l * cin],
            filters: vec![],
            pairs: vec![],
            num: vec![],
            out_indices: vec![0; 70 * 4],
            out_d: 4,
            bias: Some(vec![1.5, -2.0, 0.25]),
        };
        let got = conv.run(0, &Threads(2)).expect("valid: no pairs");
        assert!(got.chunks(3).all(|r| r == [1.5, -2.0, 0.25]), "Cin {cin}: output = bias");
    }
}
