//! PsRoiPool and PsRoiPoolBackward on MLU-OPS: the rois rounded as the contract rounds
//! them, and the bin edges, coordinates and pooled sizes the library cannot take declined.

use super::*;

fn psroi_attrs() -> Vec<(&'static str, AttrValue)> {
    vec![
        ("pooled_height", AttrValue::Int(3)),
        ("pooled_width", AttrValue::Int(3)),
        // 0.3: no bin edge of the rois below within an ulp of an integer (those decline).
        ("spatial_scale", AttrValue::Float(0.3)),
        ("output_dim", AttrValue::Int(2)),
    ]
}

fn psroi_inputs(rois: Vec<f32>) -> Vec<Tensor> {
    let r = rois.len() / 5;
    let map: Vec<i32> = (0..r * 9 * 2).map(|i| (i * 5 % 18) as i32).collect();
    vec![
        f32s(&[r, 3, 3, 2], 6),
        Tensor { shape: vec![r, 5], data: OwnedData::F32(rois) },
        i32s(&[r, 3, 3, 2], map),
        Tensor { shape: vec![4], data: OwnedData::I64(vec![2, 12, 10, 18]) },
    ]
}

#[test]
fn psroipool_backward_rois_are_rounded_as_the_contract_rounds_before_the_library() {
    // Half-integer and negative fractional coordinates (where rounding down and rounding
    // half away from zero differ; the emulated library rounds down); non-finite rois
    // contribute nothing.
    let rois = vec![
        0.0,
        1.5,
        2.5,
        9.5,
        7.5, //
        1.0,
        -0.5,
        0.4,
        3.6,
        11.5, //
        1.9,
        2.5,
        1.5,
        2.5,
        1.5, //
        0.0,
        f32::NAN,
        1.0,
        2.0,
        3.0, //
        1.0,
        0.0,
        0.0,
        f32::INFINITY,
        4.0,
    ];
    let inputs = psroi_inputs(rois);
    runs_on(
        "PsRoiPoolBackward",
        &psroi_attrs(),
        MLUOPS,
        &refs(&inputs),
        Ran::Card(Backend::MluOps, vec![]),
    );
}

#[test]
fn psroipool_backward_bin_edges_or_coordinates_beyond_int_go_to_the_next_path() {
    let inputs = psroi_inputs(vec![0.0, 1.0e12, 2.0, 1.0e12 + 4096.0, 7.0]);
    runs_on(
        "PsRoiPoolBackward",
        &psroi_attrs(),
        AUTO,
        &refs(&inputs),
        Ran::Card(Backend::Bang, vec![(Backend::MluOps, "int range".into())]),
    );
    runs_on(
        "PsRoiPoolBackward",
        &psroi_attrs(),
        MLUOPS,
        &refs(&inputs),
        Ran::Host("int range".into()),
    );
    // A far end coordinate whose roi width the 0.1 floor keeps small (a fuzz finding: the
    // library converts the coordinate itself to int).
    let far_end = psroi_inputs(vec![1.0, 2.0, 3.0, -3.0e38, 5.0]);
    runs_on(
        "PsRoiPoolBackward",
        &psroi_attrs(),
        MLUOPS,
        &refs(&far_end),
        Ran::Host("int range".into()),
    );
}

#[test]
fn psroipool_bin_edges_within_an_ulp_of_an_integer_go_to_the_next_path() {
    // Scale 0.2, roi x from 1 to 6: bin 1.2 / 3 and the edge 1 * bin + 0.2 come out as
    // 0.99999994 in float32, one ulp below 1 (floor 0 by the contract; a division one ulp
    // off or a fused multiply-add on the card gives 1). The second roi: 1.0000001.
    let mut attrs = psroi_attrs();
    attrs[2] = ("spatial_scale", AttrValue::Float(0.2));
    let rois = vec![0.0, 1.0, 0.0, 6.0, 0.0, 1.0, 2.0, 1.0, 5.0, 4.0];
    let rule = "within one ulp of an integer";
    let backward = psroi_inputs(rois.clone());
    runs_on(
        "PsRoiPoolBackward",
        &attrs,
        AUTO,
        &refs(&backward),
        Ran::Card(Backend::Bang, vec![(Backend::MluOps, rule.into())]),
    );
    // Our BANG kernel takes the edges from the host: the contract's bins.
    runs_on(
        "PsRoiPoolBackward",
        &attrs,
        &[Backend::Bang],
        &refs(&backward),
        Ran::Card(Backend::Bang, vec![]),
    );
    runs_on("PsRoiPoolBackward", &attrs, MLUOPS, &refs(&backward), Ran::Host(rule.into()));
    // The forward has no BANG kernel: the CPU.
    runs_on(
        "PsRoiPool",
        &attrs,
        AUTO,
        &refs(&psroi_forward_inputs(2, rois)),
        Ran::Host(rule.into()),
    );
    // Integer-aligned edges are as exposed (scale 1, bin 2: the edge 2 becomes 1.9999999).
    attrs[2] = ("spatial_scale", AttrValue::Float(1.0));
    let aligned = vec![0.0, 0.0, 0.0, 5.0, 5.0];
    runs_on(
        "PsRoiPoolBackward",
        &attrs,
        AUTO,
        &refs(&psroi_inputs(aligned.clone())),
        Ran::Card(Backend::Bang, vec![(Backend::MluOps, rule.into())]),
    );
    runs_on(
        "PsRoiPool",
        &attrs,
        MLUOPS,
        &refs(&psroi_forward_inputs(1, aligned)),
        Ran::Host(rule.into()),
    );
}

