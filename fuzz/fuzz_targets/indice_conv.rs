//! IndiceConv: inverse, shapes, rulebook (indice_num and pairs, some outside their ranges,
//! repeated destinations), bias, the fused epilogue (scale, shift, residual, activation;
//! sometimes of a wrong shape or an unknown activation) and values from the fuzzer's bytes;
//! every path against the CPU kernel, the plain CPU kernel against the suite's float64
//! rulebook reference, the fused node against the unfused graph's float32 steps on the plain
//! node's output, bit for bit (tests/reference/).
#![no_main]

use libfuzzer_sys::fuzz_target;
use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu::tensor::Tensor;
use onnxruntime_ep_mlu_fuzz::{Bytes, Class, bits, check, common, judge_terms, outcome};

#[path = "../../tests/reference/indice_conv.rs"]
#[allow(dead_code)]
mod reference;
use reference::{Conv, Epilogue, attrs, index_errors, reference};

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
    // Only without a bias: with one, MLU-OPS's sums round differently (the bias last) and a
    // shift or residual that cancels them leaves the difference beyond the class there (the
    // card's fused result is its own unfused one bit for bit:
    // tests/mluops_backend/indice_conv.rs).
    let plain_sums = conv.bias.is_none();
    let scale = (plain_sums && u.one_in(2)).then(|| u.floats(cout));
    let shift = (plain_sums && u.one_in(2)).then(|| u.floats(cout));
    let residual = (plain_sums && u.one_in(2)).then(|| u.floats(num_out * cout));
    let epilogue = Epilogue { scale, shift, residual, relu: u.one_in(2) };
    // Each output element adds feature x filter products (and the bias): the kernel on their
    // magnitudes adds the terms' magnitudes; with the epilogue on magnitudes too it gives
    // |scale| x that + |shift| + |residual|, the fused element's terms (relu, 1-Lipschitz,
    // the identity on them).
    let abs_conv = conv.magnitudes();
    let magnitudes: Vec<_> = abs_conv.tensors().into_iter().map(Some).collect();
    let plain = outcome(
        check("IndiceConv", &attrs(inverse), &inputs, Class::Accumulating(&magnitudes)),
        valid,
    );
    if let Some(out) = &plain {
        let got = out[0].data.f32().expect("float32 output");
        // Random signed terms can cancel: each element against its terms' magnitude.
        judge_terms(
            got,
            &reference(&conv, inverse == 1),
            &reference(&abs_conv, inverse == 1),
            common::ELEM_REL,
            "output against the reference",
        );
    }
    // The fused node; sometimes one of its epilogue inputs one column too wide.
    let mut fused_inputs = epilogue.inputs(&conv);
    let bad_shape = u.one_in(16) && fused_inputs.len() > 6;
    if bad_shape {
        let slot = 6 + u.below(fused_inputs.len() - 6);
        let rows = if slot == 8 { vec![num_out] } else { vec![] };
        let n = rows.first().unwrap_or(&1) * (cout + 1);
        fused_inputs[slot] = Some(Tensor::f32([rows, vec![cout + 1]].concat(), u.floats(n)));
    }
    let mut fused_attrs = epilogue.attrs(inverse);
    let unknown = u.one_in(16);
    if unknown {
        fused_attrs.insert("activation".into(), AttrValue::String("gelu".into()));
    }
    let abs = |v: &Option<Vec<f32>>| v.as_ref().map(|v| v.iter().map(|x| x.abs()).collect());
    let abs_epilogue = Epilogue {
        scale: abs(&epilogue.scale),
        shift: abs(&epilogue.shift),
        residual: abs(&epilogue.residual),
        relu: epilogue.relu,
    };
    let fused_magnitudes = abs_epilogue.inputs(&abs_conv);
    let fused = outcome(
        check("IndiceConv", &fused_attrs, &fused_inputs, Class::Accumulating(&fused_magnitudes)),
        valid && !bad_shape && !unknown,
    );
    if let (Some(plain), Some(fused)) = (plain, fused) {
        let want = epilogue.unfused(plain[0].data.f32().expect("float32 output"), cout);
        let want = Tensor::f32(fused[0].shape.clone(), want);
        // Every NaN alike: which operand's NaN a multiply or add returns is the hardware's
        // and the compiler's choice (it may commute them), not the contract's (seen: +NaN
        // fused where the unfused steps gave -NaN).
        assert_eq!(bits(&fused[0]), bits(&want), "fused epilogue against the unfused graph");
    }
});
