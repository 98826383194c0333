//! MLUExecutionProvider driven from Rust on the emulated MLU card (MLU_EP_EMULATE=1; no MLU
//! hardware), through the `ort` crate (2.0.0-rc.15, load-dynamic) for sessions and values and
//! through the raw C API (`ort::api()`, an `&ort_sys::OrtApi`) for everything the crate does
//! not wrap or that is under test here: registering the EP library on the environment
//! (`RegisterExecutionProviderLibrary`), listing the devices (`GetEpDevices`), the selection
//! policy (`SessionOptionsSetEpSelectionPolicy(PREFER_NPU)`) and the node assignment the
//! session records (`Session_GetEpGraphAssignmentInfo`).
//!
//! ONNX Runtime is loaded from ORT_DYLIB_PATH, else from .venv's onnxruntime wheel
//! (`common::ort_dylib_path`; scripts/setup.sh installs it); the library
//! under test is MLU_EP_LIB, else the cdylib next to this test executable
//! (target/<profile>/deps), else target/<profile>/libonnxruntime_ep_mlu.so (`cargo build --lib`).
//!
//! The tests of this file share one process, one ONNX Runtime environment (the `ort` crate
//! allows one per process) and one registration of the EP library. The EP factory reads
//! MLU_EP_EMULATE when the library is registered, so every test first calls [`emulate`],
//! which sets the variable exactly once, before ONNX Runtime is loaded.

use onnx_protobuf::tensor_proto::DataType;
use ort::AsPointer;
use ort::environment::Environment;
use ort::session::Session;
use ort::session::builder::SessionBuilder;
use ort::value::Tensor;
use ort_sys::{
    OrtApi, OrtEpAssignedNode, OrtEpAssignedSubgraph, OrtEpDevice,
    OrtExecutionProviderDevicePolicy, OrtHardwareDeviceType, OrtStatusPtr,
};
use std::ffi::{CStr, CString, c_char};
use std::path::PathBuf;
use std::sync::{Once, OnceLock};
mod common;
use common::{Rng, assert_accumulating, library};

#[path = "../models/onnx_builder.rs"]
mod onnx_builder;
use onnx_builder::{Dim, Graph, attr_ints, attr_string};

const EP: &str = "MLUExecutionProvider";
const CPU_EP: &str = "CPUExecutionProvider";
/// The name the EP library is registered under (any unique name does).
const REGISTRATION: &CStr = c"onnxruntime_ep_mlu";

// ------------------------------------------------------------------------------ raw C API helpers

/// Turns a status into a result, releasing it (every status received goes through here).
fn check(api: &OrtApi, status: OrtStatusPtr) -> Result<(), String> {
    if status.0.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null status just returned by ONNX Runtime; its message is read before the
    // status is released, and it is released exactly once.
    let message = unsafe {
        let m = CStr::from_ptr((api.GetErrorMessage)(status.0)).to_string_lossy().into_owned();
        (api.ReleaseStatus)(status.0);
        m
    };
    Err(message)
}

/// [`check`] that panics with `what` on failure.
fn ok(api: &OrtApi, status: OrtStatusPtr, what: &str) {
    if let Err(m) = check(api, status) {
        panic!("{what} failed: {m}");
    }
}

/// Copies a NUL-terminated string owned by ONNX Runtime (`None` for a null pointer).
fn text(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null strings returned by the C API are NUL-terminated and live at least as
    // long as the object they were read from, which the callers hold.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

// ------------------------------------------------------------------------------ environment

/// Sets MLU_EP_EMULATE=1 once per process, before ONNX Runtime is loaded and the EP library
/// registered (the EP factory reads it then). Every test calls this first.
fn emulate() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: runs once, before this process loads ONNX Runtime or the EP library (both
        // happen in `fixture`, after this `Once` completed), so no C code of ours reads the
        // environment concurrently; every other test thread blocks on this `Once` before it
        // touches the environment, and std's own env accesses are serialised by std.
        unsafe { std::env::set_var("MLU_EP_EMULATE", "1") };
    });
}

