//! The model zoo: five small but structurally faithful graphs of the networks the `mluops`
//! operators come from, with seeded weights, written by `cargo run --example build_models`
//! next to the demo. They are the model-level regression fixtures: models/make_zoo_goldens.py
//! reads the weights back from the .onnx files, draws seeded inputs and computes golden
//! outputs with an independent numpy implementation of each whole model; models/run_zoo.py
//! runs them on the CPU path and under the MLUExecutionProvider.
//!
//! - `pointpillars`: dynamic voxelisation with standard ops, a PFN layer, DynamicScatter
//!   (max), pillar scatter to a BEV canvas, a 2D backbone and head, and the PFN features'
//!   gradient through DynamicScatterBackward (max).
//! - `centerpoint`: a sparse 3D backbone (GetIndicePairs + IndiceConv, submanifold and
//!   strided), densified to BEV with ScatterND, and a 2D head.
//! - `bevdepth`: depth/context net, depth x context outer product, VoxelPoolingForward, BEV
//!   convolutions.
//! - `pointnet2_fp`: PointNet++ feature propagation (three nearest neighbours with standard
//!   ops, ThreeInterpolate, skip concat, shared MLP) and the gradient of 0.5 * |output|^2
//!   back to the source features through ThreeInterpolateBackward.
//! - `rfcn_head`: R-FCN head (NHWC): position-sensitive score maps, PsRoiPool for classes and
//!   boxes, bin averaging, and the softmax cross-entropy gradient back to the score maps
//!   through PsRoiPoolBackward and on to the hidden features.
//!
//! Every weight is a float initializer drawn from [`Rng`] with a fixed seed per model, so the
//! files are reproducible byte for byte (`build_models --check`). The structural constants
//! (shapes, voxel sizes, ranges, strides) are repeated on purpose in make_zoo_goldens.py, whose
//! numpy model is written from the same description, not from this graph.

use crate::onnx_builder::{Dim::*, Elem, Graph, attr_float, attr_int, attr_ints, attr_string};
use crate::rng::Rng;

/// The zoo's conveniences on the shared SplitMix64 generator (tests/common/rng.rs), the
/// fixed-seed source of every weight.
impl Rng {
    /// Uniform in [-1, 1), a multiple of 2^-23 (exact in float32).
    pub fn symmetric(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u32 << 23) as f32 - 1.0
    }

    /// An integer uniform in [-k, k].
    pub fn int_sym(&mut self, k: i64) -> i64 {
        (self.next() % (2 * k + 1) as u64) as i64 - k
    }
}

/// Kaiming-uniform weights, U(-sqrt(6 / fan_in), sqrt(6 / fan_in)).
fn kaiming(rng: &mut Rng, n: usize, fan_in: usize) -> Vec<f32> {
    let bound = (6.0f32 / fan_in as f32).sqrt();
    (0..n).map(|_| rng.symmetric() * bound).collect()
}

/// Biases, U(-bound, bound).
fn uniform(rng: &mut Rng, n: usize, bound: f32) -> Vec<f32> {
    (0..n).map(|_| rng.symmetric() * bound).collect()
}

/// Dyadic values k / 2^shift with k uniform in [-k_max, k_max]: products and short sums of
/// such values with dyadic inputs are exact in float32, whatever the order or FMA.
fn dyadic(rng: &mut Rng, n: usize, k_max: i64, shift: u32) -> Vec<f32> {
    (0..n).map(|_| rng.int_sym(k_max) as f32 / (1u32 << shift) as f32).collect()
}

/// `{name}_w` [cout, cin, k...] and, with `bias`, `{name}_b` [cout] (PyTorch's default bias range).
fn conv_params(
    g: &mut Graph,
    rng: &mut Rng,
    name: &str,
    cout: i64,
    cin: i64,
    kernel: &[i64],
    bias: bool,
) {
    let mut dims = vec![cout, cin];
    dims.extend_from_slice(kernel);
    let fan_in = (cin * kernel.iter().product::<i64>()) as usize;
    g.initializer_f32(&format!("{name}_w"), &dims, &kaiming(rng, (cout as usize) * fan_in, fan_in));
    if bias {
        g.initializer_f32(
            &format!("{name}_b"),
            &[cout],
            &uniform(rng, cout as usize, 1.0 / (fan_in as f32).sqrt()),
        );
    }
}

/// A 2D convolution node (square kernel, symmetric padding), optionally followed by a ReLU.
#[allow(clippy::too_many_arguments)]
fn conv2d(
    g: &mut Graph,
    name: &str,
    x: &str,
    out: &str,
    k: i64,
    stride: i64,
    pad: i64,
    relu: bool,
) {
    let (w, b) = (format!("{name}_w"), format!("{name}_b"));
    let conv_out = if relu { format!("{name}_pre") } else { out.to_string() };
    g.node(
        name,
        "Conv",
        "",
        &[x, &w, &b],
        &[&conv_out],
        vec![
            attr_ints("kernel_shape", &[k, k]),
            attr_ints("strides", &[stride, stride]),
            attr_ints("pads", &[pad; 4]),
        ],
    );
    if relu {
        g.node(&format!("{name}_relu"), "Relu", "", &[&conv_out], &[out], vec![]);
    }
}

