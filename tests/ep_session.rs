//! MLUExecutionProvider from Rust through the `ort` crate (2.0.0-rc.15, load-dynamic) on the
//! emulated MLU card (MLU_EP_EMULATE=1; no MLU hardware): the library registered as an EP
//! library on the environment, the device listed, and a session whose EP comes from the C
//! API selection policy (`SessionOptionsSetEpSelectionPolicy(PREFER_NPU)`, which also
//! registers the `mluops` domain). Node assignment is read from the session
//! (`Session_GetEpGraphAssignmentInfo`), outputs are compared with the CPU path.
//!
//! Everything runs in one test function: the EP factory reads MLU_EP_EMULATE when the
//! library is registered, and the variable is set before any other thread exists.

use onnx_protobuf::tensor_proto::DataType;
use ort::AsPointer;
use ort::memory::DeviceType;
use ort::session::Session;
use ort::session::builder::AutoDevicePolicy;
use ort::value::Tensor;
use std::ffi::CStr;
use std::path::{Path, PathBuf};
mod common;
use common::{Rng, assert_accumulating};

#[path = "../models/onnx_builder.rs"]
mod onnx_builder;
use onnx_builder::{Dim, Graph, attr_ints, attr_string};

const EP: &str = "MLUExecutionProvider";

fn library() -> PathBuf {
    if let Some(p) = std::env::var_os("MLU_EP_LIB") {
        return PathBuf::from(p);
    }
    // Next to the test executable (target/<profile>/deps), else target/<profile>.
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("test executable has a directory");
    let beside = dir.join("libonnxruntime_ep_mlu.so");
    if beside.is_file() { beside } else { dir.parent().expect("profile dir").join("libonnxruntime_ep_mlu.so") }
}

/// node name -> EP name, from the session's assignment record.
fn assignment(session: &Session) -> Vec<(String, String)> {
    let api = ort::api();
    let mut subgraphs: *const *const ort_sys::OrtEpAssignedSubgraph = std::ptr::null();
    let mut n = 0usize;
    let text = |p: *const std::ffi::c_char| {
        // SAFETY: ORT returns NUL-terminated strings owned by the session.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    };
    let ok = |s: ort_sys::OrtStatusPtr| {
        if !s.0.is_null() {
            // SAFETY: a status returned by the API, read then released once.
            let msg = unsafe { CStr::from_ptr((api.GetErrorMessage)(s.0)) }.to_string_lossy().into_owned();
            // SAFETY: as above.
            unsafe { (api.ReleaseStatus)(s.0) };
            panic!("ORT call failed: {msg}");
        }
    };
    // SAFETY: the session is live; out pointers are valid.
    ok(unsafe { (api.Session_GetEpGraphAssignmentInfo)(session.ptr(), &mut subgraphs, &mut n) });
    let mut out = Vec::new();
    for i in 0..n {
        // SAFETY: ORT returned n subgraphs.
        let sub = unsafe { *subgraphs.add(i) };
        let mut name = std::ptr::null();
        // SAFETY: sub is live while the session is.
        ok(unsafe { (api.EpAssignedSubgraph_GetEpName)(sub, &mut name) });
        let ep = text(name);
        let (mut nodes, mut count): (*const *const ort_sys::OrtEpAssignedNode, usize) = (std::ptr::null(), 0);
        // SAFETY: as above.
        ok(unsafe { (api.EpAssignedSubgraph_GetNodes)(sub, &mut nodes, &mut count) });
        for j in 0..count {
            let mut node_name = std::ptr::null();
            // SAFETY: ORT returned `count` nodes.
            ok(unsafe { (api.EpAssignedNode_GetName)(*nodes.add(j), &mut node_name) });
            out.push((text(node_name), ep.clone()));
        }
    }
    out
}

fn ep_of<'a>(a: &'a [(String, String)], node: &str) -> &'a str {
    a.iter().find(|(n, _)| n == node).map(|(_, e)| e.as_str()).unwrap_or_else(|| panic!("node {node} not in {a:?}"))
}