struct Fixture {
    env: Environment,
    lib: PathBuf,
}

/// The process's ONNX Runtime environment with the EP library registered on it through the
/// C API (`RegisterExecutionProviderLibrary`), created once.
fn fixture() -> &'static Fixture {
    emulate();
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let ort_path = common::ort_dylib_path();
        let lib = library();
        let env = ort::init_from(&ort_path)
            .unwrap_or_else(|e| panic!("cannot load ONNX Runtime from {}: {e}", ort_path.display()))
            .with_name("ep_session")
            .build()
            .unwrap_or_else(|e| panic!("cannot create the ONNX Runtime environment: {e}"));
        let api = ort::api();
        let path = CString::new(lib.to_str().expect("UTF-8 library path"))
            .expect("no NUL in the library path");
        // SAFETY: the environment is live (held by the fixture for the rest of the process);
        // both strings are NUL-terminated and outlive the call (ONNX Runtime copies them). On
        // Linux ORTCHAR_T is `char`.
        let s = unsafe {
            (api.RegisterExecutionProviderLibrary)(
                env.ptr().cast_mut(),
                REGISTRATION.as_ptr(),
                path.as_ptr(),
            )
        };
        ok(api, s, &format!("RegisterExecutionProviderLibrary({})", lib.display()));
        Fixture { env, lib }
    })
}

// ------------------------------------------------------------------------------ devices

/// What one `OrtEpDevice` says about itself and its hardware device.
#[derive(Debug)]
struct DeviceInfo {
    ep_name: Option<String>,
    ep_vendor: Option<String>,
    vendor_id: u32,
    ty: OrtHardwareDeviceType,
    emulated: Option<String>,
}

fn ep_devices(env: &Environment) -> Vec<DeviceInfo> {
    let api = ort::api();
    let mut devices: *const *const OrtEpDevice = std::ptr::null();
    let mut n = 0usize;
    // SAFETY: the environment is live; valid out pointers. The array is owned by the
    // environment and read before anything else is registered.
    ok(api, unsafe { (api.GetEpDevices)(env.ptr(), &mut devices, &mut n) }, "GetEpDevices");
    (0..n)
        .map(|i| {
            // SAFETY: ONNX Runtime returned an array of n live EP devices; every accessor below
            // takes a live EP device / hardware device / key-value set and returns pointers
            // owned by the environment, copied at once by `text`.
            unsafe {
                let device = *devices.add(i);
                let hw = (api.EpDevice_Device)(device);
                let metadata = (api.HardwareDevice_Metadata)(hw);
                DeviceInfo {
                    ep_name: text((api.EpDevice_EpName)(device)),
                    ep_vendor: text((api.EpDevice_EpVendor)(device)),
                    vendor_id: (api.HardwareDevice_VendorId)(hw),
                    ty: (api.HardwareDevice_Type)(hw),
                    emulated: if metadata.is_null() {
                        None
                    } else {
                        text((api.GetKeyValue)(metadata, c"emulated".as_ptr()))
                    },
                }
            }
        })
        .collect()
}

// ------------------------------------------------------------------------------ sessions

/// A session builder whose options carry the given EP selection policy and ask the session to
/// record its node assignment, both set through the C API on the builder's OrtSessionOptions.
fn builder(env: &Environment, policy: OrtExecutionProviderDevicePolicy) -> SessionBuilder {
    let api = ort::api();
    let mut b = Session::builder(env).expect("session builder");
    let options = b.ptr_mut();
    // SAFETY: `options` is the builder's live OrtSessionOptions; the strings are
    // NUL-terminated literals (ONNX Runtime copies them).
    unsafe {
        ok(
            api,
            (api.SessionOptionsSetEpSelectionPolicy)(options, policy),
            "SessionOptionsSetEpSelectionPolicy",
        );
        ok(
            api,
            (api.AddSessionConfigEntry)(
                options,
                c"session.record_ep_graph_assignment_info".as_ptr(),
                c"1".as_ptr(),
            ),
            "AddSessionConfigEntry(session.record_ep_graph_assignment_info)",
        );
    }
    b
}

