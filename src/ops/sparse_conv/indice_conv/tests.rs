//! Unit tests of the rulebook reading (`in_place`) and the tiles (`tile_shift`).

use super::*;

/// How `in_place` reads a rulebook of offsets given as (slot 0, slot 1), P = 4 (padded
/// with -1), L = num_out = 4, one tile.
fn reads_of(offsets: &[(&[i32], &[i32])], slots: [usize; 2]) -> Option<Vec<Read>> {
    let pad = |v: &[i32]| (0..4).map(|j| v.get(j).copied().unwrap_or(-1)).collect::<Vec<_>>();
    let data: Vec<i32> = offsets.iter().flat_map(|&(a, b)| [pad(a), pad(b)].concat()).collect();
    let counts: Vec<usize> = offsets.iter().map(|o| o.0.len()).collect();
    match in_place(&data, &counts, 4, slots, [4, 4], 4, &crate::parallel::Serial)
        .expect("no allocation fails")
    {
        InPlace::Found(reads, starts) => {
            // One tile: each offset's range is all of its pairs.
            assert_eq!(starts, counts.iter().flat_map(|&n| [0, n]).collect::<Vec<_>>());
            Some(reads)
        }
        InPlace::Unordered => None,
        InPlace::OutOfRange => Some(vec![]),
    }
}

/// [`reads_of`] for K = 3: offsets 0 and 2 of two pairs, offset 1 of four.
fn reads(
    k0: [[i32; 2]; 2],
    k1: [[i32; 4]; 2],
    k2: [[i32; 2]; 2],
    counts: [usize; 3],
    slots: [usize; 2],
) -> Option<Vec<Read>> {
    let (k0, k2) =
        ([&k0[0][..counts[0]], &k0[1][..counts[0]]], [&k2[0][..counts[2]], &k2[1][..counts[2]]]);
    reads_of(&[(k0[0], k0[1]), (&k1[0][..counts[1]], &k1[1][..counts[1]]), (k2[0], k2[1])], slots)
}

#[test]
fn offsets_are_read_in_place_directly_or_through_a_mirror_holding_the_same_pairs() {
    use Read::{Mirror, Own};
    // Submanifold over sites x = 5, 3, 4, 9 (rows 0-3), kernel 3 along x: offset 0
    // maps x to x + 1 (rows 1 -> 2, 2 -> 0), offset 2 to x - 1 (0 -> 2, 2 -> 1), each
    // ascending by source; offset 1 is the identity.
    let (k0, k1, k2) = ([[1, 2], [2, 0]], [[0, 1, 2, 3], [0, 1, 2, 3]], [[0, 2], [2, 1]]);
    assert_eq!(reads(k0, k1, k2, [2, 4, 2], [0, 1]), Some(vec![Mirror, Own, Mirror]));
    // Inverse (slots swapped): the destinations ([1, 2] and [0, 2]) ascend themselves.
    assert_eq!(reads(k0, k1, k2, [2, 4, 2], [1, 0]), Some(vec![Own, Own, Own]));
    assert_eq!(
        reads([[2, 0], [1, 2]], k1, [[2, 1], [0, 2]], [2, 4, 2], [1, 0]),
        Some(vec![Mirror, Own, Mirror])
    );
    // The mirror differs by one pair, or holds one pair more: grouped instead.
    assert_eq!(reads(k0, k1, [[0, 2], [3, 1]], [2, 4, 2], [0, 1]), None);
    assert_eq!(reads(k0, k1, [[0, 3], [2, 1]], [2, 4, 2], [0, 1]), None);
    assert_eq!(reads(k0, k1, k2, [1, 4, 2], [0, 1]), None);
    // A repeated pair (sources not strictly ascending), though each is in the mirror,
    // whose own destinations ascend.
    assert_eq!(reads([[1, 1], [1, 1]], k1, [[0, 1], [0, 1]], [2, 4, 2], [0, 1]), None);
    // The mirror holds these pairs and one more (its own check then fails too).
    assert_eq!(
        reads_of(&[(&[1, 2], &[2, 0]), (&k1[0], &k1[1]), (&[0, 2, 3], &[2, 1, 3])], [0, 1]),
        None
    );
    // A mirror pair out of range: grouped (whose checks name it).
    assert_eq!(reads(k0, k1, [[0, 2], [2, 4]], [2, 4, 2], [0, 1]), None);
    // Out of range in an offset read directly.
    assert_eq!(reads(k0, [[0, 1, 2, 4], [0, 1, 2, 3]], k2, [2, 4, 2], [0, 1]), Some(vec![]));
    assert_eq!(reads(k0, [[0, 1, 2, -1], [0, 1, 2, 3]], k2, [2, 4, 2], [0, 1]), Some(vec![]));
    assert_eq!(reads(k0, [[0, 1, 2, 3], [0, 1, 2, 4]], k2, [2, 4, 2], [0, 1]), Some(vec![]));
    assert_eq!(reads(k0, [[0, 1, 2, 3], [-1, 1, 2, 3]], k2, [2, 4, 2], [0, 1]), Some(vec![]));
}

