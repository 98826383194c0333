//! DynamicScatterBackward, ThreeInterpolate and its backward, GetIndicePairs and
//! VoxelPoolingForward on MLU-OPS: where each runs, the declines to the next path and to the
//! CPU, and the value checks gating the library's calls.

use super::*;

fn dsb_inputs(n: usize, m: usize, c: usize) -> Vec<Tensor> {
    let map: Vec<i32> = (0..n).map(|i| if i % 7 == 3 { -1 } else { (i % m) as i32 }).collect();
    let mut count = vec![0i32; m];
    for &v in map.iter().filter(|&&v| v >= 0) {
        count[v as usize] += 1;
    }
    let feats = f32s(&[n, c], 1);
    // voxel_feats: each voxel's max over its points, so that the max rule has matches.
    let OwnedData::F32(f) = &feats.data else { unreachable!() };
    let mut vf = vec![f32::NEG_INFINITY; m * c];
    for (i, &v) in map.iter().enumerate().filter(|(_, v)| **v >= 0) {
        for ch in 0..c {
            vf[v as usize * c + ch] = vf[v as usize * c + ch].max(f[i * c + ch]);
        }
    }
    vec![
        f32s(&[m, c], 2),
        feats,
        Tensor { shape: vec![m, c], data: OwnedData::F32(vf) },
        i32s(&[n], map),
        i32s(&[m], count),
    ]
}

#[test]
fn dynamic_scatter_backward_max_runs_on_mluops() {
    let inputs = dsb_inputs(300, 40, 9);
    let max = [("reduce_type", AttrValue::String("max".into()))];
    runs_on(
        "DynamicScatterBackward",
        &max,
        MLUOPS,
        &refs(&inputs),
        Ran::Card(Backend::MluOps, vec![]),
    );
}

#[test]
fn declines_go_to_the_next_path_then_to_the_cpu() {
    let inputs = dsb_inputs(300, 40, 9);
    // mean: MLU-OPS implements max only; auto takes the BANG kernels, mluops alone the CPU.
    let mean = [("reduce_type", AttrValue::String("mean".into()))];
    runs_on(
        "DynamicScatterBackward",
        &mean,
        MLUOPS,
        &refs(&inputs),
        Ran::Host("no card path supports".into()),
    );
    let max = [("reduce_type", AttrValue::String("max".into()))];
    // N < M at run time: MLU-OPS requires N >= M.
    let few = dsb_inputs(30, 40, 9);
    runs_on(
        "DynamicScatterBackward",
        &max,
        AUTO,
        &refs(&few),
        Ran::Card(Backend::Bang, vec![(Backend::MluOps, "N >= M".into())]),
    );
    runs_on("DynamicScatterBackward", &max, MLUOPS, &refs(&few), Ran::Host("N >= M".into()));
    let n = node("DynamicScatterBackward", &mean, AUTO);
    let why = n.static_choice(&device().info, None).expect_err("no backend runs mean").to_string();
    assert!(
        why.starts_with("mluops: ") && why.contains("; bang: "),
        "each backend's reason, in order: {why}"
    );
    let n = node("DynamicScatterBackward", &max, AUTO);
    assert_eq!(
        n.static_choice(&device().info, None),
        Ok((Backend::MluOps, vec![])),
        "auto tries MLU-OPS first"
    );
    // Submanifold GetIndicePairs: MLU-OPS passed over at placement, its reason kept.
    let (first, passed_over) = node("GetIndicePairs", &gip_attrs(1, 3, 1), AUTO)
        .static_choice(&device().info, None)
        .expect("the BANG kernels run subm");
    assert_eq!(first, Backend::Bang);
    assert!(
        passed_over.len() == 1 && passed_over[0].starts_with("mluops: "),
        "MLU-OPS's reason is kept: {passed_over:?}"
    );
}