/// (node name, EP name) for every node, from the session's assignment record.
fn assignment(session: &Session) -> Vec<(String, String)> {
    let api = ort::api();
    let mut subgraphs: *const *const OrtEpAssignedSubgraph = std::ptr::null();
    let mut n = 0usize;
    // SAFETY: the session is live; valid out pointers. The subgraphs are owned by the session.
    ok(
        api,
        unsafe { (api.Session_GetEpGraphAssignmentInfo)(session.ptr(), &mut subgraphs, &mut n) },
        "Session_GetEpGraphAssignmentInfo",
    );
    let mut out = Vec::new();
    for i in 0..n {
        // SAFETY: ONNX Runtime returned n subgraphs, live while the session is.
        let sub = unsafe { *subgraphs.add(i) };
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: `sub` is live; valid out pointer.
        ok(
            api,
            unsafe { (api.EpAssignedSubgraph_GetEpName)(sub, &mut name) },
            "EpAssignedSubgraph_GetEpName",
        );
        let ep = text(name).expect("EP name");
        let mut nodes: *const *const OrtEpAssignedNode = std::ptr::null();
        let mut count = 0usize;
        // SAFETY: `sub` is live; valid out pointers.
        ok(
            api,
            unsafe { (api.EpAssignedSubgraph_GetNodes)(sub, &mut nodes, &mut count) },
            "EpAssignedSubgraph_GetNodes",
        );
        for j in 0..count {
            let mut node_name: *const c_char = std::ptr::null();
            // SAFETY: ONNX Runtime returned `count` live nodes; valid out pointer.
            ok(
                api,
                unsafe { (api.EpAssignedNode_GetName)(*nodes.add(j), &mut node_name) },
                "EpAssignedNode_GetName",
            );
            out.push((text(node_name).expect("node name"), ep.clone()));
        }
    }
    out
}

fn ep_of<'a>(a: &'a [(String, String)], node: &str) -> &'a str {
    a.iter()
        .find(|(n, _)| n == node)
        .map(|(_, e)| e.as_str())
        .unwrap_or_else(|| panic!("node {node} not in the assignment {a:?}"))
}

// ------------------------------------------------------------------------------ model and data

/// Relu (CPU) -> VoxelPoolingForward (MLU), DynamicScatterBackward "mean" (declined by the
/// MLU EP: CPU) and DynamicScatterBackward "max" (MLU).
fn model() -> Vec<u8> {
    let (f, i) = (DataType::FLOAT, DataType::INT32);
    let mut g = Graph::new("ep_session");
    g.input("geom", i, Some(&[Dim::Fixed(B as i64), Dim::Fixed(P as i64), Dim::Fixed(3)]))
        .input(
            "features",
            f,
            Some(&[Dim::Fixed(B as i64), Dim::Fixed(P as i64), Dim::Fixed(CF as i64)]),
        )
        .input("gvf", f, None)
        .input("feats", f, None)
        .input("vf", f, None)
        .input("p2v", i, None)
        .input("count", i, None)
        .node("relu", "Relu", "", &["features"], &["features_relu"], vec![])
        .node(
            "vpf",
            "VoxelPoolingForward",
            "mluops",
            &["geom", "features_relu"],
            &["bev", "pos_memo"],
            vec![attr_ints("voxel_num", &[NX, NY, NZ])],
        )
        .node(
            "dsb_mean",
            "DynamicScatterBackward",
            "mluops",
            &["gvf", "feats", "vf", "p2v", "count"],
            &["g_mean"],
            vec![attr_string("reduce_type", "mean")],
        )
        .node(
            "dsb_max",
            "DynamicScatterBackward",
            "mluops",
            &["gvf", "feats", "vf", "p2v", "count"],
            &["g_max"],
            vec![attr_string("reduce_type", "max")],
        )
        .output("bev", f, None)
        .output("pos_memo", i, None)
        .output("g_mean", f, None)
        .output("g_max", f, None);
    g.bytes()
}

