//! The errors, one per rule of the contract.

use super::*;

/// L 4, Cin 3, Cout 2, K 3, P 5, num_out 6, bias; unused slots hold garbage.
pub(super) fn small() -> Conv {
    random_conv(&mut Rng(77), 4, 3, 2, 3, 5, 6, true)
}

/// As `small`, with every slot used and valid for inverse = 0 (slot 0 < 4, slot 1 < 6).
fn full_small() -> Conv {
    let mut c = small();
    c.num = vec![5; 3];
    for k in 0..3 {
        for j in 0..5 {
            c.pairs[(k * 2) * 5 + j] = ((j + k) % 4) as i32;
            c.pairs[(k * 2 + 1) * 5 + j] = ((2 * j + k) % 6) as i32;
        }
    }
    c
}

/// Replaces input `slot` and expects an error naming `name`.
/// A replaced tensor of another dtype must be reported as a dtype error, one of another
/// shape as a shape error.
fn expect_error(c: &Conv, inverse: i64, slot: usize, t: Tensor, name: &str) -> String {
    let mut ts = c.tensors();
    let rule = if std::mem::discriminant(&ts[slot].data) != std::mem::discriminant(&t.data) {
        Some("dtype")
    } else if ts[slot].shape != t.shape {
        Some("shape")
    } else {
        None
    };
    ts[slot] = t;
    let err = run_tensors(inverse, &ts, &Threads(2)).expect_err("contract says error");
    let msg = format!("{err}");
    assert_eq!(err.code(), ort_sys::OrtErrorCode::ORT_INVALID_ARGUMENT, "{msg}");
    assert!(msg.contains(&format!("'{name}'")), "message should name {name}: {msg}");
    if let Some(rule) = rule {
        assert!(msg.contains(rule), "message should state the {rule} rule: {msg}");
    }
    msg
}

#[test]
fn inverse_not_zero_or_one_is_error() {
    for bad in [2, -1, i64::MAX] {
        let e = descriptor::<IndiceConv>(&attrs(bad)).expect_err("inverse must be 0 or 1");
        assert!(format!("{e}").contains("'inverse'"), "{e}");
    }
    let wrong = HashMap::from([("inverse".to_string(), AttrValue::Float(1.0))]);
    let e = descriptor::<IndiceConv>(&wrong).expect_err("inverse is an int");
    assert!(format!("{e}").contains("'inverse'"), "{e}");
    // Default 0.
    let op: IndiceConv = descriptor(&HashMap::new()).expect("inverse is optional");
    let c = small();
    let ts = c.tensors();
    let refs: Vec<Option<&Tensor>> = ts.iter().map(Some).collect();
    let got = run(&op, &refs, &Serial).expect("runs");
    assert_eq!(got[0], run_tensors(0, &ts, &Serial).expect("runs"));
}

#[test]
fn features_shape_or_dtype_mismatch_is_error() {
    let c = small();
    expect_error(&c, 0, 0, Tensor::f32([12], c.features.clone()), "features");
    expect_error(&c, 0, 0, Tensor::f32([4, 3, 1], c.features.clone()), "features");
    expect_error(&c, 0, 0, Tensor::i32([4, 3], vec![0; 12]), "features");
    expect_error(&c, 0, 0, Tensor::f16([4, 3], vec![half::f16::ZERO; 12]), "features");
}

#[test]
fn filters_shape_or_dtype_mismatch_is_error() {
    let c = small(); // K 3, Cin 3, Cout 2
    // Cin differs from features', rank 2, rank 4, dtype.
    expect_error(&c, 0, 1, Tensor::f32([3, 2, 3], c.filters.clone()), "filters");
    expect_error(&c, 0, 1, Tensor::f32([9, 2], c.filters.clone()), "filters");
    expect_error(&c, 0, 1, Tensor::f32([3, 3, 2, 1], c.filters.clone()), "filters");
    expect_error(&c, 0, 1, Tensor::i32([3, 3, 2], vec![0; 18]), "filters");
}

#[test]
fn indice_pairs_shape_or_dtype_mismatch_is_error() {
    let c = small(); // K 3, P 5
    // K differs from filters' (either side), middle dimension not 2, rank, dtype.
    for t in [
        Tensor::i32([2, 2, 5], c.pairs[..20].to_vec()),
        Tensor::i32([4, 2, 5], [c.pairs.clone(), vec![0; 10]].concat()),
        Tensor::i32([3, 1, 10], c.pairs.clone()),
        Tensor::i32([3, 3, 5], [c.pairs.clone(), vec![0; 15]].concat()),
        Tensor::i32([6, 5], c.pairs.clone()),
        Tensor::i64([3, 2, 5], vec![0; 30]),
        Tensor::f32([3, 2, 5], vec![0.0; 30]),
    ] {
        expect_error(&c, 0, 2, t, "indice_pairs");
    }
}

#[test]
fn indice_num_shape_or_dtype_mismatch_is_error() {
    let c = small();
    for t in [
        Tensor::i32([2], vec![0; 2]),
        Tensor::i32([4], vec![0; 4]),
        Tensor::i32([3, 1], vec![0; 3]),
        Tensor::i32([], vec![0]),
        Tensor::i64([3], vec![0; 3]),
        Tensor::f32([3], vec![0.0; 3]),
    ] {
        expect_error(&c, 0, 3, t, "indice_num");
    }
}