#[test]
fn three_interpolate_backward_float_runs_on_mluops_and_float16_declines() {
    let (b, c, n, m) = (2, 5, 40, 17);
    let idx: Vec<i32> = (0..b * n * 3).map(|i| ((i * 7) % m) as i32).collect();
    let inputs = [f32s(&[b, c, n], 3), i32s(&[b, n, 3], idx.clone()), f32s(&[b, n, 3], 4)];
    let attrs = [("m", AttrValue::Int(m as i64))];
    runs_on(
        "ThreeInterpolateBackward",
        &attrs,
        MLUOPS,
        &refs(&inputs),
        Ran::Card(Backend::MluOps, vec![]),
    );
    let half = |t: &Tensor| {
        let OwnedData::F32(v) = &t.data else { unreachable!() };
        Tensor {
            shape: t.shape.clone(),
            data: OwnedData::F16(v.iter().map(|&x| half::f16::from_f32(x)).collect()),
        }
    };
    let h = [half(&inputs[0]), inputs[1].clone(), half(&inputs[2])];
    let n16 = node("ThreeInterpolateBackward", &attrs, MLUOPS);
    let (_, ran) = run_node_on_device(&device(), &n16, &refs(&h)).expect("runs");
    assert!(matches!(&ran, Ran::Host(why) if why.contains("float16")), "{ran:?}");
}

#[test]
fn get_indice_pairs_runs_on_mluops_with_num_act_out_from_the_descriptor() {
    let input = sites(60);
    runs_on(
        "GetIndicePairs",
        &gip_attrs(0, 3, 2),
        MLUOPS,
        &[Some(&input)],
        Ran::Card(Backend::MluOps, vec![]),
    );
    runs_on(
        "GetIndicePairs",
        &gip_attrs(0, 3, 1),
        MLUOPS,
        &[Some(&input)],
        Ran::Card(Backend::MluOps, vec![]),
    );
    let empty = i32s(&[0, 4], Vec::new());
    runs_on(
        "GetIndicePairs",
        &gip_attrs(0, 3, 2),
        MLUOPS,
        &[Some(&empty)],
        Ran::Card(Backend::MluOps, vec![]),
    );
    // subm: declined (the duplicate-site rule cannot be checked around the library).
    runs_on(
        "GetIndicePairs",
        &gip_attrs(1, 3, 1),
        AUTO,
        &[Some(&input)],
        Ran::Card(Backend::Bang, vec![]),
    );
    // A batch_size beyond int32 (a fuzz finding): the descriptor takes ints, so declined.
    let mut huge = gip_attrs(0, 3, 2);
    huge[0] = ("batch_size", AttrValue::Int(1 << 40));
    runs_on(
        "GetIndicePairs",
        &huge,
        MLUOPS,
        &[Some(&input)],
        Ran::Host("no card path supports".into()),
    );
    // batch * output volume beyond int32 (32 nuScenes-sized grids): the library's int grid
    // would overflow, so MLU-OPS is passed over at placement.
    let mut big = gip_attrs(0, 3, 1);
    big[0] = ("batch_size", AttrValue::Int(32));
    big[1] = ("spatial_shape", AttrValue::Ints(vec![41, 1440, 1440]));
    let why = node("GetIndicePairs", &big, MLUOPS)
        .static_choice(&device().info, None)
        .expect_err("declined")
        .to_string();
    assert!(why.contains("MLU-OPS computes its grid in int"), "{why}");
}

#[test]
fn get_indice_pairs_site_count_defect_goes_to_the_next_path() {
    // K = 1, stride 1, the same site twice: every (site, offset) pair is valid and the sites
    // repeat, where the library's count drops one site (emulated as the vendor's code does).
    let twice = i32s(&[2, 4], vec![1, 2, 3, 4, 1, 2, 3, 4]);
    runs_on(
        "GetIndicePairs",
        &gip_attrs(0, 1, 1),
        AUTO,
        &[Some(&twice)],
        Ran::Card(Backend::Bang, vec![(Backend::MluOps, "drops one".into())]),
    );
    runs_on(
        "GetIndicePairs",
        &gip_attrs(0, 1, 1),
        MLUOPS,
        &[Some(&twice)],
        Ran::Host("drops one".into()),
    );
}

