//! GetIndicePairs' unit tests (the plan, the keys and the rulebook pieces).

use super::keys::{Key, SortedSites};
use super::rulebook::*;
use super::*;
use crate::ops::operator::descriptor;
use crate::schema::AttrValue;
use std::collections::HashMap;

fn base() -> HashMap<String, AttrValue> {
    let mut m = HashMap::new();
    m.insert("batch_size".into(), AttrValue::Int(2));
    m.insert("spatial_shape".into(), AttrValue::Ints(vec![5, 6, 7]));
    m.insert("kernel_size".into(), AttrValue::Ints(vec![3, 3, 3]));
    m
}

fn with(pairs: &[(&str, AttrValue)]) -> HashMap<String, AttrValue> {
    let mut m = base();
    for (k, v) in pairs {
        m.insert((*k).into(), v.clone());
    }
    m
}

fn ints(v: &[i64]) -> AttrValue {
    AttrValue::Ints(v.to_vec())
}

/// The attribute an error names, and its rule text.
fn fails(m: &HashMap<String, AttrValue>) -> (String, String) {
    match descriptor::<GetIndicePairs>(m) {
        Err(Error::Attribute { name, rule }) => (name, rule),
        other => panic!("expected an attribute error, got {other:?}"),
    }
}

#[test]
fn defaults_build_the_seed_descriptor() {
    let op = descriptor::<GetIndicePairs>(&base()).expect("valid");
    assert_eq!(op.stride, [1, 1, 1]);
    assert_eq!(op.pad, [0, 0, 0]);
    assert_eq!(op.dilation, [1, 1, 1]);
    assert_eq!(op.output_padding, [0, 0, 0]);
    assert_eq!(op.output_space, [3, 4, 5]);
    assert!(!op.sub_m && !op.transpose && !op.inverse);
    assert_eq!(op.kernel_volume(), 27);
}

#[test]
fn seed_configurations() {
    let subm = with(&[
        ("batch_size", AttrValue::Int(4)),
        ("spatial_shape", ints(&[41, 1440, 1440])),
        ("padding", ints(&[1, 1, 1])),
        ("subm", AttrValue::Int(1)),
    ]);
    let op = descriptor::<GetIndicePairs>(&subm).expect("valid");
    assert_eq!(op.output_space, [41, 1440, 1440]);
    let sparse = with(&[
        ("batch_size", AttrValue::Int(4)),
        ("spatial_shape", ints(&[11, 360, 360])),
        ("stride", ints(&[2, 2, 2])),
        ("padding", ints(&[0, 1, 1])),
    ]);
    let op = descriptor::<GetIndicePairs>(&sparse).expect("valid");
    assert_eq!(op.output_space, [5, 180, 180]);
}

#[test]
fn transpose_output_size() {
    let m = with(&[
        ("transpose", AttrValue::Int(1)),
        ("stride", ints(&[2, 2, 2])),
        ("output_padding", ints(&[1, 0, 0])),
    ]);
    let op = descriptor::<GetIndicePairs>(&m).expect("valid");
    // (in - 1) * 2 + 2 + op + 1
    assert_eq!(op.output_space, [12, 13, 15]);
}

#[test]
fn non_positive_values() {
    assert_eq!(fails(&with(&[("batch_size", AttrValue::Int(0))])).0, "batch_size");
    assert_eq!(fails(&with(&[("spatial_shape", ints(&[5, -1, 7]))])).0, "spatial_shape");
    assert_eq!(fails(&with(&[("kernel_size", ints(&[0, 1, 1]))])).0, "kernel_size");
    assert_eq!(fails(&with(&[("stride", ints(&[1, 1, 0]))])).0, "stride");
    assert_eq!(fails(&with(&[("dilation", ints(&[1, 0, 1]))])).0, "dilation");
    assert_eq!(fails(&with(&[("padding", ints(&[-1, 0, 0]))])).0, "padding");
    let (name, rule) = fails(&with(&[("output_padding", ints(&[0, 0, -2]))]));
    assert_eq!(name, "output_padding");
    assert!(rule.contains("-2") && rule.contains(">= 0"), "{rule}");
}

