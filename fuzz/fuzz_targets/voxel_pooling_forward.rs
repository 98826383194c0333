//! VoxelPoolingForward: voxel_num (some not positive), shapes, point coordinates (some
//! outside the grid on each axis) and features from the fuzzer's bytes; every path against
//! the CPU kernel, the CPU kernel against the suite's reference (tests/reference/).
#![no_main]

use libfuzzer_sys::fuzz_target;
use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu_fuzz::{Bytes, Class, attrs, check, common, judge, outcome};

#[path = "../../tests/reference/voxel_pooling_forward.rs"]
#[allow(dead_code)]
mod reference;
use reference::{Case, reference};

fuzz_target!(|data: &[u8]| {
    let mut u = Bytes::new(data);
    let voxel_num = [u.below(6) as i64, u.below(6) as i64, u.below(4) as i64];
    let (b, n, c) = (u.below(3), u.below(10), u.below(5));
    let geom = (0..b * n * 3).map(|i| u.below(voxel_num[i % 3] as usize + 3) as i32 - 1).collect();
    let case = Case { b, n, c, geom, feats: u.floats(b * n * c) };
    let (g, f) = case.tensors();
    // output_features adds the features of the points in each voxel: the kernel on |features|
    // (geom as it is) adds the terms' magnitudes.
    let abs = Case {
        b,
        n,
        c,
        geom: case.geom.clone(),
        feats: case.feats.iter().map(|x| x.abs()).collect(),
    };
    let (abs_g, abs_f) = abs.tensors();
    let magnitudes = [Some(abs_g), Some(abs_f)];
    let valid = voxel_num.iter().all(|&v| v > 0);
    let attrs = attrs(&[("voxel_num", AttrValue::Ints(voxel_num.to_vec()))]);
    if let Some(out) = outcome(
        check("VoxelPoolingForward", &attrs, &[Some(g), Some(f)], Class::Accumulating(&magnitudes)),
        valid,
    ) {
        let (want, want_memo) = reference(&case, voxel_num);
        assert_eq!(
            out[1].data.i32().expect("int32 pos_memo"),
            want_memo,
            "pos_memo against the reference"
        );
        judge(
            out[0].data.f32().expect("float32 features"),
            &want,
            common::ELEM_REL,
            "output_features against the reference",
        );
    }
});
