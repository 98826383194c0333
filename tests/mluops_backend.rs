//! The MLU-OPS backend end to end on the emulated card, against the emulated libmluops
//! (mluops_emulated/, built by `cargo build --example mluops_emulated`, as scripts/test.sh does): version check, handles,
//! descriptors, workspace queries, calls, num_act_out, status mapping, declines to the next
//! path and to the CPU, and the value checks gating every call. No MLU hardware and no
//! Cambricon library run these tests.

use onnxruntime_ep_mlu::mlu::Device;
use onnxruntime_ep_mlu::mluops::{self, DType, Layout};
use onnxruntime_ep_mlu::ops;
use onnxruntime_ep_mlu::ops::device::{Backend, CardBackends, CardNode, Ran, run_node_on_device};
use onnxruntime_ep_mlu::parallel::Serial;
use onnxruntime_ep_mlu::schema::{AttrValue, Attrs};
use onnxruntime_ep_mlu::tensor::{OwnedData, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The emulated library beside this test's profile (target/<profile>/examples).
fn emulated_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let profile = exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>");
    let lib = profile.join("examples/libmluops_emulated.so");
    assert!(
        lib.exists(),
        "{} is missing: build it with `cargo build --example mluops_emulated` (scripts/test.sh does)",
        lib.display()
    );
    lib
}

/// Serialises the tests that open the library: one of them changes the version it reports.
static OPENING: Mutex<()> = Mutex::new(());

fn backends(order: &'static [Backend]) -> CardBackends {
    let _one = OPENING.lock().unwrap_or_else(|e| e.into_inner());
    let path = emulated_library();
    CardBackends {
        order,
        mluops: mluops::open(Some(path.to_str().expect("UTF-8 path")), &device()),
    }
}

fn device() -> Arc<Device> {
    static DEV: OnceLock<Arc<Device>> = OnceLock::new();
    Arc::clone(DEV.get_or_init(|| Device::emulated().expect("the emulated card exists")))
}

fn node(op: &str, attrs: &[(&str, AttrValue)], order: &'static [Backend]) -> CardNode {
    let map: HashMap<String, AttrValue> =
        attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    let create = ops::entry(op).map(|e| e.create_card).expect("a card operator");
    create(&Attrs::new(ops::schema(op), &map), &backends(order)).expect("valid attributes")
}

fn cpu(
    op: &str,
    attrs: &[(&str, AttrValue)],
    inputs: &[Option<&Tensor>],
) -> onnxruntime_ep_mlu::error::Result<Vec<Tensor>> {
    let map: HashMap<String, AttrValue> =
        attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    let kernel = (ops::entry(op).expect("operator").create)(&Attrs::new(ops::schema(op), &map))?;
    let refs: Vec<Option<onnxruntime_ep_mlu::tensor::TensorRef<'_>>> =
        inputs.iter().map(|t| t.map(Tensor::view)).collect();
    let inputs = onnxruntime_ep_mlu::tensor::Inputs::new(ops::schema(op).input_names(), refs)?;
    let mut host = ops::OwnedOutputs::named(ops::schema(op).output_names());
    kernel.compute(&inputs, &mut host, &Serial)?;
    Ok(host.into_tensors())
}

fn f32s(shape: &[usize], seed: u32) -> Tensor {
    let n: usize = shape.iter().product();
    let v = (0..n).map(|i| {
        ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / (1 << 24) as f32
            - 0.5
    });
    Tensor { shape: shape.to_vec(), data: OwnedData::F32(v.collect()) }
}

fn i32s(shape: &[usize], v: Vec<i32>) -> Tensor {
    Tensor { shape: shape.to_vec(), data: OwnedData::I32(v) }
}