#[test]
fn wrong_lengths_and_flags() {
    assert_eq!(fails(&with(&[("spatial_shape", ints(&[5, 6]))])).0, "spatial_shape");
    assert_eq!(fails(&with(&[("padding", ints(&[1, 1, 1, 1]))])).0, "padding");
    assert_eq!(fails(&with(&[("subm", AttrValue::Int(2))])).0, "subm");
    assert_eq!(fails(&with(&[("transpose", AttrValue::Int(-1))])).0, "transpose");
    assert_eq!(fails(&with(&[("inverse", AttrValue::Int(1))])).0, "inverse");
    let mut m = base();
    m.remove("batch_size");
    assert_eq!(fails(&m).0, "batch_size");
}

#[test]
fn kernel_volume_limit() {
    let ok = with(&[("spatial_shape", ints(&[16, 16, 16])), ("kernel_size", ints(&[16, 16, 16]))]);
    assert!(descriptor::<GetIndicePairs>(&ok).is_ok());
    let (name, rule) = fails(&with(&[
        ("spatial_shape", ints(&[1, 17, 241])),
        ("kernel_size", ints(&[1, 17, 241])),
    ]));
    assert_eq!(name, "kernel_size");
    assert!(rule.contains("4097"), "{rule}");
    // Product overflowing i64.
    let (name, _) = fails(&with(&[("kernel_size", ints(&[i64::MAX, i64::MAX, 2]))]));
    assert_eq!(name, "kernel_size");
}

#[test]
fn stride_with_dilation_on_one_axis() {
    let (name, rule) =
        fails(&with(&[("stride", ints(&[1, 2, 1])), ("dilation", ints(&[1, 2, 1]))]));
    assert_eq!(name, "dilation");
    assert!(rule.contains("stride 2 together with dilation 2 on axis 1"), "{rule}");
    let ok = with(&[
        ("spatial_shape", ints(&[4, 5, 3])),
        ("kernel_size", ints(&[1, 3, 1])),
        ("stride", ints(&[2, 1, 1])),
        ("dilation", ints(&[1, 2, 1])),
    ]);
    assert_eq!(descriptor::<GetIndicePairs>(&ok).expect("valid").output_space, [2, 1, 3]);
}

#[test]
fn output_size_rules() {
    let (name, rule) = fails(&with(&[("spatial_shape", ints(&[3, 2, 3]))]));
    assert_eq!(name, "kernel_size");
    assert!(rule.contains("axis 1") && rule.contains("= 0"), "{rule}");
    // Floor, not truncation: (2 - 2 - 1) / 2 + 1 would be 1 with truncation.
    let (name, _) =
        fails(&with(&[("spatial_shape", ints(&[5, 2, 7])), ("stride", ints(&[2, 2, 2]))]));
    assert_eq!(name, "kernel_size");
    let m = with(&[
        ("spatial_shape", ints(&[1, 1, 1])),
        ("kernel_size", ints(&[1, 1, 1])),
        ("padding", ints(&[1, 0, 0])),
        ("transpose", AttrValue::Int(1)),
    ]);
    assert_eq!(fails(&m).0, "padding");
    // Huge attributes: no overflow, a clear error or a valid size.
    let m =
        with(&[("spatial_shape", ints(&[i64::MAX, 5, 5])), ("padding", ints(&[i64::MAX, 0, 0]))]);
    let (name, rule) = fails(&m);
    assert_eq!(name, "spatial_shape");
    assert!(rule.contains("2147483647"), "{rule}");
    let m = with(&[
        ("spatial_shape", ints(&[i64::MAX, 5, 5])),
        ("padding", ints(&[i64::MAX, 0, 0])),
        ("stride", ints(&[i64::MAX, 1, 1])),
    ]);
    assert_eq!(descriptor::<GetIndicePairs>(&m).expect("valid").output_space, [3, 3, 3]);
    let m = with(&[
        ("transpose", AttrValue::Int(1)),
        ("stride", ints(&[i64::MAX, 1, 1])),
        ("spatial_shape", ints(&[i64::MAX, 5, 5])),
    ]);
    assert_eq!(fails(&m).0, "spatial_shape");
    let m = with(&[("spatial_shape", ints(&[1 << 31, 5, 5])), ("kernel_size", ints(&[1, 1, 1]))]);
    assert_eq!(fails(&m).0, "spatial_shape");
    let m =
        with(&[("spatial_shape", ints(&[(1 << 31) - 1, 5, 5])), ("kernel_size", ints(&[1, 1, 1]))]);
    assert_eq!(
        descriptor::<GetIndicePairs>(&m).expect("valid").output_space[0],
        i64::from(i32::MAX)
    );
}