// VoxelPoolingForward: B batches of P points with CF features on an NX x NY x NZ grid.
const B: usize = 2;
const P: usize = 300;
const CF: usize = 5;
const NX: i64 = 16;
const NY: i64 = 12;
const NZ: i64 = 2;
// DynamicScatterBackward: N points, M voxels, C channels.
const N: usize = 50;
const M: usize = 8;
const C: usize = 4;

struct Feeds {
    geom: Vec<i32>,
    features: Vec<f32>,
    gvf: Vec<f32>,
    feats: Vec<f32>,
    vf: Vec<f32>,
    p2v: Vec<i32>,
    count: Vec<i32>,
}

fn feeds() -> Feeds {
    let mut r = Rng(7);
    let mut below = |n: u64| (r.next() % n) as i64;
    // Coordinates one past the grid on each side, so some points are out of range.
    let geom = (0..B * P)
        .flat_map(|_| {
            [
                below(NX as u64 + 3) as i32 - 1,
                below(NY as u64 + 3) as i32 - 1,
                below(NZ as u64 + 1) as i32,
            ]
        })
        .collect();
    // Half the features negative, so the Relu matters.
    let features = (0..B * P * CF).map(|_| below(2001) as f32 / 100.0 - 10.0).collect();
    let p2v: Vec<i32> = (0..N).map(|_| below(M as u64 + 1) as i32 - 1).collect();
    // Small integers: ties within a voxel exercise max's lowest-index rule.
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
    // Every count > 0 (mean divides by it), not equal to the number of points.
    let mut count = vec![1i32; M];
    for &v in p2v.iter().filter(|&&v| v >= 0) {
        count[v as usize] += 1;
    }
    let gvf = (0..M * C).map(|_| below(1001) as f32 / 100.0 - 5.0).collect();
    Feeds { geom, features, gvf, feats, vf, p2v, count }
}

/// One output: shape, and its values as f32 or i32.
#[derive(Debug)]
struct Out {
    shape: Vec<usize>,
    f: Vec<f32>,
    i: Vec<i32>,
}

const OUTPUTS: [&str; 4] = ["bev", "pos_memo", "g_mean", "g_max"];