/// Runs `op` through the node runner and asserts where it ran and that every output equals
/// the CPU kernel's bit for bit.
fn runs_on(
    op: &str,
    attrs: &[(&str, AttrValue)],
    order: &'static [Backend],
    inputs: &[Option<&Tensor>],
    want: Ran,
) {
    let n = node(op, attrs, order);
    let (got, ran) = run_node_on_device(&device(), &n, inputs).expect("the node runs");
    match (&want, &ran) {
        (Ran::Host(w), Ran::Host(r)) => {
            assert!(r.contains(w.as_str()), "{op}: fell back for '{r}', expected '{w}'")
        }
        // The earlier paths' run-time declines: each expected reason names its backend.
        (Ran::Card(w, wd), Ran::Card(r, rd)) => {
            assert_eq!(w, r, "{op}: the backend that ran it");
            assert_eq!(wd.len(), rd.len(), "{op}: run-time declines {rd:?}, expected {wd:?}");
            for ((wb, why), (rb, got)) in wd.iter().zip(rd) {
                assert!(
                    wb == rb && got.contains(why.as_str()),
                    "{op}: declined by {rb:?} for '{got}', expected {wb:?}: '{why}'"
                );
            }
        }
        _ => assert_eq!(ran, want, "{op}: where the node ran"),
    }
    let reference = cpu(op, attrs, inputs).expect("CPU kernel runs");
    assert_eq!(got.len(), reference.len());
    for (i, (g, r)) in got.iter().zip(&reference).enumerate() {
        assert_eq!(g.shape, r.shape, "{op} output {i} shape");
        let same = match (&g.data, &r.data) {
            (OwnedData::F32(a), OwnedData::F32(b)) => {
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (OwnedData::F16(a), OwnedData::F16(b)) => {
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
            }
            (OwnedData::I32(a), OwnedData::I32(b)) => a == b,
            _ => false,
        };
        assert!(same, "{op} output {i} differs from the CPU kernel's");
    }
}

const MLUOPS: &[Backend] = &[Backend::MluOps];
const AUTO: &[Backend] = &[Backend::MluOps, Backend::Bang];

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

fn refs(v: &[Tensor]) -> Vec<Option<&Tensor>> {
    v.iter().map(Some).collect()
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

fn gip_attrs(subm: i64, kernel: i64, stride: i64) -> Vec<(&'static str, AttrValue)> {
    vec![
        ("batch_size", AttrValue::Int(2)),
        ("spatial_shape", AttrValue::Ints(vec![5, 9, 9])),
        ("kernel_size", AttrValue::Ints(vec![kernel; 3])),
        ("stride", AttrValue::Ints(vec![stride; 3])),
        ("padding", AttrValue::Ints(vec![kernel / 2; 3])),
        ("subm", AttrValue::Int(subm)),
    ]
}

fn sites(l: usize) -> Tensor {
    let mut v = Vec::new();
    for i in 0..l {
        v.extend([(i % 2) as i32, (i * 3 % 5) as i32, (i * 5 % 9) as i32, (i * 7 % 9) as i32]);
    }
    i32s(&[l, 4], v)
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
fn statuses_name_the_call_and_the_status() {
    let lib = backends(MLUOPS).mluops.expect("the emulated library opens");
    let err = lib
        .tensor(Layout::Array, DType::Float, &[])
        .err()
        .expect("dimNb 0 is BAD_PARAM")
        .to_string();
    assert_eq!(
        err,
        "MLU-OPS mluOpSetTensorDescriptor returned MLUOP_STATUS_BAD_PARAM (3): MLUOP_STATUS_BAD_PARAM"
    );
    // NOT_SUPPORTED, a scale limitation the binding did not model, sends the node to the
    // next path (a run-time decline); every other failure is the node's error.
    let limit = lib.check("mluOpX", mluops::NOT_SUPPORTED).expect_err("a failure");
    assert!(
        matches!(limit, onnxruntime_ep_mlu::error::Error::Declined(ref m) if m.contains("MLUOP_STATUS_NOT_SUPPORTED")),
        "{limit:?}"
    );
    let failed = lib.check("mluOpX", 6).expect_err("a failure");
    assert!(matches!(failed, onnxruntime_ep_mlu::error::Error::Runtime(_)), "{failed:?}");
}

#[test]
fn a_version_outside_the_bound_range_is_refused() {
    let _one = OPENING.lock().unwrap_or_else(|e| e.into_inner());
    let path = emulated_library();
    // A refused library is never cached, so each open asks its version again.
    let dir = tempdir();
    let copy = dir.join("libmluops.so");
    std::fs::copy(&path, &copy).expect("copy the emulated library");
    // SAFETY: this test holds OPENING, the lock of every open in this process's tests.
    unsafe { std::env::set_var("MLUOPS_EMULATED_VERSION", "2.0.0") };
    let refused = mluops::open(Some(copy.to_str().expect("UTF-8")), &device());
    // SAFETY: as above.
    unsafe { std::env::remove_var("MLUOPS_EMULATED_VERSION") };
    let why = refused.expect_err("2.0.0 is outside 1.4.0..1.9.x").to_string();
    assert!(why.contains("is MLU-OPS 2.0.0") && why.contains("1.4.0 to 1.9.x"), "{why}");
    assert!(
        mluops::open(Some(copy.to_str().expect("UTF-8")), &device()).is_ok(),
        "1.4.0 is accepted"
    );
    let missing = mluops::open(Some("/nonexistent/libmluops.so"), &device())
        .expect_err("no such file")
        .to_string();
    assert!(
        missing.contains("no usable MLU-OPS library")
            && missing.contains("/nonexistent/libmluops.so: ")
            && missing.contains("mluops_library"),
        "{missing}"
    );
}

/// A stand-in libmluops in C, built with the system `cc` into `dir/name`: every function of
/// `mluops::SIGNATURES` except `omit`, reporting `version`, its `mluOpCreate` returning
/// `create`, the other functions failing with MLUOP_STATUS_INTERNAL_ERROR; `extra` is
/// appended to the source.
fn stand_in(
    dir: &Path,
    name: &str,
    version: (i32, i32, i32),
    create: i32,
    omit: &[&str],
    extra: &str,
) -> PathBuf {
    let (major, minor, patch) = version;
    let special = [
        ("mluOpGetLibVersion", format!("void mluOpGetLibVersion(int *a, int *b, int *c) {{ *a = {major}; *b = {minor}; *c = {patch}; }}")),
        ("mluOpGetErrorString", "const char *mluOpGetErrorString(int s) { return s == 1 ? \"MLUOP_STATUS_NOT_INITIALIZED\" : \"stand-in\"; }".to_owned()),
        ("mluOpCreate", format!("int mluOpCreate(void **h) {{ *h = (void *)0; return {create}; }}")),
    ];
    let mut c = String::new();
    for sig in mluops::SIGNATURES.iter().filter(|s| !omit.contains(&s.name)) {
        match special.iter().find(|(n, _)| *n == sig.name) {
            Some((_, def)) => c.push_str(def),
            None => c.push_str(&format!("int {}() {{ return 4; }}", sig.name)),
        }
        c.push('\n');
    }
    c.push_str(extra);
    std::fs::create_dir_all(dir).expect("stand-in dir");
    let source = dir.join(format!("{name}.c"));
    std::fs::write(&source, c).expect("stand-in source");
    let lib = dir.join(name);
    let out = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&source)
        .output()
        .expect("cc runs");
    assert!(out.status.success(), "cc {name}: {}", String::from_utf8_lossy(&out.stderr));
    lib
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

#[test]
fn a_library_missing_a_symbol_is_refused_when_opened_never_at_a_call() {
    let dir = tempdir().join("missing");
    // A dependency symbol (CNNL's, which libmluops calls) that nothing provides: with lazy
    // binding the open succeeds and the first call aborts the process; RTLD_NOW refuses it.
    let unbound = stand_in(
        &dir,
        "libmluops_unbound.so",
        (1, 4, 0),
        0,
        &["mluOpPsRoiPoolForward"],
        "int cnnlFill_v3(void);\nint mluOpPsRoiPoolForward() { return cnnlFill_v3(); }\n",
    );
    let why = mluops::open(Some(path_str(&unbound)), &device()).expect_err("unbound").to_string();
    assert!(why.contains("cnnlFill_v3") && why.contains(path_str(&unbound)), "{why}");
    // One of the functions the provider binds is absent.
    let lacking =
        stand_in(&dir, "libmluops_lacking.so", (1, 4, 0), 0, &["mluOpPsRoiPoolBackward"], "");
    let why = mluops::open(Some(path_str(&lacking)), &device()).expect_err("lacking").to_string();
    assert!(why.contains("lacks mluOpPsRoiPoolBackward"), "{why}");
}

#[test]
fn a_failing_mluopcreate_declines_the_backend_with_its_status_and_auto_runs_bang() {
    let dir = tempdir().join("create");
    let lib = stand_in(&dir, "libmluops_create.so", (1, 4, 0), 1, &[], "");
    let refused = mluops::open(Some(path_str(&lib)), &device());
    let why = refused.as_ref().expect_err("mluOpCreate fails").to_string();
    assert!(why.contains("mluOpCreate returned MLUOP_STATUS_NOT_INITIALIZED (1)"), "{why}");
    // The probe is made once per card: asked again, the same answer without a second call.
    let again = mluops::open(Some(path_str(&lib)), &device()).expect_err("still refused");
    assert_eq!(again.to_string(), why);
    // `auto` then passes MLU-OPS over at placement, with that reason, for our kernels.
    let max: HashMap<String, AttrValue> =
        [("reduce_type".to_owned(), AttrValue::String("max".into()))].into();
    let create = ops::entry("DynamicScatterBackward").map(|e| e.create_card).expect("card op");
    let backends = CardBackends { order: AUTO, mluops: refused };
    let n =
        create(&Attrs::new(ops::schema("DynamicScatterBackward"), &max), &backends).expect("valid");
    let (first, passed_over) = n.static_choice(&device().info, None).expect("BANG runs it");
    assert_eq!(first, Backend::Bang);
    assert!(
        passed_over.len() == 1
            && passed_over[0].starts_with("mluops: ")
            && passed_over[0].contains("NOT_INITIALIZED"),
        "{passed_over:?}"
    );
}

#[test]
fn a_library_too_new_for_the_cards_architecture_is_refused_naming_both() {
    let dir = tempdir().join("arch");
    let new = stand_in(&dir, "libmluops_160.so", (1, 6, 0), 0, &[], "");
    let why =
        mluops::open(Some(path_str(&new)), &device()).expect_err("1.6.0 on mtp_372").to_string();
    assert!(
        why.contains("MLU-OPS 1.6.0") && why.contains("mtp_372") && why.contains("1.5.x or older"),
        "{why}"
    );
    let old = stand_in(&dir, "libmluops_152.so", (1, 5, 2), 0, &[], "");
    let lib = mluops::open(Some(path_str(&old)), &device()).expect("1.5.2 builds for mtp_372");
    assert_eq!(lib.version, (1, 5, 2));
}

#[test]
fn every_candidate_is_tried_in_order_and_each_failure_is_kept() {
    let _one = OPENING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir().join("candidates");
    let (broken, good) = (dir.join("mluops_home"), dir.join("neuware"));
    stand_in(&broken.join("lib64"), "libmluops.so", (1, 4, 0), 0, &["mluOpCreate"], "");
    std::fs::create_dir_all(good.join("lib64")).expect("lib64");
    let good_lib = good.join("lib64/libmluops.so.1");
    std::fs::copy(emulated_library(), &good_lib).expect("copy the emulated library");
    // SAFETY: this test holds OPENING, the lock of every open that reads the environment.
    unsafe {
        std::env::set_var("MLUOPS_HOME", &broken);
        std::env::set_var("NEUWARE_HOME", &good);
    }
    let order = mluops::candidates(None);
    let lib = mluops::open(None, &device());
    let mut other = order.clone();
    // SAFETY: as above.
    unsafe { std::env::remove_var("NEUWARE_HOME") };
    let none = mluops::open(None, &device());
    // SAFETY: as above.
    unsafe { std::env::remove_var("MLUOPS_HOME") };
    let home = |d: &Path, rest: &str| format!("{}/{rest}", d.display());
    assert_eq!(
        order,
        [
            home(&broken, "lib64/libmluops.so"),
            home(&broken, "lib64/libmluops.so.1"),
            home(&broken, "build/lib/libmluops.so"),
            home(&broken, "build/lib/libmluops.so.1"),
            home(&good, "lib64/libmluops.so"),
            home(&good, "lib64/libmluops.so.1"),
            "libmluops.so".to_owned(),
            "libmluops.so.1".to_owned(),
        ]
    );
    assert_eq!(lib.expect("the second home's library").path, path_str(&good_lib));
    other.retain(|p| !p.starts_with(path_str(&good)));
    let why = none.expect_err("only the broken one").to_string();
    let tried: Vec<&str> =
        why.split("(tried, in order: ").nth(1).expect("the candidates").split("; ").collect();
    for (p, t) in other.iter().zip(&tried) {
        assert!(t.starts_with(&format!("{p}: ")), "{p} in order in: {why}");
    }
    assert!(why.contains("lacks mluOpCreate"), "{why}");
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mluops-backend-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

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
    assert!(why.contains("no card backend of this provider has kernels for it"), "{why}");
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