#[test]
fn subm_rules() {
    let subm = |extra: &[(&str, AttrValue)]| {
        let mut m = with(&[("subm", AttrValue::Int(1)), ("padding", ints(&[1, 1, 1]))]);
        for (k, v) in extra {
            m.insert((*k).into(), v.clone());
        }
        m
    };
    assert!(descriptor::<GetIndicePairs>(&subm(&[])).is_ok());
    assert_eq!(fails(&subm(&[("stride", ints(&[2, 1, 1]))])).0, "stride");
    let (name, rule) = fails(&subm(&[("padding", ints(&[1, 0, 1]))]));
    assert_eq!(name, "padding");
    assert!(rule.contains("axis 1") && rule.contains("= 1"), "{rule}");
    assert_eq!(fails(&subm(&[("dilation", ints(&[2, 2, 2]))])).0, "padding");
    assert!(
        descriptor::<GetIndicePairs>(&subm(&[
            ("dilation", ints(&[2, 2, 2])),
            ("padding", ints(&[2, 2, 2]))
        ]))
        .is_ok()
    );
    assert_eq!(
        fails(&subm(&[("kernel_size", ints(&[2, 2, 2])), ("padding", ints(&[0, 0, 0]))])).0,
        "kernel_size"
    );
    assert_eq!(fails(&subm(&[("transpose", AttrValue::Int(1))])).0, "transpose");
    // output_padding is checked but unused outside transpose.
    assert!(descriptor::<GetIndicePairs>(&subm(&[("output_padding", ints(&[3, 3, 3]))])).is_ok());
}

#[test]
fn transpose_rejects_dilation() {
    let (name, rule) =
        fails(&with(&[("transpose", AttrValue::Int(1)), ("dilation", ints(&[1, 1, 2]))]));
    assert_eq!(name, "dilation");
    assert!(rule.contains("transpose"), "{rule}");
}

#[test]
fn keys_keep_lexicographic_order() {
    let l = Layout::new([3, 40, 1439, 1439]);
    assert_eq!(l.bits, 2 + 6 + 11 + 11);
    let a = u64::pack(&l, [1, 0, 1439, 1439]);
    let b = u64::pack(&l, [1, 1, 0, 0]);
    assert!(a < b);
    assert_eq!(b.unpack(&l), [1, 1, 0, 0]);
    let zero = Layout::new([0, 0, 0, 0]);
    assert_eq!(zero.bits, 0);
    assert_eq!(u64::pack(&zero, [0, 0, 0, 0]), 0);
    let wide = Layout::new([i32::MAX as u32; 4]);
    assert_eq!(wide.bits, 124);
    let c = [i32::MAX as u32, 5, i32::MAX as u32, 0];
    assert_eq!(u128::pack(&wide, c).unpack(&wide), c);
}