/// Every model of the zoo, by file stem.
pub fn all() -> Vec<(&'static str, Graph)> {
    vec![
        ("pointpillars", pointpillars()),
        ("centerpoint", centerpoint()),
        ("bevdepth", bevdepth()),
        ("pointnet2_fp", pointnet2_fp()),
        ("rfcn_head", rfcn_head()),
    ]
}

/// PointPillars with dynamic voxelisation (mmdet3d DynamicPillarFeatureNet + PointPillarsScatter
/// + a small SECOND-style backbone and anchor head), plus the PFN features' gradient.
///
/// Points (x, y, z, intensity) in [N, 4]; point cloud range x [0, 32), y [-16, 16), z [-3, 1),
/// pillars 0.5 x 0.5 x 4 m: a 64 x 64 x 1 grid. The PFN weights are dyadic (k/32, bias k/64):
/// with points on a 1/64 m grid every PFN value, hence voxel_feats and the gradient, is exact
/// in float32, so those outputs are compared bit for bit.
pub fn pointpillars() -> Graph {
    const C: i64 = 32; // PFN channels
    const H: i64 = 64; // BEV rows (y)
    const W: i64 = 64; // BEV columns (x)
    let mut rng = Rng(0x5EED_0001);
    let mut g = Graph::new("pointpillars");
    g.input("points", Elem::FLOAT, Some(&[Sym("N"), Fixed(4)]));

    // --- dynamic voxelisation: coors (z, y, x), -1 for a point outside the range.
    g.initializer_f32("pc_min", &[3], &[0.0, -16.0, -3.0])
        .initializer_f32("voxel_size", &[3], &[0.5, 0.5, 4.0])
        .initializer_f32("grid_size", &[3], &[W as f32, H as f32, 1.0])
        .initializer_f32("zero_f", &[], &[0.0])
        .initializer_f32("half_f", &[], &[0.5])
        .initializer_i32("minus_one", &[], &[-1])
        .initializer_i64("xyz_start", &[1], &[0])
        .initializer_i64("xyz_end", &[1], &[3])
        .initializer_i64("axis1", &[1], &[1])
        .initializer_i64("xyz_to_zyx", &[3], &[2, 1, 0]);
    g.node("xyz", "Slice", "", &["points", "xyz_start", "xyz_end", "axis1"], &["xyz"], vec![])
        .node("rel", "Sub", "", &["xyz", "pc_min"], &["rel"], vec![])
        .node("rel_vox", "Div", "", &["rel", "voxel_size"], &["rel_vox"], vec![])
        .node("coor_f", "Floor", "", &["rel_vox"], &["coor_f"], vec![])
        .node("below", "Less", "", &["coor_f", "zero_f"], &["below"], vec![])
        .node("inside_hi", "Less", "", &["coor_f", "grid_size"], &["inside_hi"], vec![])
        .node("above", "Not", "", &["inside_hi"], &["above"], vec![])
        .node("outside3", "Or", "", &["below", "above"], &["outside3"], vec![])
        .node(
            "outside_split",
            "Split",
            "",
            &["outside3"],
            &["out_x", "out_y", "out_z"],
            vec![attr_int("axis", 1)],
        )
        .node("outside_xy", "Or", "", &["out_x", "out_y"], &["outside_xy"], vec![])
        .node("outside", "Or", "", &["outside_xy", "out_z"], &["outside"], vec![])
        .node(
            "coor_xyz",
            "Cast",
            "",
            &["coor_f"],
            &["coor_xyz"],
            vec![attr_int("to", Elem::INT32 as i64)],
        )
        .node(
            "coor_zyx",
            "Gather",
            "",
            &["coor_xyz", "xyz_to_zyx"],
            &["coor_zyx"],
            vec![attr_int("axis", 1)],
        )
        .node("coors", "Where", "", &["outside", "minus_one", "coor_zyx"], &["coors"], vec![]);

    // --- PFN: (x, y, z, r, offsets from the pillar centre) -> Linear (BN folded) -> ReLU.
    g.node("centre_idx", "Add", "", &["coor_f", "half_f"], &["centre_idx"], vec![])
        .node("centre_rel", "Mul", "", &["centre_idx", "voxel_size"], &["centre_rel"], vec![])
        .node("centre", "Add", "", &["centre_rel", "pc_min"], &["centre"], vec![])
        .node("centre_offset", "Sub", "", &["xyz", "centre"], &["centre_offset"], vec![])
        .node(
            "pfn_input",
            "Concat",
            "",
            &["points", "centre_offset"],
            &["pfn_input"],
            vec![attr_int("axis", 1)],
        );
    g.initializer_f32("pfn_w", &[7, C], &dyadic(&mut rng, (7 * C) as usize, 24, 5))
        .initializer_f32("pfn_b", &[C], &dyadic(&mut rng, C as usize, 16, 6));
    g.node("pfn_matmul", "MatMul", "", &["pfn_input", "pfn_w"], &["pfn_mm"], vec![])
        .node("pfn_bias", "Add", "", &["pfn_mm", "pfn_b"], &["pfn_lin"], vec![])
        .node("pfn_relu", "Relu", "", &["pfn_lin"], &["point_feats"], vec![]);

    // --- pillar max pooling.
    g.node(
        "dynamic_scatter",
        "DynamicScatter",
        "mluops",
        &["point_feats", "coors"],
        &["voxel_feats", "voxel_coors", "point2voxel_map", "voxel_points_count", "voxel_num"],
        vec![attr_string("reduce_type", "max")],
    );

    // --- PointPillarsScatter: canvas [H, W, C] at (y, x), then NCHW.
    g.initializer_i64("yx_start", &[1], &[1])
        .initializer_i64("yx_end", &[1], &[3])
        .initializer_i64("canvas_shape", &[3], &[H, W, C])
        .initializer_i64("axis0", &[1], &[0]);
    g.node(
        "pillar_yx",
        "Slice",
        "",
        &["voxel_coors", "yx_start", "yx_end", "axis1"],
        &["pillar_yx"],
        vec![],
    )
    .node(
        "pillar_yx64",
        "Cast",
        "",
        &["pillar_yx"],
        &["pillar_yx64"],
        vec![attr_int("to", Elem::INT64 as i64)],
    )
    .node("canvas_zero", "ConstantOfShape", "", &["canvas_shape"], &["canvas_zero"], vec![])
    .node(
        "pillar_scatter",
        "ScatterND",
        "",
        &["canvas_zero", "pillar_yx64", "voxel_feats"],
        &["canvas_hwc"],
        vec![],
    )
    .node(
        "canvas_chw",
        "Transpose",
        "",
        &["canvas_hwc"],
        &["canvas_chw"],
        vec![attr_ints("perm", &[2, 0, 1])],
    )
    .node("bev", "Unsqueeze", "", &["canvas_chw", "axis0"], &["bev"], vec![]);

    // --- backbone and anchor head (2 anchors, 3 classes, 7 box parameters).
    conv_params(&mut g, &mut rng, "block1", 48, C, &[3, 3], true);
    conv_params(&mut g, &mut rng, "block2", 48, 48, &[3, 3], true);
    conv_params(&mut g, &mut rng, "cls_head", 6, 48, &[1, 1], true);
    conv_params(&mut g, &mut rng, "box_head", 14, 48, &[1, 1], true);
    conv2d(&mut g, "block1", "bev", "block1_out", 3, 2, 1, true);
    conv2d(&mut g, "block2", "block1_out", "block2_out", 3, 1, 1, true);
    conv2d(&mut g, "cls_head", "block2_out", "cls_score", 1, 1, 0, false);
    conv2d(&mut g, "box_head", "block2_out", "bbox_pred", 1, 1, 0, false);

    // --- training gradient: dL/dvoxel_feats = voxel_feats * g_scale + g_shift (dyadic, so
    //     exact), back to the point features through the max reduction.
    let scale: Vec<f32> = (0..C)
        .map(|_| {
            let k = 1 + (rng.next() % 7) as i64;
            (if rng.next().is_multiple_of(2) { k } else { -k }) as f32 / 4.0
        })
        .collect();
    g.initializer_f32("grad_scale", &[C], &scale).initializer_f32(
        "grad_shift",
        &[C],
        &dyadic(&mut rng, C as usize, 8, 3),
    );
    g.node("grad_scaled", "Mul", "", &["voxel_feats", "grad_scale"], &["grad_scaled"], vec![])
        .node(
            "grad_voxel",
            "Add",
            "",
            &["grad_scaled", "grad_shift"],
            &["grad_voxel_feats"],
            vec![],
        )
        .node(
            "dynamic_scatter_backward",
            "DynamicScatterBackward",
            "mluops",
            &[
                "grad_voxel_feats",
                "point_feats",
                "voxel_feats",
                "point2voxel_map",
                "voxel_points_count",
                "voxel_num",
            ],
            &["grad_point_feats"],
            vec![attr_string("reduce_type", "max")],
        );

    g.output("coors", Elem::INT32, Some(&[Sym("N"), Fixed(3)]))
        .output("voxel_feats", Elem::FLOAT, Some(&[Sym("M"), Fixed(C)]))
        .output("voxel_coors", Elem::INT32, Some(&[Sym("M"), Fixed(3)]))
        .output("point2voxel_map", Elem::INT32, Some(&[Sym("N")]))
        .output("voxel_points_count", Elem::INT32, Some(&[Sym("M")]))
        .output("voxel_num", Elem::INT32, Some(&[Fixed(1)]))
        .output("cls_score", Elem::FLOAT, Some(&[Fixed(1), Fixed(6), Fixed(H / 2), Fixed(W / 2)]))
        .output("bbox_pred", Elem::FLOAT, Some(&[Fixed(1), Fixed(14), Fixed(H / 2), Fixed(W / 2)]))
        .output("grad_point_feats", Elem::FLOAT, Some(&[Sym("N"), Fixed(C)]));
    g
}

