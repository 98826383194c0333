//! GetIndicePairs: every attribute (set or left to its default; some breaking a rule), and
//! input sites (some outside the batch or the grid, duplicates) from the fuzzer's bytes;
//! every path against the CPU kernel, the CPU kernel element for element against the
//! suite's brute-force reference, which also says which cases the contract makes errors
//! (tests/reference/).
#![no_main]

use libfuzzer_sys::fuzz_target;
use onnxruntime_ep_mlu::tensor::Tensor;
use onnxruntime_ep_mlu_fuzz::{Bytes, Class, check, outcome};

#[path = "../../tests/reference/get_indice_pairs.rs"]
#[allow(dead_code)]
mod reference;
use reference::{Attrs, Expect, expect, reference};

/// Three values in lo..lo+n, about one time in 4 left unset, one in 64 of the wrong length.
fn three(u: &mut Bytes, lo: i64, n: usize) -> Option<Vec<i64>> {
    if u.one_in(4) {
        return None;
    }
    let len = if u.one_in(64) { 2 } else { 3 };
    Some((0..len).map(|_| lo + u.below(n) as i64).collect())
}

fn flag(u: &mut Bytes) -> Option<i64> {
    match u.below(8) {
        0 => None,
        1 => Some(2),
        k => Some(i64::from(k >= 6)),
    }
}

fn attrs(u: &mut Bytes) -> Attrs {
    Attrs {
        batch_size: Some(u.below(4) as i64),
        spatial_shape: three(u, 1, 7),
        kernel_size: three(u, 1, 3),
        stride: three(u, 1, 2),
        padding: three(u, 0, 2),
        dilation: three(u, 1, 2),
        output_padding: three(u, 0, 2),
        subm: flag(u),
        transpose: flag(u),
        inverse: if u.one_in(32) { Some(1) } else { None },
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Bytes::new(data);
    let a = attrs(&mut u);
    let batch = a.batch_size.unwrap_or(1).max(1) as usize;
    let spatial = a.spatial_shape.clone().filter(|s| s.len() == 3).unwrap_or(vec![4; 3]);
    let l = u.below(16);
    let mut rows: Vec<[i32; 4]> = (0..l)
        .map(|_| {
            let b = u.below(batch) as i32;
            [
                b,
                u.below(spatial[0] as usize) as i32,
                u.below(spatial[1] as usize) as i32,
                u.below(spatial[2] as usize) as i32,
            ]
        })
        .collect();
    if u.one_in(8) && l > 0 {
        let (at, axis) = (u.below(l), u.below(4));
        rows[at][axis] = if u.one_in(2) {
            -1
        } else if axis == 0 {
            batch as i32
        } else {
            spatial[axis - 1] as i32
        };
    }
    let flat: Vec<i32> = rows.iter().flatten().copied().collect();
    let want = expect(&a, &[l, 4], &flat);
    let input = Tensor::i32([l, 4], flat);
    let result = check("GetIndicePairs", &a.map(), &[Some(input)], Class::Exact);
    if let Some(out) = outcome(result, matches!(want, Expect::Valid(_))) {
        let Expect::Valid(conv) = want else {
            unreachable!("outcome() asserted the case is valid")
        };
        let r = reference(&conv, &rows);
        let got = |i: usize| out[i].data.i32().expect("int32 output").to_vec();
        assert_eq!(got(2), r.num, "indice_num against the reference");
        assert_eq!(got(1), r.out, "out_indices against the reference");
        assert_eq!(got(0), r.pairs, "indice_pairs against the reference");
    }
});