/// Lookups in sorted sites find every present key at its position and no absent key,
/// with prefix tables of 16 bits (few keys), of log2(keys) bits (many keys, clustered
/// or spread) and of the key's full width.
#[test]
fn sorted_sites_find_exactly_the_present_keys() {
    let mut next = crate::test_rng::xorshift(0x9E37_79B9_7F4A_7C15);
    for (n, bits, spread) in
        [(1000, 40, 40), (300_000, 40, 40), (300_000, 40, 22), (300_000, 18, 18), (0, 30, 30)]
    {
        let mask = (1u64 << spread) - 1;
        let mut keys: Vec<u64> = (0..n).map(|_| next() & mask & !1).collect();
        keys.sort_unstable();
        keys.dedup();
        let sites = SortedSites::new(keys.clone(), bits).unwrap();
        // One table entry per key at most (beyond the 16-bit minimum): the memory bound.
        assert!(
            sites.starts.len() - 1 <= keys.len().max(1 << 16),
            "{} entries for {} keys",
            sites.starts.len(),
            keys.len()
        );
        for (p, &k) in keys.iter().enumerate() {
            assert_eq!(sites.find(k), Some(p), "key {k:#x} of {n}, {bits} bits");
            // Present keys are even, so k + 1 is absent.
            assert_eq!(sites.find(k + 1), None, "absent key {:#x} of {n}, {bits} bits", k + 1);
        }
    }
}

/// What a conv book writes: indice_pairs, out_indices, indice_num.
fn written<K: Key>(
    op: &GetIndicePairs,
    book: &ConvBook<K>,
    l: usize,
) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let k = op.kernel_volume();
    let (mut pairs, mut out, mut num) =
        (vec![0i32; k * 2 * l], vec![0i32; book.sites.len() * 4], vec![0i32; k]);
    write_conv(book, &mut pairs, &mut out, &mut num, l, &crate::parallel::Serial).unwrap();
    (pairs, out, num)
}

/// Conv and transposed conv rulebooks (unique sites, and every offset's pairs) come out
/// the same whatever the emission block and sort range sizes and the thread count, and
/// with the output sites sorted or marked in a bitmap of the grid.
#[test]
fn conv_book_is_the_same_for_any_block_and_range_size_sorted_or_dense() {
    use crate::parallel::{Serial, Threads};
    let conv = with(&[("stride", ints(&[2, 1, 2])), ("padding", ints(&[1, 0, 1]))]);
    let transpose = with(&[("transpose", AttrValue::Int(1)), ("stride", ints(&[2, 2, 1]))]);
    let mut next = crate::test_rng::xorshift(0x2545_F491_4F6C_DD1D);
    let mut below = move |n: u64| (next() % n) as i32;
    // Random rows, duplicates included (legal outside subm).
    let data: Vec<i32> = (0..700).flat_map(|_| [below(2), below(5), below(6), below(7)]).collect();
    let l = data.len() / 4;
    for attrs in [conv, transpose] {
        let op = descriptor::<GetIndicePairs>(&attrs).unwrap();
        let whole = op.conv_book_in::<u64>(&data, 1, &Serial, usize::MAX, usize::MAX, 0).unwrap();
        assert_eq!(whole.blocks.len(), 1);
        let Sites::Sorted(sorted) = &whole.sites else {
            panic!("no bitmap allowed, yet one was made")
        };
        assert!(sorted.keys.windows(2).all(|w| w[0] < w[1]));
        let want = written(&op, &whole, l);
        assert!(want.1.chunks_exact(4).all(|c| c[0] < 2), "batches 0 and 1 only");
        for (emit_rows, sort_keys) in [(1, 1), (7, 3), (64, 50), (699, 1000)] {
            for threads in 1..=3 {
                for dense_words in [0, usize::MAX] {
                    let book = op
                        .conv_book_in::<u64>(
                            &data,
                            1,
                            &Threads(threads),
                            emit_rows,
                            sort_keys,
                            dense_words,
                        )
                        .unwrap();
                    assert_eq!(matches!(book.sites, Sites::Dense(_)), dense_words > 0);
                    let what = format!(
                        "blocks of {emit_rows}, ranges of {sort_keys}, {threads} threads, dense {dense_words}"
                    );
                    assert_eq!(written(&op, &book, l), want, "{what}");
                    if let Sites::Dense(grid) = &book.sites {
                        // The sites written in parts of one site or more, in parallel.
                        for grain in [1, 5] {
                            let mut out = vec![0i32; want.1.len()];
                            grid.write(&mut out, grain, &Threads(threads)).unwrap();
                            assert_eq!(out, want.1, "{what}, parts of {grain}");
                        }
                    }
                }
            }
        }
    }
}