/// CenterPoint / SECOND sparse 3D backbone (mmdet3d SparseEncoder, reduced): two submanifold
/// convolutions sharing one rulebook, a strided sparse convolution, a submanifold convolution
/// at the lower resolution, densified to BEV [B, C*D, H, W], then a CenterHead-like 2D head.
///
/// Input: voxel features [L, 5] and voxel coordinates [L, 4] (batch, z, y, x), batch 2,
/// spatial shape 8 x 64 x 64; the strided level is 4 x 32 x 32 with 32 channels (BEV 128).
pub fn centerpoint() -> Graph {
    const B: i64 = 2;
    let mut rng = Rng(0x5EED_0002);
    let mut g = Graph::new("centerpoint");
    g.input("voxel_features", Elem::FLOAT, Some(&[Sym("L"), Fixed(5)])).input(
        "voxel_coords",
        Elem::INT32,
        Some(&[Sym("L"), Fixed(4)]),
    );
    let rules = |spatial: [i64; 3], subm: i64, stride: i64| {
        vec![
            attr_int("batch_size", B),
            attr_ints("spatial_shape", &spatial),
            attr_ints("kernel_size", &[3, 3, 3]),
            attr_ints("stride", &[stride; 3]),
            attr_ints("padding", &[1, 1, 1]),
            attr_int("subm", subm),
        ]
    };
    // Sparse weights [K, Cin, Cout] (mmcv's [kd, kh, kw, Cin, Cout] flattened).
    let mut sparse_params = |g: &mut Graph, name: &str, cin: i64, cout: i64, bias: bool| {
        let fan_in = (27 * cin) as usize;
        g.initializer_f32(
            &format!("{name}_w"),
            &[27, cin, cout],
            &kaiming(&mut rng, fan_in * cout as usize, fan_in),
        );
        if bias {
            g.initializer_f32(
                &format!("{name}_b"),
                &[cout],
                &uniform(&mut rng, cout as usize, 0.1),
            );
        }
    };
    sparse_params(&mut g, "conv_input", 5, 16, true);
    sparse_params(&mut g, "subm1", 16, 16, false);
    sparse_params(&mut g, "down1", 16, 32, true);
    sparse_params(&mut g, "subm2", 32, 32, true);

    g.node(
        "subm1_rules",
        "GetIndicePairs",
        "mluops",
        &["voxel_coords"],
        &["subm1_pairs", "subm1_out", "subm1_num"],
        rules([8, 64, 64], 1, 1),
    )
    .node(
        "conv_input",
        "IndiceConv",
        "mluops",
        &[
            "voxel_features",
            "conv_input_w",
            "subm1_pairs",
            "subm1_num",
            "subm1_out",
            "conv_input_b",
        ],
        &["conv_input_pre"],
        vec![],
    )
    .node("conv_input_relu", "Relu", "", &["conv_input_pre"], &["x0"], vec![])
    // The second submanifold convolution reuses the rulebook (spconv's indice_key), no bias.
    .node(
        "subm1",
        "IndiceConv",
        "mluops",
        &["x0", "subm1_w", "subm1_pairs", "subm1_num", "subm1_out", ""],
        &["subm1_pre"],
        vec![],
    )
    .node("subm1_relu", "Relu", "", &["subm1_pre"], &["x1"], vec![])
    .node(
        "down1_rules",
        "GetIndicePairs",
        "mluops",
        &["voxel_coords"],
        &["down1_pairs", "down1_out", "down1_num"],
        rules([8, 64, 64], 0, 2),
    )
    .node(
        "down1",
        "IndiceConv",
        "mluops",
        &["x1", "down1_w", "down1_pairs", "down1_num", "down1_out", "down1_b"],
        &["down1_pre"],
        vec![],
    )
    .node("down1_relu", "Relu", "", &["down1_pre"], &["x2"], vec![])
    .node(
        "subm2_rules",
        "GetIndicePairs",
        "mluops",
        &["down1_out"],
        &["subm2_pairs", "subm2_out", "subm2_num"],
        rules([4, 32, 32], 1, 1),
    )
    .node(
        "subm2",
        "IndiceConv",
        "mluops",
        &["x2", "subm2_w", "subm2_pairs", "subm2_num", "subm2_out", "subm2_b"],
        &["subm2_pre"],
        vec![],
    )
    .node("subm2_relu", "Relu", "", &["subm2_pre"], &["sparse_feats"], vec![]);

    // Densify: [B, D, H, W, C] at (b, z, y, x), then [B, C, D, H, W] viewed as [B, C*D, H, W].
    g.initializer_i64("dense_shape", &[5], &[B, 4, 32, 32, 32]).initializer_i64(
        "bev_shape",
        &[4],
        &[B, 128, 32, 32],
    );
    g.node(
        "sites64",
        "Cast",
        "",
        &["subm2_out"],
        &["sites64"],
        vec![attr_int("to", Elem::INT64 as i64)],
    )
    .node("dense_zero", "ConstantOfShape", "", &["dense_shape"], &["dense_zero"], vec![])
    .node(
        "densify",
        "ScatterND",
        "",
        &["dense_zero", "sites64", "sparse_feats"],
        &["dense_dhwc"],
        vec![],
    )
    .node(
        "dense_cdhw",
        "Transpose",
        "",
        &["dense_dhwc"],
        &["dense_cdhw"],
        vec![attr_ints("perm", &[0, 4, 1, 2, 3])],
    )
    .node("bev", "Reshape", "", &["dense_cdhw", "bev_shape"], &["bev"], vec![]);

    // Head: shared 3x3 conv, heatmap (3 classes, sigmoid) and regression (8) branches.
    conv_params(&mut g, &mut rng, "shared_conv", 32, 128, &[3, 3], true);
    conv_params(&mut g, &mut rng, "heatmap_head", 3, 32, &[1, 1], true);
    conv_params(&mut g, &mut rng, "reg_head", 8, 32, &[1, 1], true);
    conv2d(&mut g, "shared_conv", "bev", "shared", 3, 1, 1, true);
    conv2d(&mut g, "heatmap_head", "shared", "heatmap_logits", 1, 1, 0, false);
    conv2d(&mut g, "reg_head", "shared", "reg", 1, 1, 0, false);
    g.node("heatmap", "Sigmoid", "", &["heatmap_logits"], &["heatmap"], vec![]);

    g.output("subm1_pairs", Elem::INT32, Some(&[Fixed(27), Fixed(2), Sym("L")]))
        .output("subm1_num", Elem::INT32, Some(&[Fixed(27)]))
        .output("down1_pairs", Elem::INT32, Some(&[Fixed(27), Fixed(2), Sym("L")]))
        .output("down1_out", Elem::INT32, Some(&[Sym("L1"), Fixed(4)]))
        .output("down1_num", Elem::INT32, Some(&[Fixed(27)]))
        .output("subm2_pairs", Elem::INT32, Some(&[Fixed(27), Fixed(2), Sym("L1")]))
        .output("subm2_num", Elem::INT32, Some(&[Fixed(27)]))
        .output("sparse_feats", Elem::FLOAT, Some(&[Sym("L1"), Fixed(32)]))
        .output("heatmap", Elem::FLOAT, Some(&[Fixed(B), Fixed(3), Fixed(32), Fixed(32)]))
        .output("reg", Elem::FLOAT, Some(&[Fixed(B), Fixed(8), Fixed(32), Fixed(32)]));
    g
}