fn model() -> Vec<u8> {
    let f = DataType::FLOAT;
    let i = DataType::INT32;
    let mut g = Graph::new("ep_session");
    g.input("geom", i, Some(&[Dim::Fixed(2), Dim::Fixed(300), Dim::Fixed(3)]))
        .input("features", f, Some(&[Dim::Fixed(2), Dim::Fixed(300), Dim::Fixed(5)]))
        .input("gvf", f, None)
        .input("feats", f, None)
        .input("vf", f, None)
        .input("p2v", i, None)
        .input("count", i, None)
        .node("relu", "Relu", "", &["features"], &["features_relu"], vec![])
        .node("vpf", "VoxelPoolingForward", "mluops", &["geom", "features_relu"], &["bev", "pos_memo"], vec![attr_ints(
            "voxel_num",
            &[16, 12, 2],
        )])
        .node("dsb_mean", "DynamicScatterBackward", "mluops", &["gvf", "feats", "vf", "p2v", "count"], &["g_mean"], vec![
            attr_string("reduce_type", "mean"),
        ])
        .node("dsb_max", "DynamicScatterBackward", "mluops", &["gvf", "feats", "vf", "p2v", "count"], &["g_max"], vec![
            attr_string("reduce_type", "max"),
        ])
        .output("bev", f, None)
        .output("pos_memo", i, None)
        .output("g_mean", f, None)
        .output("g_max", f, None);
    g.bytes()
}

struct Feeds {
    geom: Vec<i32>,
    features: Vec<f32>,
    gvf: Vec<f32>,
    feats: Vec<f32>,
    vf: Vec<f32>,
    p2v: Vec<i32>,
    count: Vec<i32>,
}

const N: usize = 50;
const M: usize = 8;
const C: usize = 4;

fn feeds() -> Feeds {
    let mut r = Rng(7);
    let mut below = |n: u64| (r.next() % n) as i64;
    let geom = (0..2 * 300).flat_map(|_| [below(19) as i32 - 1, below(15) as i32 - 1, below(3) as i32]).collect();
    let features = (0..2 * 300 * 5).map(|_| below(2001) as f32 / 100.0 - 10.0).collect();
    let p2v: Vec<i32> = (0..N).map(|_| below(M as u64 + 1) as i32 - 1).collect();
    let feats: Vec<f32> = (0..N * C).map(|_| below(5) as f32 - 2.0).collect();
    let mut vf = vec![f32::NEG_INFINITY; M * C];
    for (p, &v) in p2v.iter().enumerate() {
        if v >= 0 {
            for c in 0..C {
                let slot = &mut vf[v as usize * C + c];
                *slot = slot.max(feats[p * C + c]);
            }
        }
    }
    let mut count = vec![1i32; M];
    for &v in p2v.iter().filter(|&&v| v >= 0) {
        count[v as usize] += 1;
    }
    let gvf = (0..M * C).map(|_| below(1001) as f32 / 100.0 - 5.0).collect();
    Feeds { geom, features, gvf, feats, vf, p2v, count }
}

fn run(session: &mut Session, f: &Feeds) -> Vec<(Vec<usize>, Vec<f32>, Vec<i32>)> {
    let t = |shape: Vec<usize>, d: &Vec<f32>| Tensor::from_array((shape, d.clone())).expect("tensor").into_dyn();
    let ti = |shape: Vec<usize>, d: &Vec<i32>| Tensor::from_array((shape, d.clone())).expect("tensor").into_dyn();
    let inputs = vec![
        ("geom", ti(vec![2, 300, 3], &f.geom)),
        ("features", t(vec![2, 300, 5], &f.features)),
        ("gvf", t(vec![M, C], &f.gvf)),
        ("feats", t(vec![N, C], &f.feats)),
        ("vf", t(vec![M, C], &f.vf)),
        ("p2v", ti(vec![N], &f.p2v)),
        ("count", ti(vec![M], &f.count)),
    ];
    let outputs = session.run(inputs).expect("run");
    ["bev", "pos_memo", "g_mean", "g_max"]
        .iter()
        .map(|name| {
            let v = &outputs[*name];
            match v.try_extract_tensor::<f32>() {
                Ok((shape, data)) => (shape.iter().map(|&d| d as usize).collect(), data.to_vec(), vec![]),
                Err(_) => {
                    let (shape, data) = v.try_extract_tensor::<i32>().expect("int32 output");
                    (shape.iter().map(|&d| d as usize).collect(), vec![], data.to_vec())
                }
            }
        })
        .collect()
}