#[test]
fn voxel_pooling_forward_runs_on_mluops_and_empty_sizes_decline() {
    let (b, n, c) = (2, 50, 6);
    let geom: Vec<i32> = (0..b * n * 3).map(|i| (i * 5 % 13) as i32 - 2).collect();
    let inputs = [i32s(&[b, n, 3], geom), f32s(&[b, n, c], 5)];
    let attrs = [("voxel_num", AttrValue::Ints(vec![8, 7, 6]))];
    runs_on(
        "VoxelPoolingForward",
        &attrs,
        MLUOPS,
        &refs(&inputs),
        Ran::Card(Backend::MluOps, vec![]),
    );
    let empty = [i32s(&[b, 0, 3], Vec::new()), f32s(&[b, 0, c], 5)];
    runs_on(
        "VoxelPoolingForward",
        &attrs,
        AUTO,
        &refs(&empty),
        Ran::Card(Backend::Bang, vec![(Backend::MluOps, "no empty B, N or C".into())]),
    );
}

#[test]
fn an_out_of_range_index_is_the_contract_error_and_never_reaches_the_library() {
    let mut inputs = dsb_inputs(300, 40, 9);
    inputs[3] = i32s(&[300], (0..300).map(|i| if i == 17 { 40 } else { i % 40 }).collect());
    let max = [("reduce_type", AttrValue::String("max".into()))];
    let n = node("DynamicScatterBackward", &max, MLUOPS);
    let err = run_node_on_device(&device(), &n, &refs(&inputs))
        .expect_err("map[17] = 40 >= V")
        .to_string();
    let want =
        cpu("DynamicScatterBackward", &max, &refs(&inputs)).expect_err("CPU rejects").to_string();
    assert_eq!(err, want, "the same contract error on both paths");
    assert!(!err.contains("MLU-OPS"), "the library must not have been called: {err}");
}

#[test]
fn three_interpolate_forward_runs_on_mluops_only_and_float16_declines() {
    let (b, c, n, m) = (2, 5, 40, 17);
    let idx: Vec<i32> = (0..b * n * 3).map(|i| ((i * 5) % m) as i32).collect();
    let inputs = [f32s(&[b, c, m], 7), i32s(&[b, n, 3], idx.clone()), f32s(&[b, n, 3], 8)];
    runs_on("ThreeInterpolate", &[], MLUOPS, &refs(&inputs), Ran::Card(Backend::MluOps, vec![]));
    runs_on("ThreeInterpolate", &[], AUTO, &refs(&inputs), Ran::Card(Backend::MluOps, vec![]));
    let half = |t: &Tensor| {
        let OwnedData::F32(v) = &t.data else { unreachable!() };
        Tensor {
            shape: t.shape.clone(),
            data: OwnedData::F16(v.iter().map(|&x| half::f16::from_f32(x)).collect()),
        }
    };
    let h = [half(&inputs[0]), inputs[1].clone(), half(&inputs[2])];
    runs_on("ThreeInterpolate", &[], AUTO, &refs(&h), Ran::Host("float16".into()));
    // No BANG kernel: a provider of our kernels alone declines the node at placement.
    let why = node("ThreeInterpolate", &[], &[Backend::Bang])
        .static_choice(&device().info, None)
        .expect_err("declined")
        .to_string();
    assert!(
        why.contains("ThreeInterpolate runs on the card only on mluops, which this provider's mlu_backend leaves out"),
        "{why}"
    );
    // An index outside [0, M): the contract's error, from the check before the library.
    let mut bad = idx;
    bad[100] = m as i32;
    let bad_inputs = [inputs[0].clone(), i32s(&[b, n, 3], bad), inputs[2].clone()];
    let err =
        run_node_on_device(&device(), &node("ThreeInterpolate", &[], MLUOPS), &refs(&bad_inputs))
            .expect_err("index M");
    let want = cpu("ThreeInterpolate", &[], &refs(&bad_inputs)).expect_err("CPU rejects");
    assert_eq!(err.to_string(), want.to_string(), "the same contract error on both paths");
}