/// Through the operator's own entry point, the bitmap is used where the grid is small
/// against the pairs the rows can emit, and not where it is large: a strided 3x3x3
/// conv of 2,000 rows into 20 x 63 x 63 outputs marks a bitmap; the same rows into 20
/// x 719 x 719 (1.29 MB of bitmap for at most 16,000 pairs) sort their keys, as do rows
/// into a big kernel with a big stride (at most one output per row).
#[test]
fn conv_book_takes_the_bitmap_only_for_a_grid_small_against_the_pairs() {
    let rows = |n: i32, span: i32| {
        (0..n).flat_map(move |i| [0, i % 41, (i * 7) % span, (i * 13) % span]).collect::<Vec<i32>>()
    };
    let book = |spatial: [i64; 3], kernel: [i64; 3], stride: [i64; 3], data: &[i32]| {
        let attrs = with(&[
            ("spatial_shape", ints(&spatial)),
            ("kernel_size", ints(&kernel)),
            ("stride", ints(&stride)),
            ("padding", ints(&[0, 0, 0])),
        ]);
        let op = descriptor::<GetIndicePairs>(&attrs).unwrap();
        matches!(
            op.conv_book::<u64>(data, 0, &crate::parallel::Serial).unwrap().sites,
            Sites::Dense(_)
        )
    };
    assert!(book([41, 128, 128], [3, 3, 3], [2, 2, 2], &rows(2000, 128)));
    assert!(!book([41, 1440, 1440], [3, 3, 3], [2, 2, 2], &rows(2000, 1440)));
    // 16 x 16 x 16 taps, stride 16: a row reaches one output, so 2,000 rows allow 4,096
    // words (the floor), and the 3 x 4096 x 4096 outputs need 786,432 (a bound of a
    // quarter word per tap, 2,048,000, would have taken it).
    assert!(!book([48, 65536, 65536], [16, 16, 16], [16, 16, 16], &rows(2000, 65536)));
}

/// A grid just over the bitmap bound is sorted, one at it is marked.
#[test]
fn the_output_grid_is_a_bitmap_only_within_its_bound() {
    let op = descriptor::<GetIndicePairs>(&with(&[("stride", ints(&[2, 2, 2]))])).unwrap();
    let data = [0, 1, 2, 3, 1, 4, 5, 6];
    let o = op.output_space.map(|v| v as usize);
    let words = (2 * o[0] * o[1] * o[2]).div_ceil(64);
    let book = |max_words| {
        op.conv_book_in::<u64>(&data, 1, &crate::parallel::Serial, 1, 1, max_words).unwrap()
    };
    assert!(matches!(book(words).sites, Sites::Dense(_)));
    assert!(matches!(book(words - 1).sites, Sites::Sorted(_)));
    assert_eq!(written(&op, &book(words), 2), written(&op, &book(words - 1), 2));
}

