//! IndiceConv on MLU-OPS: the bias and the fused epilogue added on the card after the
//! library's call, and the rulebooks it would get wrong or refuse declined.

use super::*;

/// IndiceConv's inputs over GetIndicePairs' rulebook (the CPU kernel's) of `input` sites.
fn conv_inputs(
    gip: &[(&'static str, AttrValue)],
    input: &Tensor,
    cin: usize,
    cout: usize,
    bias: bool,
) -> Vec<Tensor> {
    let rulebook = cpu("GetIndicePairs", gip, &[Some(input)]).expect("a valid rulebook");
    let (l, k) = (input.shape[0], rulebook[0].shape[0]);
    let mut v = vec![
        f32s(&[l, cin], 11),
        f32s(&[k, cin, cout], 12),
        rulebook[0].clone(),
        rulebook[2].clone(),
        rulebook[1].clone(),
    ];
    if bias {
        v.push(f32s(&[cout], 13));
    }
    v
}

/// Runs IndiceConv through the node runner on `order`; asserts where it ran and its output
/// against the CPU kernel's within the accumulating class (the bias comes last on MLU-OPS).
fn conv_runs_on(inputs: &[Tensor], order: &'static [Backend], want: Backend) {
    let attrs = [("inverse", AttrValue::Int(0))];
    let (got, ran) =
        run_node_on_device(&device(), &node("IndiceConv", &attrs, order), &refs(inputs))
            .expect("the node runs");
    assert_eq!(ran, Ran::Card(want, vec![]), "IndiceConv: where it ran");
    let reference = cpu("IndiceConv", &attrs, &refs(inputs)).expect("CPU kernel runs");
    let (OwnedData::F32(g), OwnedData::F32(r)) = (&got[0].data, &reference[0].data) else {
        panic!("float outputs")
    };
    assert_eq!(got[0].shape, reference[0].shape);
    let scale = r.iter().fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
    let worst = g.iter().zip(r).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(
        worst <= 1e-6 * scale,
        "IndiceConv on {want:?}: max |a-b| = {worst} against max |ref| = {scale}"
    );
}

#[test]
fn indice_conv_runs_on_mluops_with_the_bias_added_on_the_card() {
    let input = sites(60);
    for (gip, bias) in
        [(gip_attrs(0, 3, 2), true), (gip_attrs(0, 3, 1), false), (gip_attrs(1, 3, 1), true)]
    {
        conv_runs_on(&conv_inputs(&gip, &input, 5, 7, bias), MLUOPS, Backend::MluOps);
    }
    // Without a bias the library's sums are the CPU kernel's, bit for bit (the emulated
    // library computes with it); with one, only the bias's place in each sum differs.
    let plain = conv_inputs(&gip_attrs(0, 3, 2), &input, 4, 6, false);
    runs_on(
        "IndiceConv",
        &[("inverse", AttrValue::Int(0))],
        MLUOPS,
        &refs(&plain),
        Ran::Card(Backend::MluOps, vec![]),
    );
    // No pair at all (every indice_num 0): the bias alone, written without the library.
    let mut none = conv_inputs(&gip_attrs(0, 3, 2), &input, 4, 6, true);
    none[3] = i32s(&none[3].shape.clone(), vec![0; none[3].shape[0]]);
    conv_runs_on(&none, MLUOPS, Backend::MluOps);
}

#[test]
fn indice_conv_declines_what_mluops_would_get_wrong_or_refuse() {
    let attrs = [("inverse", AttrValue::Int(0))];
    // Duplicate input rows: a destination repeats within an offset, which the library's
    // ScatterNd (UPDATE) would not sum.
    let s = sites(30);
    let OwnedData::I32(v) = &s.data else { unreachable!() };
    let twice = i32s(&[60, 4], v.iter().chain(v).copied().collect());
    let dup = conv_inputs(&gip_attrs(0, 3, 2), &twice, 4, 6, true);
    runs_on("IndiceConv", &attrs, MLUOPS, &refs(&dup), Ran::Host("distinct destinations".into()));
    // P != L: the library wants indice_pairs' last dimension equal to features' rows.
    let mut wide = conv_inputs(&gip_attrs(0, 3, 2), &sites(60), 4, 6, false);
    wide[0] = f32s(&[61, 4], 11);
    runs_on(
        "IndiceConv",
        &attrs,
        MLUOPS,
        &refs(&wide),
        Ran::Host("P = 60 != features' L = 61".into()),
    );
    let inverse = node("IndiceConv", &[("inverse", AttrValue::Int(1))], MLUOPS)
        .static_choice(&device().info, None);
    assert!(
        inverse.is_err_and(|why| why.to_string().contains("inverse = 1")),
        "inverse is declined at placement"
    );
    // A pair out of range: the contract's error from the checks before the library.
    let mut bad = conv_inputs(&gip_attrs(0, 3, 2), &sites(60), 4, 6, true);
    let OwnedData::I32(pairs) = &mut bad[2].data else { unreachable!() };
    let p = 60;
    pairs[(13 * 2 + 1) * p] = 1 << 20;
    let err = run_node_on_device(&device(), &node("IndiceConv", &attrs, MLUOPS), &refs(&bad))
        .expect_err("destination out of range");
    let want = cpu("IndiceConv", &attrs, &refs(&bad)).expect_err("CPU rejects");
    assert_eq!(err.to_string(), want.to_string(), "the same contract error on both paths");
}

#[test]
fn indice_conv_with_no_kernel_offset_is_the_bias_on_the_card() {
    // K = 0: indice_num is an empty size input, read as such.
    let (l, cin, cout) = (5, 3, 4);
    let inputs = [
        f32s(&[l, cin], 15),
        f32s(&[0, cin, cout], 16),
        i32s(&[0, 2, l], Vec::new()),
        i32s(&[0], Vec::new()),
        i32s(&[7, 4], vec![0; 28]),
        f32s(&[cout], 17),
    ];
    conv_runs_on(&inputs, MLUOPS, Backend::MluOps);
}

#[test]
fn indice_conv_epilogue_runs_on_the_card_after_the_library() {
    // scale (some channels negative), shift, residual and ReLU by the epilogue step on the
    // card. Without a bias the library's sums are the CPU kernel's and the epilogue is the
    // same float32 operations: bit for bit (runs_on). With a bias, only its place differs.
    let input = sites(60);
    let attrs = [("inverse", AttrValue::Int(0)), ("activation", AttrValue::String("relu".into()))];
    for gip in [gip_attrs(0, 3, 2), gip_attrs(1, 3, 1)] {
        let conv = conv_inputs(&gip, &input, 5, 7, true);
        let rows = conv[4].shape[0];
        let signed = |t: Tensor| {
            let OwnedData::F32(v) = t.data else { unreachable!() };
            Tensor { shape: t.shape, data: OwnedData::F32(v.iter().map(|x| x - 0.6).collect()) }
        };
        let (scale, shift, residual) =
            (signed(f32s(&[7], 21)), signed(f32s(&[7], 22)), signed(f32s(&[rows, 7], 23)));
        let epilogue = [Some(&scale), Some(&shift), Some(&residual)];
        let plain: Vec<Option<&Tensor>> = conv[..5].iter().map(Some).chain([None]).collect();
        for given in 0..8 {
            let mut inputs = plain.clone();
            inputs.extend(
                epilogue.iter().enumerate().map(|(i, t)| t.filter(|_| (given >> i) & 1 == 1)),
            );
            runs_on("IndiceConv", &attrs, MLUOPS, &inputs, Ran::Card(Backend::MluOps, vec![]));
        }
        // With the bias: the card's fused output is its unfused graph's (the plain node on the
        // card, then Mul, Add, Add and Relu, one float32 operation each), bit for bit.
        let on_card = |attrs: &[(&str, AttrValue)], inputs: &[Option<&Tensor>]| {
            let (got, ran) =
                run_node_on_device(&device(), &node("IndiceConv", attrs, MLUOPS), inputs)
                    .expect("the node runs");
            assert_eq!(ran, Ran::Card(Backend::MluOps, vec![]));
            let OwnedData::F32(v) = &got[0].data else { panic!("float output") };
            v.clone()
        };
        let inputs: Vec<Option<&Tensor>> =
            conv.iter().map(Some).chain(epilogue.iter().copied()).collect();
        let fused = on_card(&attrs, &inputs);
        let plain = on_card(&attrs[..1], &inputs[..6]);
        let value = |t: &Tensor, i: usize| match &t.data {
            OwnedData::F32(v) => v[i],
            _ => unreachable!(),
        };
        let unfused: Vec<u32> = plain
            .iter()
            .enumerate()
            .map(|(e, &y)| {
                let y = (y * value(&scale, e % 7) + value(&shift, e % 7)) + value(&residual, e);
                if y < 0.0 { 0f32.to_bits() } else { y.to_bits() }
            })
            .collect();
        assert!(fused.iter().filter(|&&v| v == 0.0).count() > fused.len() / 10, "ReLU clamps some");
        assert_eq!(fused.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), unfused);
    }
}
