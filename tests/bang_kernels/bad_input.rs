//! The device path validates exactly as the CPU path: the same contract error, nothing
//! launched.

use super::*;
use onnxruntime_ep_mlu::ops::three_interpolate::backward::ThreeInterpolateBackward;
use onnxruntime_ep_mlu::ops::voxel_pooling::forward::VoxelPoolingForward;

fn same_error<O: BangOperator + Clone>(op: &O, inputs: &[Option<&Tensor>], rule: &str) {
    let cpu = run(op, inputs, &Threads(2)).expect_err("CPU rejects").to_string();
    let mlu = run_on_device(&device(), op, inputs).expect_err("MLU rejects").to_string();
    assert_eq!(cpu, mlu);
    assert!(mlu.contains(rule), "{mlu}");
}

#[test]
fn index_and_shape_rules() {
    let ti: ThreeInterpolateBackward =
        descriptor(&HashMap::from([("m".to_string(), AttrValue::Int(4))])).unwrap();
    let go = Tensor::f32([1, 2, 2], vec![1.0; 4]);
    let w = Tensor::f32([1, 2, 3], vec![0.5; 6]);
    let bad = Tensor::i32([1, 2, 3], vec![0, 1, 2, 3, 4, 0]);
    same_error(&ti, &[Some(&go), Some(&bad), Some(&w)], "outside [0, m)");
    let neg = Tensor::i32([1, 2, 3], vec![0, -1, 2, 3, 1, 0]);
    same_error(&ti, &[Some(&go), Some(&neg), Some(&w)], "outside [0, m)");
    // The kernel runs beside the check: int32's extremes must not overflow its tile test
    // in any M tile (m0 > 0 from the second; under scripts/sanitize.sh UBSan reports the
    // old `index - m0`).
    let wide: ThreeInterpolateBackward =
        descriptor(&HashMap::from([("m".to_string(), AttrValue::Int(1000))])).unwrap();
    let far = Tensor::i32([1, 2, 3], vec![700, i32::MIN, 2, i32::MAX, 999, 3]);
    same_error(
        &wide,
        &[Some(&go), Some(&far), Some(&w)],
        "indices[0, 0, 1] = -2147483648 is outside [0, m)",
    );
    // Seed boundary case 13: M = 0 with points is an error.
    let ti0: ThreeInterpolateBackward =
        descriptor(&HashMap::from([("m".to_string(), AttrValue::Int(0))])).unwrap();
    let zero = Tensor::i32([1, 2, 3], vec![0; 6]);
    same_error(&ti0, &[Some(&go), Some(&zero), Some(&w)], "outside [0, m)");

    let vp: VoxelPoolingForward =
        descriptor(&HashMap::from([("voxel_num".to_string(), AttrValue::Ints(vec![2, 2, 1]))]))
            .unwrap();
    let g = Tensor::i32([1, 2, 3], vec![0; 6]);
    let f = Tensor::f32([1, 3, 2], vec![0.0; 6]);
    same_error(&vp, &[Some(&g), Some(&f)], "input_features");
}

