//! The fused epilogue (residual add, ReLU) against the unfused graph.

use super::errors::small;
use super::semantics::{clustered_sites, conv_on_sites};
use super::*;

/// The node with `e`'s epilogue, its output.
fn run_fused(c: &Conv, e: &Epilogue, par: &dyn Parallel) -> Result<Vec<f32>, Error> {
    let op: IndiceConv = descriptor(&e.attrs(0))?;
    let ts = e.inputs(c);
    let refs: Vec<Option<&Tensor>> = ts.iter().map(Option::as_ref).collect();
    let mut out = run(&op, &refs, par)?;
    Ok(out.remove(0).data.f32().expect("float32 output").to_vec())
}

/// Every subset of {scale, shift, residual, relu} over `c`, with values of both signs.
fn epilogues(rng: &mut Rng, c: &Conv) -> Vec<Epilogue> {
    (0..16)
        .map(|m| Epilogue {
            scale: (m & 1 != 0).then(|| rng.floats(c.cout).iter().map(|x| x * 2.0).collect()),
            shift: (m & 2 != 0).then(|| rng.floats(c.cout)),
            residual: (m & 4 != 0).then(|| rng.floats(c.num_out * c.cout)),
            relu: m & 8 != 0,
        })
        .collect()
}

#[test]
fn fused_epilogue_is_the_unfused_graph_bit_for_bit() {
    // Scale, shift, residual and ReLU on the plain convolution's output, each one float32
    // operation, whichever path (GEMM: Cout 3, 40; AVX-512 fused: 16, 64, 128), rulebook
    // (grouped: random; in place: submanifold and strided over sites), row tiles and threads.
    let mut rng = Rng(51);
    let mut convs: Vec<Conv> = [(3, 8), (16, 16), (40, 5), (64, 32), (128, 16)]
        .into_iter()
        .map(|(cout, cin)| random_conv(&mut rng, 300, cin, cout, 27, 300, 2500, cout % 2 == 0))
        .collect();
    let subm = Geometry::subm(2, [8, 32, 32], [3, 3, 3], [1; 3]);
    let strided =
        Geometry { stride: [2; 3], padding: [1; 3], ..Geometry::new(2, [8, 32, 32], [3, 3, 3]) };
    let sites = clustered_sites(&mut rng, &subm, 3000);
    for (g, cout) in [(&subm, 16), (&strided, 32), (&subm, 24)] {
        convs.push(conv_on_sites(&mut rng, g, &sites, 16, cout, true));
    }
    for c in &convs {
        let plain = c.run(0, &Serial).expect("plain convolution runs");
        for e in epilogues(&mut rng, c) {
            let want = bits(&e.unfused(&plain, c.cout));
            for par in [&Serial as &dyn Parallel, &Threads(3)] {
                let got = run_fused(c, &e, par).expect("fused convolution runs");
                assert_eq!(bits(&got), want, "Cout {} epilogue {e:?}", c.cout);
            }
        }
    }
}

#[test]
fn without_the_epilogue_the_output_is_the_plain_convolutions() {
    // activation "none" given explicitly, the optional inputs absent: the same bits as the
    // node without the attribute, whose sums the tests above pin to the contract's order.
    let mut rng = Rng(52);
    for cout in [5, 16, 64] {
        let c = random_conv(&mut rng, 60, 7, cout, 27, 60, 200, true);
        let plain = c.run(0, &Threads(2)).expect("runs");
        let none = Epilogue::default();
        assert_eq!(bits(&run_fused(&c, &none, &Threads(2)).expect("runs")), bits(&plain));
    }
}

#[test]
fn relu_keeps_nan_and_negative_zero_and_zeroes_negatives() {
    // One output row per case: plain output 0 (no pair), residual the value, ReLU.
    let c = Conv { num: vec![0; 3], ..random_conv(&mut Rng(53), 4, 3, 5, 3, 4, 1, false) };
    let residual = vec![f32::NAN, -0.0, -1.5, 2.0, f32::NEG_INFINITY];
    let e = Epilogue { residual: Some(residual), relu: true, ..Epilogue::default() };
    let got = run_fused(&c, &e, &Serial).expect("runs");
    // 0 + NaN = NaN, 0 + -0 = +0 (round to nearest), -1.5 -> 0, 2, -inf -> 0.
    assert!(got[0].is_nan(), "{got:?}");
    assert_eq!(bits(&got[1..]), bits(&[0.0, 0.0, 2.0, 0.0]));
    // A negative-zero product kept through ReLU: scale -1 on a plain 0 gives -0.
    let e = Epilogue { scale: Some(vec![-1.0; 5]), relu: true, ..Epilogue::default() };
    assert_eq!(bits(&run_fused(&c, &e, &Serial).expect("runs")), bits(&[-0.0f32; 5]));
}

#[test]
fn epilogue_shape_dtype_or_activation_mismatch_is_error() {
    let c = small(); // Cout 2, num_out 6
    let full = Epilogue {
        scale: Some(vec![1.0; 2]),
        shift: Some(vec![0.0; 2]),
        residual: Some(vec![0.0; 12]),
        relu: true,
    };
    for (slot, name, bad) in [
        (6, "scale", Tensor::f32([3], vec![1.0; 3])),
        (6, "scale", Tensor::f32([1, 2], vec![1.0; 2])),
        (6, "scale", Tensor::i32([2], vec![1; 2])),
        (7, "shift", Tensor::f32([1], vec![0.0])),
        (7, "shift", Tensor::f32([], vec![0.0])),
        (8, "residual", Tensor::f32([5, 2], vec![0.0; 10])),
        (8, "residual", Tensor::f32([6, 3], vec![0.0; 18])),
        (8, "residual", Tensor::f32([12], vec![0.0; 12])),
        (8, "residual", Tensor::f16([6, 2], vec![half::f16::ZERO; 12])),
    ] {
        let mut ts = full.inputs(&c);
        ts[slot] = Some(bad);
        let op: IndiceConv = descriptor(&full.attrs(0)).expect("valid attributes");
        let refs: Vec<Option<&Tensor>> = ts.iter().map(Option::as_ref).collect();
        let err = run(&op, &refs, &Serial).expect_err("contract says error");
        let msg = format!("{err}");
        assert_eq!(err.code(), ort_sys::OrtErrorCode::ORT_INVALID_ARGUMENT, "{msg}");
        assert!(msg.contains(&format!("'{name}'")), "message should name {name}: {msg}");
    }
    // The full epilogue with valid shapes runs.
    run_fused(&c, &full, &Serial).expect("valid epilogue runs");
    for bad in ["Relu", "relu6", "leaky_relu", ""] {
        let mut a = attrs(0);
        a.insert("activation".into(), AttrValue::String(bad.into()));
        let e = descriptor::<IndiceConv>(&a).expect_err("unknown activation");
        assert!(format!("{e}").contains("'activation'"), "{e}");
    }
    let mut a = attrs(0);
    a.insert("activation".into(), AttrValue::Int(1));
    let e = descriptor::<IndiceConv>(&a).expect_err("activation is a string");
    assert!(format!("{e}").contains("'activation'"), "{e}");
}