/// BEVDepth (reduced): image features of B = 2 samples x 2 cameras [4, 32, 8, 22] -> depth net
/// (3x3 conv + ReLU, 1x1 conv to 16 depth bins + 24 context channels) -> softmax over depth ->
/// depth x context outer product -> frustum points [B, 2*16*8*22, 24] -> VoxelPoolingForward
/// on a 32 x 32 x 1 grid (geom_xyz is a graph input) -> NCHW -> BEV conv + ReLU -> head conv.
pub fn bevdepth() -> Graph {
    const B: i64 = 2;
    const NCAM: i64 = 2;
    const C: i64 = 32;
    const FH: i64 = 8;
    const FW: i64 = 22;
    const D: i64 = 16;
    const CC: i64 = 24;
    const NPTS: i64 = NCAM * D * FH * FW;
    let mut rng = Rng(0x5EED_0003);
    let mut g = Graph::new("bevdepth");
    g.input("img_feats", Elem::FLOAT, Some(&[Fixed(B * NCAM), Fixed(C), Fixed(FH), Fixed(FW)]))
        .input("geom_xyz", Elem::INT32, Some(&[Fixed(B), Fixed(NPTS), Fixed(3)]));
    conv_params(&mut g, &mut rng, "depth_reduce", C, C, &[3, 3], true);
    conv_params(&mut g, &mut rng, "depth_out", D + CC, C, &[1, 1], true);
    conv2d(&mut g, "depth_reduce", "img_feats", "depth_reduce_out", 3, 1, 1, true);
    conv2d(&mut g, "depth_out", "depth_reduce_out", "depth_net_out", 1, 1, 0, false);
    g.initializer_i64("depth_start", &[1], &[0])
        .initializer_i64("depth_end", &[1], &[D])
        .initializer_i64("context_end", &[1], &[D + CC])
        .initializer_i64("axis1", &[1], &[1])
        .initializer_i64("axis2", &[1], &[2])
        .initializer_i64("frustum6_shape", &[6], &[B, NCAM, CC, D, FH, FW])
        .initializer_i64("points_shape", &[3], &[B, NPTS, CC]);
    g.node(
        "depth_logits",
        "Slice",
        "",
        &["depth_net_out", "depth_start", "depth_end", "axis1"],
        &["depth_logits"],
        vec![],
    )
    .node("depth", "Softmax", "", &["depth_logits"], &["depth"], vec![attr_int("axis", 1)])
    .node(
        "context",
        "Slice",
        "",
        &["depth_net_out", "depth_end", "context_end", "axis1"],
        &["context"],
        vec![],
    )
    .node("depth_u", "Unsqueeze", "", &["depth", "axis1"], &["depth_u"], vec![])
    .node("context_u", "Unsqueeze", "", &["context", "axis2"], &["context_u"], vec![])
    .node("frustum", "Mul", "", &["depth_u", "context_u"], &["frustum"], vec![])
    .node("frustum6", "Reshape", "", &["frustum", "frustum6_shape"], &["frustum6"], vec![])
    .node(
        "frustum_last_c",
        "Transpose",
        "",
        &["frustum6"],
        &["frustum_last_c"],
        vec![attr_ints("perm", &[0, 1, 3, 4, 5, 2])],
    )
    .node(
        "point_feats",
        "Reshape",
        "",
        &["frustum_last_c", "points_shape"],
        &["point_feats"],
        vec![],
    )
    .node(
        "voxel_pooling",
        "VoxelPoolingForward",
        "mluops",
        &["geom_xyz", "point_feats"],
        &["bev_nhwc", "pos_memo"],
        vec![attr_ints("voxel_num", &[32, 32, 1])],
    )
    .node(
        "bev_feat",
        "Transpose",
        "",
        &["bev_nhwc"],
        &["bev_feat"],
        vec![attr_ints("perm", &[0, 3, 1, 2])],
    );
    conv_params(&mut g, &mut rng, "bev_conv", 32, CC, &[3, 3], true);
    conv_params(&mut g, &mut rng, "bev_head", 10, 32, &[1, 1], true);
    conv2d(&mut g, "bev_conv", "bev_feat", "bev_conv_out", 3, 1, 1, true);
    conv2d(&mut g, "bev_head", "bev_conv_out", "head", 1, 1, 0, false);
    g.output("depth", Elem::FLOAT, Some(&[Fixed(B * NCAM), Fixed(D), Fixed(FH), Fixed(FW)]))
        .output("bev_feat", Elem::FLOAT, Some(&[Fixed(B), Fixed(CC), Fixed(32), Fixed(32)]))
        .output("pos_memo", Elem::INT32, Some(&[Fixed(B), Fixed(NPTS), Fixed(3)]))
        .output("head", Elem::FLOAT, Some(&[Fixed(B), Fixed(10), Fixed(32), Fixed(32)]));
    g
}