#[test]
fn selection_policy_puts_the_supported_mluops_nodes_on_the_emulated_mlu() {
    // SAFETY: the only test of this executable, run before ONNX Runtime or any other thread
    // of ours reads the environment.
    unsafe { std::env::set_var("MLU_EP_EMULATE", "1") };
    let ort_path = std::env::var("ORT_DYLIB_PATH").expect("ORT_DYLIB_PATH is not set: `source scripts/setup.sh` first");
    assert!(Path::new(&ort_path).is_file(), "ORT_DYLIB_PATH={ort_path} is not a file");
    let lib = library();
    assert!(lib.is_file(), "library under test not found at {} (cargo build --lib, or set MLU_EP_LIB)", lib.display());
    let env = ort::init_from(&ort_path).expect("load ONNX Runtime").with_name("ep_session").build().expect("environment");
    env.register_ep_library(EP, &lib).expect("register the EP library");

    // The device: an NPU from Cambricon, served by MLUExecutionProvider.
    let devices: Vec<_> = env.devices().filter(|d| d.ep().is_ok_and(|e| e == EP)).collect();
    assert_eq!(devices.len(), 1, "one emulated card");
    let hw = devices[0].hardware_device();
    assert_eq!(devices[0].ep_vendor().expect("vendor"), "Cambricon");
    assert_eq!(hw.ty(), DeviceType::NPU);
    assert_eq!(hw.vendor().expect("hardware vendor"), "Cambricon");
    drop(devices);

    let model = model();
    let f = feeds();
    let mut mlu = Session::builder(&env)
        .expect("builder")
        .with_config_entry("session.record_ep_graph_assignment_info", "1")
        .expect("config")
        .with_auto_device(AutoDevicePolicy::PreferNPU)
        .expect("selection policy")
        .commit_from_memory(&model)
        .expect("session with the selection policy");
    let a = assignment(&mlu);
    assert_eq!(ep_of(&a, "vpf"), EP);
    assert_eq!(ep_of(&a, "dsb_max"), EP);
    assert_eq!(ep_of(&a, "dsb_mean"), "CPUExecutionProvider", "mean is declined by the MLU kernels");
    assert_eq!(ep_of(&a, "relu"), "CPUExecutionProvider");

    let mut cpu = Session::builder(&env)
        .expect("builder")
        .with_operator_library(&lib)
        .expect("custom-op library")
        .commit_from_memory(&model)
        .expect("CPU session");
    let (got, want) = (run(&mut mlu, &f), run(&mut cpu, &f));
    let names = ["bev", "pos_memo", "g_mean", "g_max"];
    for ((name, g), w) in names.iter().zip(&got).zip(&want) {
        assert_eq!(g.0, w.0, "{name}: shape");
        assert_eq!(g.2, w.2, "{name}: int32 outputs are exact");
        if *name == "bev" {
            let reference: Vec<f64> = w.1.iter().map(|&x| x as f64).collect();
            assert_accumulating(&g.1, &reference, name);
        } else {
            // DynamicScatterBackward is exact.
            assert_eq!(g.1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), w.1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{name}");
        }
    }
    assert!(got[0].1.iter().any(|&x| x != 0.0) && got[3].1.iter().any(|&x| x != 0.0), "the outputs carry data");
}
