//! DynamicScatter: reduce type (or its default), shapes (D = 0 is an error) and coordinates
//! (negative ones drop points, repeats share voxels) and values from the fuzzer's bytes; the
//! CPU kernel at 1 and 2 threads, exactly against the suite's reference (tests/reference/),
//! and the BANG kernels on the emulated card where claimed (`bang`, `auto`), bit for bit
//! against the CPU kernel (the harness, `Class::Exact`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu_fuzz::{Bytes, Class, attrs, check, common, outcome};

#[path = "../../tests/reference/dynamic_scatter.rs"]
#[allow(dead_code)]
mod reference;
use reference::{Case, reference};

fuzz_target!(|data: &[u8]| {
    let mut u = Bytes::new(data);
    let reduce = [None, Some("max"), Some("sum"), Some("mean")][u.below(4)];
    let (n, c, d) = (u.below(12), u.below(4), u.below(5));
    let coors = (0..n * d).map(|_| u.below(4) as i32 - 1).collect();
    let case = Case { n, c, d, feats: u.floats(n * c), coors };
    let (f, k) = case.tensors();
    let attrs = attrs(
        &reduce
            .map(|r| ("reduce_type", AttrValue::String(r.into())))
            .into_iter()
            .collect::<Vec<_>>(),
    );
    if let Some(out) =
        outcome(check("DynamicScatter", &attrs, &[Some(f), Some(k)], Class::Exact), d > 0)
    {
        let r = reference(&case);
        let ints = |i: usize| out[i].data.i32().expect("int32 output").to_vec();
        assert_eq!(ints(1), r.voxel_coors, "voxel_coors against the reference");
        assert_eq!(ints(2), r.map, "point2voxel_map against the reference");
        assert_eq!(ints(3), r.count, "voxel_points_count against the reference");
        assert_eq!(ints(4), vec![r.m as i32], "voxel_num against the reference");
        let want = match reduce.unwrap_or("max") {
            "max" => r.max,
            "sum" => r.sum32,
            _ => r.mean32,
        };
        let got = out[0].data.f32().expect("float32 voxel_feats");
        assert_eq!(common::canon(got), common::canon(&want), "voxel_feats against the reference");
    }
});