/// PointNet++ feature propagation (FP module): three nearest known points of every unknown
/// point from squared distances (ReduceSum + TopK), inverse-distance weights
/// 1 / (d + 1e-8) normalised, ThreeInterpolate of the known features, concat with the skip
/// features, shared MLP (two Conv1d 1x1 + ReLU). Gradient subgraph: loss 0.5 * |new_features|^2,
/// back through the MLP (transposed 1x1 convs, ReLU masks) to the interpolated features, then
/// ThreeInterpolateBackward to the known features.
///
/// B 2, n 1024 unknown points, m 256 known points, 64 known channels, 32 skip channels.
pub fn pointnet2_fp() -> Graph {
    const B: i64 = 2;
    const N: i64 = 1024;
    const M: i64 = 256;
    const C2: i64 = 64;
    const C1: i64 = 32;
    let mut rng = Rng(0x5EED_0004);
    let mut g = Graph::new("pointnet2_fp");
    g.input("unknown_xyz", Elem::FLOAT, Some(&[Fixed(B), Fixed(N), Fixed(3)]))
        .input("known_xyz", Elem::FLOAT, Some(&[Fixed(B), Fixed(M), Fixed(3)]))
        .input("known_feats", Elem::FLOAT, Some(&[Fixed(B), Fixed(C2), Fixed(M)]))
        .input("unknown_feats", Elem::FLOAT, Some(&[Fixed(B), Fixed(C1), Fixed(N)]));
    g.initializer_i64("axis1", &[1], &[1])
        .initializer_i64("axis2", &[1], &[2])
        .initializer_i64("axis3", &[1], &[3])
        .initializer_i64("k3", &[1], &[3])
        .initializer_i64("start0", &[1], &[0])
        .initializer_i64("interp_end", &[1], &[C2])
        .initializer_f32("eps", &[], &[1e-8])
        .initializer_f32("zero_f", &[], &[0.0]);
    g.node("unknown_u", "Unsqueeze", "", &["unknown_xyz", "axis2"], &["unknown_u"], vec![])
        .node("known_u", "Unsqueeze", "", &["known_xyz", "axis1"], &["known_u"], vec![])
        .node("diff", "Sub", "", &["unknown_u", "known_u"], &["diff"], vec![])
        .node("diff_sq", "Mul", "", &["diff", "diff"], &["diff_sq"], vec![])
        .node(
            "dist2",
            "ReduceSum",
            "",
            &["diff_sq", "axis3"],
            &["dist2"],
            vec![attr_int("keepdims", 0)],
        )
        .node(
            "three_nn",
            "TopK",
            "",
            &["dist2", "k3"],
            &["nn_dist2", "nn_idx64"],
            vec![attr_int("axis", -1), attr_int("largest", 0), attr_int("sorted", 1)],
        )
        .node(
            "nn_idx",
            "Cast",
            "",
            &["nn_idx64"],
            &["nn_idx"],
            vec![attr_int("to", Elem::INT32 as i64)],
        )
        .node("nn_dist", "Sqrt", "", &["nn_dist2"], &["nn_dist"], vec![])
        .node("nn_dist_eps", "Add", "", &["nn_dist", "eps"], &["nn_dist_eps"], vec![])
        .node("dist_recip", "Reciprocal", "", &["nn_dist_eps"], &["dist_recip"], vec![])
        .node(
            "recip_norm",
            "ReduceSum",
            "",
            &["dist_recip", "axis2"],
            &["recip_norm"],
            vec![attr_int("keepdims", 1)],
        )
        .node("nn_weight", "Div", "", &["dist_recip", "recip_norm"], &["nn_weight"], vec![])
        .node(
            "three_interpolate",
            "ThreeInterpolate",
            "mluops",
            &["known_feats", "nn_idx", "nn_weight"],
            &["interpolated"],
            vec![],
        )
        .node(
            "skip_concat",
            "Concat",
            "",
            &["interpolated", "unknown_feats"],
            &["fp_input"],
            vec![attr_int("axis", 1)],
        );
    conv_params(&mut g, &mut rng, "mlp1", 64, C2 + C1, &[1], true);
    conv_params(&mut g, &mut rng, "mlp2", 64, 64, &[1], true);
    let conv1d = |g: &mut Graph, name: &str, x: &str, w: &str, b: Option<&str>, out: &str| {
        let mut inputs = vec![x, w];
        inputs.extend(b);
        g.node(name, "Conv", "", &inputs, &[out], vec![attr_ints("kernel_shape", &[1])]);
    };
    conv1d(&mut g, "mlp1", "fp_input", "mlp1_w", Some("mlp1_b"), "mlp1_pre");
    g.node("mlp1_relu", "Relu", "", &["mlp1_pre"], &["mlp1_out"], vec![]);
    conv1d(&mut g, "mlp2", "mlp1_out", "mlp2_w", Some("mlp2_b"), "mlp2_pre");
    g.node("mlp2_relu", "Relu", "", &["mlp2_pre"], &["new_features"], vec![]);

    // Gradient of 0.5 * |new_features|^2: dL/dmlp2_pre = new_features (zero where the ReLU is off).
    g.node(
        "mlp2_wt",
        "Transpose",
        "",
        &["mlp2_w"],
        &["mlp2_wt"],
        vec![attr_ints("perm", &[1, 0, 2])],
    )
    .node(
        "mlp1_wt",
        "Transpose",
        "",
        &["mlp1_w"],
        &["mlp1_wt"],
        vec![attr_ints("perm", &[1, 0, 2])],
    );
    conv1d(&mut g, "grad_mlp1_out", "new_features", "mlp2_wt", None, "grad_mlp1_out");
    g.node("mlp1_active", "Greater", "", &["mlp1_out", "zero_f"], &["mlp1_active"], vec![]).node(
        "grad_mlp1_pre",
        "Where",
        "",
        &["mlp1_active", "grad_mlp1_out", "zero_f"],
        &["grad_mlp1_pre"],
        vec![],
    );
    conv1d(&mut g, "grad_fp_input", "grad_mlp1_pre", "mlp1_wt", None, "grad_fp_input");
    g.node(
        "grad_interpolated",
        "Slice",
        "",
        &["grad_fp_input", "start0", "interp_end", "axis1"],
        &["grad_interpolated"],
        vec![],
    )
    .node(
        "three_interpolate_backward",
        "ThreeInterpolateBackward",
        "mluops",
        &["grad_interpolated", "nn_idx", "nn_weight"],
        &["grad_known_feats"],
        vec![attr_int("m", M)],
    );
    g.output("nn_idx", Elem::INT32, Some(&[Fixed(B), Fixed(N), Fixed(3)]))
        .output("nn_weight", Elem::FLOAT, Some(&[Fixed(B), Fixed(N), Fixed(3)]))
        .output("new_features", Elem::FLOAT, Some(&[Fixed(B), Fixed(64), Fixed(N)]))
        .output("grad_known_feats", Elem::FLOAT, Some(&[Fixed(B), Fixed(C2), Fixed(M)]));
    g
}

