//! Writes the model fixtures of models/: `cargo run --example build_models`; with `--check`
//! it instead verifies that the committed files are exactly what this builder produces.
//! mluops_demo.onnx holds all five operators among standard ONNX nodes; its inputs and
//! golden outputs (models/mluops_demo.npz) come from models/make_demo_data.py, computed
//! with the independent numpy references of tests/python/reference.py. The model zoo
//! (models/zoo.rs: pointpillars, centerpoint, bevdepth, pointnet2_fp, rfcn_head) is written
//! and checked alongside; its data comes from models/make_zoo_goldens.py.

#[path = "onnx_builder.rs"]
mod onnx_builder;
#[path = "../tests/common/rng.rs"]
mod rng;
#[path = "zoo.rs"]
mod zoo;

use onnx_builder::{Dim::*, Elem, Graph, attr_float, attr_int, attr_ints, attr_string};

/// The demo graph. Shapes are fixed except the data-dependent ones.
pub fn demo() -> Graph {
    let mut g = Graph::new("mluops_demo");
    // BEVDepth voxel pooling: features through a ReLU, pooled to a 32x32 BEV grid, NCHW.
    g.input("vp_geom_xyz", Elem::INT32, Some(&[Fixed(2), Fixed(4096), Fixed(3)]))
        .input("vp_features", Elem::FLOAT, Some(&[Fixed(2), Fixed(4096), Fixed(32)]))
        .node("relu_features", "Relu", "", &["vp_features"], &["vp_features_relu"], vec![])
        .node(
            "voxel_pooling",
            "VoxelPoolingForward",
            "mluops",
            &["vp_geom_xyz", "vp_features_relu"],
            &["bev_nhwc", "pos_memo"],
            vec![attr_ints("voxel_num", &[32, 32, 4])],
        )
        .node(
            "bev_to_nchw",
            "Transpose",
            "",
            &["bev_nhwc"],
            &["bev_nchw"],
            vec![attr_ints("perm", &[0, 3, 1, 2])],
        )
        .output("bev_nchw", Elem::FLOAT, Some(&[Fixed(2), Fixed(32), Fixed(32), Fixed(32)]))
        .output("pos_memo", Elem::INT32, Some(&[Fixed(2), Fixed(4096), Fixed(3)]));
    // CenterPoint sparse backbone rulebooks: submanifold and strided on the same sites.
    let conv = |subm: i64, stride: i64| {
        vec![
            attr_int("batch_size", 2),
            attr_ints("spatial_shape", &[8, 32, 32]),
            attr_ints("kernel_size", &[3, 3, 3]),
            attr_ints("stride", &[stride; 3]),
            attr_ints("padding", &[1, 1, 1]),
            attr_int("subm", subm),
        ]
    };
    g.input("sp_indices", Elem::INT32, Some(&[Sym("L"), Fixed(4)]))
        .node(
            "subm_rules",
            "GetIndicePairs",
            "mluops",
            &["sp_indices"],
            &["subm_pairs", "subm_out", "subm_num"],
            conv(1, 1),
        )
        .node(
            "down_rules",
            "GetIndicePairs",
            "mluops",
            &["sp_indices"],
            &["down_pairs", "down_out", "down_num"],
            conv(0, 2),
        );
    for (name, shape) in [
        ("subm_pairs", vec![Fixed(27), Fixed(2), Sym("L")]),
        ("subm_out", vec![Sym("L"), Fixed(4)]),
        ("subm_num", vec![Fixed(27)]),
        ("down_pairs", vec![Fixed(27), Fixed(2), Sym("L")]),
        ("down_out", vec![Sym("L_out"), Fixed(4)]),
        ("down_num", vec![Fixed(27)]),
    ] {
        g.output(name, Elem::INT32, Some(&shape));
    }
    // PointNet++ feature propagation gradient.
    g.input("ti_grad_output", Elem::FLOAT, Some(&[Fixed(2), Fixed(16), Fixed(256)]))
        .input("ti_indices", Elem::INT32, Some(&[Fixed(2), Fixed(256), Fixed(3)]))
        .input("ti_weights", Elem::FLOAT, Some(&[Fixed(2), Fixed(256), Fixed(3)]))
        .node(
            "fp_backward",
            "ThreeInterpolateBackward",
            "mluops",
            &["ti_grad_output", "ti_indices", "ti_weights"],
            &["ti_grad_features"],
            vec![attr_int("m", 64)],
        )
        .output("ti_grad_features", Elem::FLOAT, Some(&[Fixed(2), Fixed(16), Fixed(64)]));
    // PointPillars dynamic voxelisation gradient (max reduction).
    g.input("ds_grad_voxel_feats", Elem::FLOAT, Some(&[Sym("M"), Fixed(16)]))
        .input("ds_feats", Elem::FLOAT, Some(&[Sym("N"), Fixed(16)]))
        .input("ds_voxel_feats", Elem::FLOAT, Some(&[Sym("M"), Fixed(16)]))
        .input("ds_point2voxel_map", Elem::INT32, Some(&[Sym("N")]))
        .input("ds_voxel_points_count", Elem::INT32, Some(&[Sym("M")]))
        .node(
            "scatter_backward",
            "DynamicScatterBackward",
            "mluops",
            &[
                "ds_grad_voxel_feats",
                "ds_feats",
                "ds_voxel_feats",
                "ds_point2voxel_map",
                "ds_voxel_points_count",
            ],
            &["ds_grad_feats"],
            vec![attr_string("reduce_type", "max")],
        )
        .output("ds_grad_feats", Elem::FLOAT, Some(&[Sym("N"), Fixed(16)]));
    // R-FCN position-sensitive RoI pooling gradient; the bottom shape is a constant.
    g.input("ps_top_grad", Elem::FLOAT, Some(&[Sym("R"), Fixed(3), Fixed(3), Fixed(4)]))
        .input("ps_rois", Elem::FLOAT, Some(&[Sym("R"), Fixed(5)]))
        .input("ps_mapping_channel", Elem::INT32, Some(&[Sym("R"), Fixed(3), Fixed(3), Fixed(4)]))
        .initializer_i64("ps_bottom_shape", &[4], &[2, 16, 16, 36])
        .node(
            "psroi_backward",
            "PsRoiPoolBackward",
            "mluops",
            &["ps_top_grad", "ps_rois", "ps_mapping_channel", "ps_bottom_shape"],
            &["ps_bottom_grad"],
            vec![
                attr_int("pooled_height", 3),
                attr_int("pooled_width", 3),
                attr_float("spatial_scale", 0.25),
                attr_int("output_dim", 4),
            ],
        )
        .output("ps_bottom_grad", Elem::FLOAT, Some(&[Fixed(2), Fixed(16), Fixed(16), Fixed(36)]));
    g
}

fn main() -> std::io::Result<()> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let check = std::env::args().any(|a| a == "--check");
    // The demo, then the model zoo (models/zoo.rs).
    let mut files = vec![("mluops_demo", demo())];
    files.extend(zoo::all());
    let mut stale = 0;
    for (stem, graph) in files {
        let path = dir.join(format!("{stem}.onnx"));
        let bytes = graph.bytes();
        if check {
            if std::fs::read(&path).ok().as_deref() != Some(&bytes[..]) {
                eprintln!(
                    "{} differs from what models/build_models.rs builds: rerun it",
                    path.display()
                );
                stale += 1;
            } else {
                println!("{} is up to date", path.display());
            }
        } else {
            std::fs::write(&path, bytes)?;
            println!("wrote {}", path.display());
        }
    }
    if stale > 0 {
        std::process::exit(1);
    }
    Ok(())
}