/// Every value rule reported by the check kernels on the card in the CPU path's words,
/// for the first broken row, whatever rows follow.
#[test]
fn value_rules_on_the_card() {
    use onnxruntime_ep_mlu::ops::dynamic_scatter::backward::DynamicScatterBackward;
    use onnxruntime_ep_mlu::ops::psroipool::backward::PsRoiPoolBackward;
    use onnxruntime_ep_mlu::ops::sparse_conv::get_indice_pairs::GetIndicePairs;
    let dsb: DynamicScatterBackward =
        descriptor(&HashMap::from([("reduce_type".to_string(), AttrValue::String("max".into()))]))
            .unwrap();
    let (m, c, n) = (3, 2, 5);
    let f = |r: usize| Tensor::f32([r, c], (0..r * c).map(|x| x as f32).collect());
    let count = Tensor::i32([m], vec![1; m]);
    for (map, rule) in [
        (vec![0, 1, 3, -2, 0], "point2voxel_map[2] = 3 must be < voxel_num V = 3"),
        (vec![0, -1, -7, 9, 0], "point2voxel_map[2] = -7 is below -1"),
    ] {
        let map = Tensor::i32([n], map);
        same_error(
            &dsb,
            &[Some(&f(m)), Some(&f(n)), Some(&f(m)), Some(&map), Some(&count), None],
            rule,
        );
    }
    // voxel_num = 2 makes row 2 invalid: the size input is read on the host.
    let (map, vn) = (Tensor::i32([n], vec![0, 1, 2, 0, 0]), Tensor::i32([1], vec![2]));
    let inputs = [Some(&f(m)), Some(&f(n)), Some(&f(m)), Some(&map), Some(&count), Some(&vn)];
    same_error(&dsb, &inputs, "point2voxel_map[2] = 2 must be < voxel_num V = 2");

    let prp: PsRoiPoolBackward = descriptor(&HashMap::from([
        ("pooled_height".to_string(), AttrValue::Int(1)),
        ("pooled_width".to_string(), AttrValue::Int(1)),
        ("spatial_scale".to_string(), AttrValue::Float(1.0)),
        ("output_dim".to_string(), AttrValue::Int(2)),
    ]))
    .unwrap();
    let top = Tensor::f32([3, 1, 1, 2], vec![1.0; 6]);
    let shape = Tensor::i64([4], vec![2, 4, 4, 2]);
    let good_map = Tensor::i32([3, 1, 1, 2], vec![0, 1, 1, 0, 0, 1]);
    // A non-finite roi is never an error, whatever its batch id; the next finite one is.
    let rois = Tensor::f32(
        [3, 5],
        vec![0.5, 0., 0., 1., 1., 9.0, f32::NAN, 0., 1., 1., 2.0, 0., 0., 1., 1.],
    );
    same_error(
        &prp,
        &[Some(&top), Some(&rois), Some(&good_map), Some(&shape)],
        "roi 2: batch_id 2 (truncated 2) outside [0, 2)",
    );
    let rois =
        Tensor::f32([3, 5], vec![-0.9, 0., 0., 1., 1., 1.5, 0., 0., 1., 1., 0., 0., 0., 1., 1.]);
    let bad_map = Tensor::i32([3, 1, 1, 2], vec![0, 1, 1, 2, -1, 1]);
    same_error(
        &prp,
        &[Some(&top), Some(&rois), Some(&bad_map), Some(&shape)],
        "value 2 at flat index 3 outside [0, channels = 2)",
    );

    let ints = |v: &[i64]| AttrValue::Ints(v.to_vec());
    for subm in [0, 1] {
        let gip: GetIndicePairs = descriptor(&HashMap::from([
            ("batch_size".to_string(), AttrValue::Int(2)),
            ("spatial_shape".to_string(), ints(&[4, 5, 6])),
            ("kernel_size".to_string(), ints(&[3, 3, 3])),
            ("padding".to_string(), ints(&[1, 1, 1])),
            ("subm".to_string(), AttrValue::Int(subm)),
        ]))
        .unwrap();
        let rows = Tensor::i32([3, 4], vec![0, 1, 2, 3, 1, 3, 4, 6, 2, 0, 0, 0]);
        same_error(
            &gip,
            &[Some(&rows)],
            "row 1 = [1, 3, 4, 6]: coordinate 6 on axis 2 (W, x) is outside [0, 6)",
        );
        let rows = Tensor::i32([2, 4], vec![1, 3, 4, 5, -1, 0, 0, 0]);
        same_error(
            &gip,
            &[Some(&rows)],
            "row 1 = [-1, 0, 0, 0]: batch -1 is outside [0, batch_size = 2)",
        );
    }
}

#[test]
fn seed_case_15_all_empty() {
    let ti: ThreeInterpolateBackward =
        descriptor(&HashMap::from([("m".to_string(), AttrValue::Int(0))])).unwrap();
    let e = |s: [usize; 3]| Tensor::f32(s, vec![]);
    let idx = Tensor::i32([0, 0, 3], vec![]);
    let (cpu, mlu) = both(&ti, &[Some(&e([0, 0, 0])), Some(&idx), Some(&e([0, 0, 3]))]);
    assert_eq!(mlu[0].shape, vec![0, 0, 0]);
    assert_eq!(cpu[0].shape, mlu[0].shape);
}