/// R-FCN head (NHWC): hidden 1x1 conv + ReLU (as MatMul over channels), position-sensitive
/// score maps for 21 classes and 8 class-agnostic box values with 3 x 3 bins, PsRoiPool at
/// stride 16, averaged over the bins (class scores, softmax, box deltas). Gradient subgraph:
/// softmax cross-entropy against `labels`, spread over the bins, PsRoiPoolBackward to the
/// class score maps (bottom_shape from a Shape node), and on to the hidden features.
///
/// Features [batches, height, width, 64] (the goldens use [2, 32, 32, 64]: a 512 x 512 image at
/// stride 16), R rois.
pub fn rfcn_head() -> Graph {
    const CF: i64 = 64;
    const K: i64 = 3;
    const NCLS: i64 = 21;
    const NBOX: i64 = 8;
    let mut rng = Rng(0x5EED_0005);
    let mut g = Graph::new("rfcn_head");
    // The feature map's batch and size are symbolic (the image size varies), so the Shape node
    // that gives PsRoiPoolBackward its bottom_shape is computed at run time, not folded.
    g.input(
        "features",
        Elem::FLOAT,
        Some(&[Sym("batches"), Sym("height"), Sym("width"), Fixed(CF)]),
    )
    .input("rois", Elem::FLOAT, Some(&[Sym("R"), Fixed(5)]))
    .input("labels", Elem::INT64, Some(&[Sym("R")]));
    let mut linear = |g: &mut Graph, name: &str, cin: i64, cout: i64| {
        g.initializer_f32(
            &format!("{name}_w"),
            &[cin, cout],
            &kaiming(&mut rng, (cin * cout) as usize, cin as usize),
        )
        .initializer_f32(
            &format!("{name}_b"),
            &[cout],
            &uniform(&mut rng, cout as usize, 0.05),
        );
    };
    linear(&mut g, "conv_new", CF, CF);
    linear(&mut g, "rfcn_cls", CF, K * K * NCLS);
    linear(&mut g, "rfcn_bbox", CF, K * K * NBOX);
    let dense = |g: &mut Graph, name: &str, x: &str, out: &str| {
        g.node(
            &format!("{name}_matmul"),
            "MatMul",
            "",
            &[x, &format!("{name}_w")],
            &[&format!("{name}_mm")],
            vec![],
        )
        .node(
            &format!("{name}_bias"),
            "Add",
            "",
            &[&format!("{name}_mm"), &format!("{name}_b")],
            &[out],
            vec![],
        );
    };
    dense(&mut g, "conv_new", "features", "conv_new_pre");
    g.node("conv_new_relu", "Relu", "", &["conv_new_pre"], &["hidden"], vec![]);
    dense(&mut g, "rfcn_cls", "hidden", "cls_maps");
    dense(&mut g, "rfcn_bbox", "hidden", "bbox_maps");
    let pool = |od: i64| {
        vec![
            attr_int("pooled_height", K),
            attr_int("pooled_width", K),
            attr_float("spatial_scale", 0.0625),
            attr_int("output_dim", od),
        ]
    };
    g.initializer_i64("axes12", &[2], &[1, 2])
        .initializer_i64("onehot_depth", &[], &[NCLS])
        .initializer_f32("onehot_values", &[2], &[0.0, 1.0])
        .initializer_f32("inv_bins", &[], &[1.0 / (K * K) as f32]);
    g.node(
        "psroi_cls",
        "PsRoiPool",
        "mluops",
        &["cls_maps", "rois"],
        &["cls_pooled", "cls_mapping"],
        pool(NCLS),
    )
    .node(
        "psroi_bbox",
        "PsRoiPool",
        "mluops",
        &["bbox_maps", "rois"],
        &["bbox_pooled", "bbox_mapping"],
        pool(NBOX),
    )
    .node(
        "cls_vote",
        "ReduceMean",
        "",
        &["cls_pooled"],
        &["cls_score"],
        vec![attr_ints("axes", &[1, 2]), attr_int("keepdims", 0)],
    )
    .node(
        "bbox_vote",
        "ReduceMean",
        "",
        &["bbox_pooled"],
        &["bbox_pred"],
        vec![attr_ints("axes", &[1, 2]), attr_int("keepdims", 0)],
    )
    .node("cls_prob", "Softmax", "", &["cls_score"], &["cls_prob"], vec![attr_int("axis", 1)])
    // d(sum of cross-entropies)/dcls_score = softmax - onehot(labels); the bin mean spreads it.
    .node(
        "onehot",
        "OneHot",
        "",
        &["labels", "onehot_depth", "onehot_values"],
        &["onehot"],
        vec![attr_int("axis", -1)],
    )
    .node("grad_score", "Sub", "", &["cls_prob", "onehot"], &["grad_score"], vec![])
    .node("grad_bin", "Mul", "", &["grad_score", "inv_bins"], &["grad_bin"], vec![])
    .node("grad_bin_u", "Unsqueeze", "", &["grad_bin", "axes12"], &["grad_bin_u"], vec![])
    .node("pooled_shape", "Shape", "", &["cls_pooled"], &["pooled_shape"], vec![])
    .node("grad_pooled", "Expand", "", &["grad_bin_u", "pooled_shape"], &["grad_pooled"], vec![])
    .node("cls_maps_shape", "Shape", "", &["cls_maps"], &["cls_maps_shape"], vec![])
    .node(
        "psroi_cls_backward",
        "PsRoiPoolBackward",
        "mluops",
        &["grad_pooled", "rois", "cls_mapping", "cls_maps_shape"],
        &["grad_cls_maps"],
        pool(NCLS),
    )
    .node(
        "rfcn_cls_wt",
        "Transpose",
        "",
        &["rfcn_cls_w"],
        &["rfcn_cls_wt"],
        vec![attr_ints("perm", &[1, 0])],
    )
    .node(
        "grad_hidden",
        "MatMul",
        "",
        &["grad_cls_maps", "rfcn_cls_wt"],
        &["grad_hidden"],
        vec![],
    );
    g.output("cls_score", Elem::FLOAT, Some(&[Sym("R"), Fixed(NCLS)]))
        .output("cls_prob", Elem::FLOAT, Some(&[Sym("R"), Fixed(NCLS)]))
        .output("bbox_pred", Elem::FLOAT, Some(&[Sym("R"), Fixed(NBOX)]))
        .output("cls_mapping", Elem::INT32, Some(&[Sym("R"), Fixed(K), Fixed(K), Fixed(NCLS)]))
        .output(
            "grad_cls_maps",
            Elem::FLOAT,
            Some(&[Sym("batches"), Sym("height"), Sym("width"), Fixed(K * K * NCLS)]),
        )
        .output(
            "grad_hidden",
            Elem::FLOAT,
            Some(&[Sym("batches"), Sym("height"), Sym("width"), Fixed(CF)]),
        );
    g
}