/// Wide (u128) keys: the same rulebook with and without cuts.
#[test]
fn wide_key_conv_book_is_the_same_for_any_cut() {
    use crate::parallel::{Serial, Threads};
    let big = 1i64 << 22;
    let op =
        descriptor::<GetIndicePairs>(&with(&[("spatial_shape", ints(&[big, big, big]))])).unwrap();
    let mut next = crate::test_rng::xorshift(0x9E37_79B9_7F4A_7C15);
    let mut below = move |n: i64| (next() % n as u64) as i32;
    // Clusters, so that neighbouring sites share output sites.
    let data: Vec<i32> = (0..300)
        .flat_map(|i| {
            let c = [below(2), below(big - 8), below(big - 8), below(big - 8)];
            [c[0], c[1] + i % 3, c[2] + below(3), c[3] + below(3)]
        })
        .collect();
    let layout = Layout::new([1, big as u32 - 3, big as u32 - 3, big as u32 - 3]);
    assert!(layout.bits > u64::BITS);
    // (A grid of 2^67 sites is never a bitmap.)
    let whole =
        op.conv_book_in::<u128>(&data, 1, &Serial, usize::MAX, usize::MAX, usize::MAX).unwrap();
    for (emit_rows, sort_keys) in [(1, 1), (13, 40)] {
        let book = op
            .conv_book_in::<u128>(&data, 1, &Threads(2), emit_rows, sort_keys, usize::MAX)
            .unwrap();
        let (Sites::Sorted(a), Sites::Sorted(b)) = (&book.sites, &whole.sites) else {
            panic!("a bitmap of 2^67 sites")
        };
        assert_eq!(a.keys, b.keys);
        for k in 0..op.kernel_volume() {
            let rows = |b: &ConvBook<u128>| {
                b.blocks.iter().flat_map(|e| e.rows[k].clone()).collect::<Vec<_>>()
            };
            let keys = |b: &ConvBook<u128>| {
                b.blocks.iter().flat_map(|e| e.keys[k].clone()).collect::<Vec<_>>()
            };
            assert_eq!(rows(&book), rows(&whole));
            assert_eq!(keys(&book), keys(&whole));
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Random conv and transposed-conv geometries: cutting the rulebook into blocks and
    /// sort ranges (on 2 threads), or marking the sites in a bitmap, never changes it.
    #[test]
    fn prop_conv_book_does_not_depend_on_the_cut(
        spatial in proptest::array::uniform3(1i64..9),
        kernel in proptest::array::uniform3(1i64..5),
        stride in proptest::array::uniform3(1i64..4),
        padding in proptest::array::uniform3(0i64..3),
        dilate in proptest::array::uniform3(1i64..3),
        transpose in proptest::bool::ANY,
        rows in proptest::collection::vec(proptest::array::uniform4(0u32..1000), 0..150),
        emit_rows in 1usize..20,
        sort_keys in 1usize..60,
        dense in proptest::bool::ANY,
    ) {
        use crate::parallel::{Serial, Threads};
        // Dilation only where the stride is 1, and never with transpose (contract rules).
        let dilation: Vec<i64> = (0..3).map(|a| if stride[a] > 1 || transpose { 1 } else { dilate[a] }).collect();
        let attrs = with(&[
            ("spatial_shape", ints(&spatial)),
            ("kernel_size", ints(&kernel)),
            ("stride", ints(&stride)),
            ("padding", ints(&padding)),
            ("dilation", ints(&dilation)),
            ("transpose", AttrValue::Int(i64::from(transpose))),
        ]);
        // Geometries without a valid output size are attribute errors, tested elsewhere.
        let Ok(op) = descriptor::<GetIndicePairs>(&attrs) else { return Ok(()) };
        let data: Vec<i32> = rows
            .iter()
            .flat_map(|r| [r[0] % 2, r[1] % spatial[0] as u32, r[2] % spatial[1] as u32, r[3] % spatial[2] as u32])
            .map(|v| v as i32)
            .collect();
        if data.is_empty() {
            return Ok(());
        }
        let max_batch = data.chunks_exact(4).map(|r| r[0] as u32).max().unwrap_or(0);
        let whole = op.conv_book_in::<u64>(&data, max_batch, &Serial, usize::MAX, usize::MAX, 0).unwrap();
        let book = op.conv_book_in::<u64>(&data, max_batch, &Threads(2), emit_rows, sort_keys, if dense { usize::MAX } else { 0 }).unwrap();
        proptest::prop_assert_eq!(written(&op, &book, data.len() / 4), written(&op, &whole, data.len() / 4));
    }
}