fn psroi_forward_inputs(batches: usize, rois: Vec<f32>) -> Vec<Tensor> {
    let r = rois.len() / 5;
    vec![f32s(&[batches, 12, 10, 18], 9), Tensor { shape: vec![r, 5], data: OwnedData::F32(rois) }]
}

#[test]
fn psroipool_forward_rois_that_give_nothing_become_empty_rois_not_a_skipped_batch() {
    // Non-finite rois first and in the middle: the vendor's forward kernel stops a core's
    // remaining rois at an out-of-range batch (the emulated library fails the call), so
    // they must reach it as rois with empty bins. Half-integer coordinates test rounding.
    let rois = vec![
        0.0,
        f32::NAN,
        1.0,
        2.0,
        3.0, //
        0.0,
        1.5,
        2.5,
        9.5,
        7.5, //
        1.0,
        0.0,
        0.0,
        f32::INFINITY,
        4.0, //
        1.0,
        -0.5,
        0.4,
        3.6,
        11.5, //
        1.9,
        2.5,
        1.5,
        2.5,
        1.5,
    ];
    for scale in [0.3f32, 0.01, 2.9] {
        let mut attrs = psroi_attrs();
        attrs[2] = ("spatial_scale", AttrValue::Float(scale));
        runs_on(
            "PsRoiPool",
            &attrs,
            MLUOPS,
            &refs(&psroi_forward_inputs(2, rois.clone())),
            Ran::Card(Backend::MluOps, vec![]),
        );
    }
    // An empty map with rois: the library writes nothing, the contract fills mapping_channel.
    let empty = psroi_forward_inputs(0, vec![f32::NAN, 0.0, 0.0, 1.0, 1.0]);
    runs_on(
        "PsRoiPool",
        &psroi_attrs(),
        MLUOPS,
        &refs(&empty),
        Ran::Host("empty input map".into()),
    );
    // A finite roi on a batch outside [0, batches): the contract's error, before the library.
    let bad = psroi_forward_inputs(2, vec![2.0, 1.0, 1.0, 3.0, 3.0]);
    let err =
        run_node_on_device(&device(), &node("PsRoiPool", &psroi_attrs(), MLUOPS), &refs(&bad))
            .expect_err("batch 2");
    let want = cpu("PsRoiPool", &psroi_attrs(), &refs(&bad)).expect_err("CPU rejects");
    assert_eq!(err.to_string(), want.to_string(), "the same contract error on both paths");
    // Coordinates beyond the int range the library converts to: no card path, the CPU.
    let far = psroi_forward_inputs(2, vec![0.0, 1.0e12, 2.0, 1.0e12 + 4096.0, 7.0]);
    runs_on("PsRoiPool", &psroi_attrs(), AUTO, &refs(&far), Ran::Host("int range".into()));
}

#[test]
fn psroipool_forward_pooled_sizes_the_library_kernel_cannot_hold_decline() {
    // pooled 35: the forward kernel's channel block per NRAM pass is 0 there (a division by
    // zero in the vendor's kernel); pooled 34 still runs.
    for (pooled, want) in [
        (34i64, Ran::Card(Backend::MluOps, vec![])),
        (35, Ran::Host("fits no output channel block".into())),
    ] {
        let attrs = [
            ("pooled_height", AttrValue::Int(pooled)),
            ("pooled_width", AttrValue::Int(pooled)),
            ("spatial_scale", AttrValue::Float(1.0)),
            ("output_dim", AttrValue::Int(1)),
        ];
        let c = (pooled * pooled) as usize;
        let inputs = [
            f32s(&[1, 6, 5, c], 14),
            Tensor {
                shape: vec![2, 5],
                // Widths prime to 34 and ends on the map's border: no bin edge within an
                // ulp of an integer inside the map.
                data: OwnedData::F32(vec![0.0, 0.0, 1.0, 4.0, 5.0, 0.0, 2.0, 1.0, 4.0, 5.0]),
            },
        ];
        runs_on("PsRoiPool", &attrs, MLUOPS, &refs(&inputs), want);
    }
}