#[test]
fn out_indices_not_rank_two_is_error() {
    let c = small();
    for t in [
        Tensor::i32([6], vec![0; 6]),
        Tensor::i32([6, 4, 1], vec![0; 24]),
        Tensor::i32([], vec![0]),
    ] {
        let e = expect_error(&c, 0, 4, t, "out_indices");
        assert!(e.contains("shape"), "{e}");
    }
    // out_indices is int32.
    expect_error(&c, 0, 4, Tensor::f32([6, 4], vec![0.0; 24]), "out_indices");
}

#[test]
fn bias_shape_or_dtype_mismatch_is_error() {
    let c = small(); // Cout 2
    for t in [
        Tensor::f32([3], vec![0.0; 3]),
        Tensor::f32([1], vec![0.0]),
        Tensor::f32([1, 2], vec![0.0; 2]),
        Tensor::f32([], vec![0.0]),
        Tensor::i32([2], vec![0; 2]),
    ] {
        expect_error(&c, 0, 5, t, "bias");
    }
}

#[test]
fn missing_required_input_is_error() {
    let c = small();
    let ts = c.tensors();
    let names = ["features", "filters", "indice_pairs", "indice_num", "out_indices"];
    for (slot, name) in names.iter().enumerate() {
        let inputs: Vec<Option<&Tensor>> =
            ts.iter().enumerate().map(|(k, t)| (k != slot).then_some(t)).collect();
        let op: IndiceConv = descriptor(&attrs(0)).expect("valid");
        let e = run(&op, &inputs, &Serial).expect_err("required input missing");
        assert!(format!("{e}").contains(&format!("'{name}'")), "{e}");
    }
}

#[test]
fn indice_num_outside_zero_to_p_is_error() {
    for inverse in [0, 1] {
        for bad in [-1, 6, i32::MIN, i32::MAX] {
            let mut c = small(); // P 5
            if inverse == 1 {
                c = Conv {
                    l: 6,
                    num_out: 4,
                    features: vec![0.5; 18],
                    out_indices: vec![0; 16],
                    ..c
                };
            }
            c.num[1] = bad;
            let e = expect_error(&c, inverse, 3, Tensor::i32([3], c.num.clone()), "indice_num");
            assert!(e.contains(&bad.to_string()), "{e}");
        }
    }
    // indice_num[k] = P is legal.
    check(&full_small(), false);
}

#[test]
fn source_row_outside_features_is_error() {
    // inverse = 0: slot 0 is the source, in [0, L = 4).
    check(&full_small(), false);
    for bad in [-1, 4, 5, i32::MIN, i32::MAX] {
        let mut c = full_small();
        c.pairs[(2 * 2) * 5 + 1] = bad;
        let e = expect_error(&c, 0, 2, Tensor::i32([3, 2, 5], c.pairs.clone()), "indice_pairs");
        assert!(e.contains(&bad.to_string()), "{e}");
    }
    // A value valid as a destination (num_out 6) but not as a source (L 4).
    let mut c = full_small();
    c.pairs[0] = 5;
    expect_error(&c, 0, 2, Tensor::i32([3, 2, 5], c.pairs.clone()), "indice_pairs");
}

#[test]
fn destination_row_outside_output_is_error() {
    // inverse = 0: slot 1 is the destination, in [0, num_out = 6).
    for bad in [-1, 6, i32::MIN, i32::MAX] {
        let mut c = full_small();
        c.pairs[(2 + 1) * 5 + 4] = bad; // k 1, slot 1, j 4
        let e = expect_error(&c, 0, 2, Tensor::i32([3, 2, 5], c.pairs.clone()), "indice_pairs");
        assert!(e.contains(&bad.to_string()), "{e}");
    }
}

#[test]
fn inverse_checks_the_swapped_slots() {
    // inverse = 1 with L 4, num_out 6: slot 1 is the source (< 4), slot 0 the destination (< 6).
    let mut c = small();
    c.num = vec![1, 0, 0];
    c.pairs[0] = 5; // destination 5 < num_out: fine
    c.pairs[5] = 3; // source 3 < L: fine
    check(&c, true);
    // Source 4 (= L) in slot 1: error, though valid as an inverse = 0 destination.
    c.pairs[5] = 4;
    expect_error(&c, 1, 2, Tensor::i32([3, 2, 5], c.pairs.clone()), "indice_pairs");
    c.run(0, &Serial).expect_err("slot 0 = 5 is not a source row either");
    // Destination 6 (= num_out) in slot 0.
    c.pairs[5] = 0;
    c.pairs[0] = 6;
    expect_error(&c, 1, 2, Tensor::i32([3, 2, 5], c.pairs.clone()), "indice_pairs");
}

#[test]
fn unused_slots_are_not_read() {
    let mut c = small();
    c.num = vec![2, 0, 1];
    for k in 0..3 {
        for j in 0..5 {
            let used = (j as i32) < c.num[k];
            let (s, d) = if used { ((j % 4) as i32, (j % 6) as i32) } else { (i32::MIN, i32::MAX) };
            c.pairs[(k * 2) * 5 + j] = s;
            c.pairs[(k * 2 + 1) * 5 + j] = d;
        }
    }
    check(&c, false);
}