fn run(session: &mut Session, f: &Feeds) -> Vec<Out> {
    let t = |shape: Vec<usize>, d: &Vec<f32>| {
        Tensor::from_array((shape, d.clone())).expect("tensor").into_dyn()
    };
    let ti = |shape: Vec<usize>, d: &Vec<i32>| {
        Tensor::from_array((shape, d.clone())).expect("tensor").into_dyn()
    };
    let inputs = vec![
        ("geom", ti(vec![B, P, 3], &f.geom)),
        ("features", t(vec![B, P, CF], &f.features)),
        ("gvf", t(vec![M, C], &f.gvf)),
        ("feats", t(vec![N, C], &f.feats)),
        ("vf", t(vec![M, C], &f.vf)),
        ("p2v", ti(vec![N], &f.p2v)),
        ("count", ti(vec![M], &f.count)),
    ];
    let outputs = session.run(inputs).expect("run");
    OUTPUTS
        .iter()
        .map(|name| {
            let v = &outputs[*name];
            match v.try_extract_tensor::<f32>() {
                Ok((shape, data)) => Out {
                    shape: shape.iter().map(|&d| d as usize).collect(),
                    f: data.to_vec(),
                    i: vec![],
                },
                Err(_) => {
                    let (shape, data) = v
                        .try_extract_tensor::<i32>()
                        .unwrap_or_else(|e| panic!("{name}: neither float nor int32: {e}"));
                    Out {
                        shape: shape.iter().map(|&d| d as usize).collect(),
                        f: vec![],
                        i: data.to_vec(),
                    }
                }
            }
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

// ------------------------------------------------------------------------------ tests

#[test]
fn ep_device_is_listed() {
    emulate();
    let fx = fixture();
    let devices = ep_devices(&fx.env);
    let mlu: Vec<&DeviceInfo> =
        devices.iter().filter(|d| d.ep_name.as_deref() == Some(EP)).collect();
    assert_eq!(mlu.len(), 1, "one emulated card (and no real one on this machine) in {devices:?}");
    let d = mlu[0];
    assert_eq!(d.ep_vendor.as_deref(), Some("Cambricon"), "{d:?}");
    assert_eq!(d.vendor_id, 0xCABC, "{d:?}");
    assert_eq!(d.ty, OrtHardwareDeviceType::OrtHardwareDeviceType_NPU, "{d:?}");
    assert_eq!(d.emulated.as_deref(), Some("true"), "{d:?}");
    // The CPU EP is still there.
    assert!(devices.iter().any(|d| d.ep_name.as_deref() == Some(CPU_EP)), "{devices:?}");
}

#[test]
fn selection_policy_puts_mluops_nodes_on_the_emulated_mlu() {
    emulate();
    let fx = fixture();
    let model = model();
    let f = feeds();

    // The EP chosen by the PREFER_NPU selection policy, which also brings the EP factory's
    // `mluops` domain into the session (no custom-op library is registered here).
    let mut mlu = builder(
        &fx.env,
        OrtExecutionProviderDevicePolicy::OrtExecutionProviderDevicePolicy_PREFER_NPU,
    )
    .commit_from_memory(&model)
    .expect("session with the PREFER_NPU selection policy");
    let a = assignment(&mlu);
    assert_eq!(ep_of(&a, "vpf"), EP, "{a:?}");
    assert_eq!(ep_of(&a, "dsb_max"), EP, "{a:?}");
    assert_eq!(ep_of(&a, "dsb_mean"), CPU_EP, "mean is declined by the MLU EP: {a:?}");
    assert_eq!(ep_of(&a, "relu"), CPU_EP, "{a:?}");

    // The reference: the custom-op library's CPU kernels, with the CPU EP only. The builder of
    // the `ort` crate sets the MAX_EFFICIENCY policy by default, which would pick the MLU EP
    // registered on this environment; PREFER_CPU keeps every node on the CPU, and the
    // assignment record checks that.
    let mut cpu = builder(
        &fx.env,
        OrtExecutionProviderDevicePolicy::OrtExecutionProviderDevicePolicy_PREFER_CPU,
    )
    .with_operator_library(&fx.lib)
    .expect("custom-op library")
    .commit_from_memory(&model)
    .expect("CPU session");
    let a = assignment(&cpu);
    for node in ["relu", "vpf", "dsb_mean", "dsb_max"] {
        assert_eq!(ep_of(&a, node), CPU_EP, "reference session: {a:?}");
    }

    let (got, want) = (run(&mut mlu, &f), run(&mut cpu, &f));
    for ((name, g), w) in OUTPUTS.iter().zip(&got).zip(&want) {
        assert_eq!(g.shape, w.shape, "{name}: shape");
        match *name {
            "bev" => {
                assert_eq!(g.shape, [B, NY as usize, NX as usize, CF], "bev: shape");
                let reference: Vec<f64> = w.f.iter().map(|&x| x as f64).collect();
                assert_accumulating(&g.f, &reference, "bev");
            }
            "pos_memo" => {
                assert_eq!(g.shape, [B, P, 3], "pos_memo: shape");
                assert_eq!(g.i, w.i, "pos_memo is exact");
            }
            _ => {
                assert_eq!(g.shape, [N, C], "{name}: shape");
                assert_eq!(bits(&g.f), bits(&w.f), "{name}: DynamicScatterBackward is exact");
            }
        }
    }
    // The data is not trivial: cells were filled, some points were out of range, and both
    // gradients carry values.
    assert!(got[0].f.iter().any(|&x| x > 0.0), "bev all zero");
    assert!(
        got[1].i.contains(&-1) && got[1].i.iter().any(|&x| x >= 0),
        "pos_memo without both kinds of points"
    );
    assert!(
        got[2].f.iter().any(|&x| x != 0.0) && got[3].f.iter().any(|&x| x != 0.0),
        "a gradient is all zero"
    );
}