#[test]
fn a_stale_mirror_entry_of_another_offset_never_matches() {
    // K = 9: one task checks offsets 0 and 1 with one table. Offset 1's pairs are those
    // of offset 0, whose mirror (8) left them in the table; its own mirror (7) holds
    // others. Untagged entries would let offset 1 through.
    type Offset<'a> = (&'a [i32], &'a [i32]);
    let (a, b): Offset = (&[1, 2], &[2, 0]);
    let (empty, seven, eight): (Offset, Offset, Offset) =
        ((&[], &[]), (&[1, 3], &[1, 3]), (&[0, 2], &[2, 1]));
    let offsets = [(a, b), (a, b), empty, empty, empty, empty, empty, seven, eight];
    assert_eq!(reads_of(&offsets, [0, 1]), None);
    // With offset 1 emptied (and its mirror, 7) the rest is read in place.
    let offsets = [(a, b), empty, empty, empty, empty, empty, empty, empty, eight];
    assert_eq!(
        reads_of(&offsets, [0, 1]),
        Some([vec![Read::Mirror], vec![Read::Own; 7], vec![Read::Mirror]].concat())
    );
}

#[test]
fn tiles_follow_the_density_within_the_cache_bound() {
    // 100k rows, 16 channels, ~10 pairs per row over 27 offsets: 256 * 27 / 10 = 691 -> 512.
    assert_eq!(tile_shift(100_000, 16, 1_000_000, 27, 27), 9);
    // 128 channels cap the output block at 128 KiB = 256 rows.
    assert_eq!(tile_shift(10_000, 128, 10_000, 27, 27), 8);
    // Sparse: capped by the output block (2048 rows of 16 channels).
    assert_eq!(tile_shift(100_000, 16, 100_000, 27, 27), 11);
    // Dense: at least MIN_TILE_ROWS; no pairs: the cap; few rows: no larger than needed.
    assert_eq!(tile_shift(1000, 16, 1_000_000, 2, 27), 4);
    assert_eq!(tile_shift(1000, 16, 0, 0, 27), 10);
    assert_eq!(tile_shift(3, 16, 5, 1, 1), 4);
    assert_eq!(tile_shift(0, 0, 0, 0, 0), 4);
    assert_eq!(tile_shift(usize::MAX / 8, 1 << 20, usize::MAX / 8, 1, 1), 4);
    // k << shift must fit 32 bits: K = 2^30 leaves 2 bits, K = 2^32 none.
    assert_eq!(tile_shift(1000, 16, 0, 0, 1 << 30), 2);
    assert_eq!(tile_shift(1000, 16, 0, 0, 1 << 32), 0);
    assert_eq!(tile_shift(1000, 16, 0, 0, (1 << 28) + 1), 3);
}
