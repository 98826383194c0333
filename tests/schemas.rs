//! The schemas in schemas/ against the contract (docs/CONTRACT.md): names, input/output order,
//! dtypes, optionality, attributes and defaults. Registration is derived from these
//! schemas (src/ffi/custom_op.rs), so this pins what ONNX Runtime sees.

use onnxruntime_ep_mlu::ops;
use onnxruntime_ep_mlu::schema::{AttrKind, AttrValue};
use onnxruntime_ep_mlu::tensor::DType;
use std::path::Path;

/// (name, allowed dtypes, optional) of each input.
type InputsOf = Vec<(String, Vec<DType>, bool)>;
/// (name, allowed dtypes) of each output.
type OutputsOf = Vec<(String, Vec<DType>)>;

fn io(op: &str) -> (InputsOf, OutputsOf) {
    let s = ops::schema(op);
    (
        s.inputs.iter().map(|f| (f.name.clone(), s.allowed(f), f.optional)).collect(),
        s.outputs.iter().map(|f| (f.name.clone(), s.allowed(f))).collect(),
    )
}

fn names<T>(v: &[(String, Vec<DType>, T)]) -> Vec<&str> {
    v.iter().map(|x| x.0.as_str()).collect()
}

/// Every file of schemas/<family>/ is the schema one operator of `ops::ALL` is built with, and
/// every operator has exactly one: a schema file left out of the registry, or an operator
/// whose schema is not a file there, fails naming it.
#[test]
fn every_operator_has_exactly_one_schema_in_domain_mluops() {
    for e in ops::ALL {
        let s = ops::schema(e.name);
        assert_eq!(s.op_type, e.name);
        assert_eq!(s.domain, "mluops");
        assert_eq!(s.since_version, 1);
        assert!(!s.doc.is_empty());
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
    let mut matched = vec![0usize; ops::ALL.len()];
    for family in std::fs::read_dir(&root).expect("schemas/") {
        for file in std::fs::read_dir(family.expect("schemas/<family>").path()).expect("a family") {
            let path = file.expect("a schema file").path();
            let text = std::fs::read_to_string(&path).expect("a schema file's text");
            let Some(i) = ops::ALL.iter().position(|e| e.schema == text) else {
                panic!("{} is the schema of no operator in ops::ALL", path.display());
            };
            matched[i] += 1;
        }
    }
    for (e, n) in ops::ALL.iter().zip(matched) {
        assert_eq!(n, 1, "{}: {n} files of schemas/ are its schema, not 1", e.name);
    }
}

/// Every operator of `ops::ALL` has a card path (DynamicScatter's BANG kernels were the last;
/// `OpEntry::create_card` is not optional), and its entry lists the card backends that have
/// one.
#[test]
fn every_operator_has_a_card_path() {
    for e in ops::ALL {
        assert!(!e.card_backends.is_empty(), "{}: its card backends", e.name);
    }
}

#[test]
fn dynamic_scatter_matches_contract() {
    use DType::*;
    let (i, o) = io("DynamicScatter");
    assert_eq!(
        i,
        [("feats".to_string(), vec![F32], false), ("coors".to_string(), vec![I32], false)]
    );
    let outs: Vec<(&str, Vec<DType>)> = o.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    assert_eq!(
        outs,
        [
            ("voxel_feats", vec![F32]),
            ("voxel_coors", vec![I32]),
            ("point2voxel_map", vec![I32]),
            ("voxel_points_count", vec![I32]),
            ("voxel_num", vec![I32])
        ]
    );
    let a = ops::schema("DynamicScatter").attribute("reduce_type").unwrap();
    assert_eq!(
        (a.kind, a.required, a.default_value()),
        (AttrKind::String, false, Some(AttrValue::String("max".into())))
    );
}

#[test]
fn indice_conv_matches_contract() {
    use DType::*;
    let (i, o) = io("IndiceConv");
    assert_eq!(
        names(&i),
        [
            "features",
            "filters",
            "indice_pairs",
            "indice_num",
            "out_indices",
            "bias",
            "scale",
            "shift",
            "residual"
        ]
    );
    let types: Vec<_> = i.iter().map(|x| x.1.clone()).collect();
    let f32s = [vec![F32], vec![F32]];
    let ints = [vec![I32], vec![I32], vec![I32]];
    let epilogue = [vec![F32], vec![F32], vec![F32], vec![F32]];
    assert_eq!(types, [&f32s[..], &ints[..], &epilogue[..]].concat());
    // bias and the epilogue's scale, shift and residual are optional.
    assert_eq!(i.iter().map(|x| x.2).collect::<Vec<_>>(), [vec![false; 5], vec![true; 4]].concat());
    assert_eq!(o, [("output".to_string(), vec![F32])]);
    let s = ops::schema("IndiceConv");
    let a = s.attribute("inverse").unwrap();
    assert_eq!(
        (a.kind, a.required, a.default_value()),
        (AttrKind::Int, false, Some(AttrValue::Int(0)))
    );
    let a = s.attribute("activation").unwrap();
    assert_eq!(
        (a.kind, a.required, a.default_value()),
        (AttrKind::String, false, Some(AttrValue::String("none".into())))
    );
}

#[test]
fn three_interpolate_matches_contract() {
    use DType::*;
    let (i, o) = io("ThreeInterpolate");
    assert_eq!(names(&i), ["features", "indices", "weights"]);
    assert_eq!(
        (i[0].1.clone(), i[1].1.clone(), i[2].1.clone()),
        (vec![F32, F16], vec![I32], vec![F32, F16])
    );
    assert_eq!(o, [("output".to_string(), vec![F32, F16])]);
    let s = ops::schema("ThreeInterpolate");
    assert!(s.attributes.is_empty());
    assert_eq!(s.bindings().len(), 2);
}

#[test]
fn psroipool_matches_contract() {
    use DType::*;
    let (i, o) = io("PsRoiPool");
    assert_eq!(
        i,
        [("input".to_string(), vec![F32], false), ("rois".to_string(), vec![F32], false)]
    );
    assert_eq!(o, [("output".to_string(), vec![F32]), ("mapping_channel".to_string(), vec![I32])]);
    // The same attributes as the backward op, all required.
    let (fwd, bwd) = (ops::schema("PsRoiPool"), ops::schema("PsRoiPoolBackward"));
    assert_eq!(fwd.attributes.len(), 4);
    for a in &fwd.attributes {
        let b = bwd.attribute(&a.name).unwrap();
        assert_eq!((a.kind, a.required), (b.kind, b.required), "{}", a.name);
    }
}

#[test]
fn dynamic_scatter_backward_matches_contract() {
    let (i, o) = io("DynamicScatterBackward");
    assert_eq!(
        names(&i),
        [
            "grad_voxel_feats",
            "feats",
            "voxel_feats",
            "point2voxel_map",
            "voxel_points_count",
            "voxel_num"
        ]
    );
    let types: Vec<_> = i.iter().map(|x| x.1.clone()).collect();
    use DType::*;
    assert_eq!(types, [vec![F32], vec![F32], vec![F32], vec![I32], vec![I32], vec![I32]]);
    assert_eq!(
        i.iter().map(|x| x.2).collect::<Vec<_>>(),
        [false, false, false, false, false, true]
    );
    assert_eq!(o, [("grad_feats".to_string(), vec![F32])]);
    let a = ops::schema("DynamicScatterBackward").attribute("reduce_type").unwrap();
    assert_eq!((a.kind, a.required), (AttrKind::String, false));
    assert_eq!(a.default_value(), Some(AttrValue::String("max".into())));
}

#[test]
fn three_interpolate_backward_matches_contract() {
    use DType::*;
    let (i, o) = io("ThreeInterpolateBackward");
    assert_eq!(names(&i), ["grad_output", "indices", "weights"]);
    assert_eq!(i[0].1, [F32, F16]);
    assert_eq!(i[1].1, [I32]);
    assert_eq!(i[2].1, [F32, F16]);
    assert_eq!(o, [("grad_features".to_string(), vec![F32, F16])]);
    let a = ops::schema("ThreeInterpolateBackward").attribute("m").unwrap();
    assert_eq!((a.kind, a.required), (AttrKind::Int, true));
    // One kernel per binding of T.
    assert_eq!(ops::schema("ThreeInterpolateBackward").bindings().len(), 2);
}

#[test]
fn get_indice_pairs_matches_contract() {
    use DType::*;
    let (i, o) = io("GetIndicePairs");
    assert_eq!(i, [("indices".to_string(), vec![I32], false)]);
    assert_eq!(
        o,
        [
            ("indice_pairs".to_string(), vec![I32]),
            ("out_indices".to_string(), vec![I32]),
            ("indice_num".to_string(), vec![I32])
        ]
    );
    let s = ops::schema("GetIndicePairs");
    let expect: &[(&str, AttrKind, bool, Option<AttrValue>)] = &[
        ("batch_size", AttrKind::Int, true, None),
        ("spatial_shape", AttrKind::Ints, true, None),
        ("kernel_size", AttrKind::Ints, true, None),
        ("stride", AttrKind::Ints, false, Some(AttrValue::Ints(vec![1, 1, 1]))),
        ("padding", AttrKind::Ints, false, Some(AttrValue::Ints(vec![0, 0, 0]))),
        ("dilation", AttrKind::Ints, false, Some(AttrValue::Ints(vec![1, 1, 1]))),
        ("output_padding", AttrKind::Ints, false, Some(AttrValue::Ints(vec![0, 0, 0]))),
        ("subm", AttrKind::Int, false, Some(AttrValue::Int(0))),
        ("transpose", AttrKind::Int, false, Some(AttrValue::Int(0))),
        ("inverse", AttrKind::Int, false, Some(AttrValue::Int(0))),
    ];
    assert_eq!(s.attributes.len(), expect.len());
    for (name, kind, required, default) in expect {
        let a = s.attribute(name).unwrap_or_else(|| panic!("attribute {name}"));
        assert_eq!(
            (a.kind, a.required, a.default_value()),
            (*kind, *required, default.clone()),
            "{name}"
        );
    }
}

#[test]
fn voxel_pooling_forward_matches_contract() {
    use DType::*;
    let (i, o) = io("VoxelPoolingForward");
    assert_eq!(
        i,
        [
            ("geom_xyz".to_string(), vec![I32], false),
            ("input_features".to_string(), vec![F32], false)
        ]
    );
    assert_eq!(
        o,
        [("output_features".to_string(), vec![F32]), ("pos_memo".to_string(), vec![I32])]
    );
    let a = ops::schema("VoxelPoolingForward").attribute("voxel_num").unwrap();
    assert_eq!((a.kind, a.required), (AttrKind::Ints, true));
}

#[test]
fn psroipool_backward_matches_contract() {
    use DType::*;
    let (i, o) = io("PsRoiPoolBackward");
    assert_eq!(names(&i), ["top_grad", "rois", "mapping_channel", "bottom_shape"]);
    let types: Vec<_> = i.iter().map(|x| x.1.clone()).collect();
    assert_eq!(types, [vec![F32], vec![F32], vec![I32], vec![I64]]);
    assert_eq!(o, [("bottom_grad".to_string(), vec![F32])]);
    let s = ops::schema("PsRoiPoolBackward");
    for (name, kind) in [
        ("pooled_height", AttrKind::Int),
        ("pooled_width", AttrKind::Int),
        ("spatial_scale", AttrKind::Float),
        ("output_dim", AttrKind::Int),
    ] {
        let a = s.attribute(name).unwrap();
        assert_eq!((a.kind, a.required, a.default_value()), (kind, true, None), "{name}");
    }
}

#[test]
fn every_attribute_default_has_the_declared_type() {
    for s in ops::schemas() {
        for a in &s.attributes {
            assert_eq!(
                a.required,
                a.default.is_none(),
                "{}.{}: required xor default",
                s.op_type,
                a.name
            );
            if !a.required {
                assert!(
                    a.default_value().is_some(),
                    "{}.{}: default does not parse as {:?}",
                    s.op_type,
                    a.name,
                    a.kind
                );
            }
        }
    }
}
