//! IndiceConv: inverse, shapes, rulebook (indice_num and pairs, some outside their ranges,
//! repeated destinations), bias and values from the fuzzer's bytes; every path against the
//! CPU kernel, the CPU kernel against the suite's float64 rulebook reference
//! (tests/reference/).
#![no_main]

use libfuzzer_sys::fuzz_target;
use onnxruntime_ep_mlu_fuzz::{Bytes, Class, check, common, judge, outcome};

#[path = "../../tests/reference/indice_conv.rs"]
#[allow(dead_code)]
mod reference;
use reference::{Conv, attrs, index_errors, reference};

fuzz_target!(|data: &[u8]| {
    let mut u = Bytes::new(data);
    let inverse = [0, 0, 0, 1, 1, 2][u.below(6)];
    let (k, l, cin, cout, num_out) =
        (u.below(5), u.below(9), u.below(5), 1 + u.below(4), u.below(9));
    let p = l + usize::from(u.one_in(8));
    // Slot 0 holds input rows and slot 1 output rows; inverse reads them the other way.
    let (rows0, rows1) = if inverse == 1 { (num_out, l) } else { (l, num_out) };
    let mut pairs = Vec::with_capacity(k * 2 * p);
    for _ in 0..k {
        pairs.extend((0..p).map(|_| u.below(rows0) as i32));
        pairs.extend((0..p).map(|_| u.below(rows1) as i32));
    }
    let mut num: Vec<i32> = (0..k).map(|_| u.below(p + 1) as i32).collect();
    if u.one_in(8) && k > 0 {
        let at = u.below(k);
        num[at] = if u.one_in(2) { -1 } else { p as i32 + 1 };
    }
    if u.one_in(8) && !pairs.is_empty() {
        let at = u.below(pairs.len());
        pairs[at] = if u.one_in(2) { -1 } else { rows0.max(rows1) as i32 };
    }
    let bias = if u.one_in(2) { Some(u.floats(cout)) } else { None };
    let out_d = 1 + u.below(4);
    let conv = Conv {
        l,
        cin,
        cout,
        k,
        p,
        num_out,
        features: u.floats(l * cin),
        filters: u.floats(k * cin * cout),
        pairs,
        num,
        out_indices: vec![0; num_out * out_d],
        out_d,
        bias,
    };
    let (num_bad, pair_bad) = index_errors(&conv, inverse == 1);
    let valid = inverse < 2 && !num_bad && !pair_bad;
    let inputs: Vec<_> = conv.tensors().into_iter().map(Some).collect();
    if let Some(out) =
        outcome(check("IndiceConv", &attrs(inverse), &inputs, Class::Accumulating), valid)
    {
        let got = out[0].data.f32().expect("float32 output");
        judge(
            got,
            &reference(&conv, inverse == 1),
            common::ELEM_REL,
            "output against the reference",
        );
    }
});
