//! The session driver of scripts/valgrind.sh: runs the model zoo (models/zoo.json, all nine
//! operators) and the demo model (models/mluops_demo.onnx, the five MLU operators) through
//! ONNX Runtime, one session per model, on one or both paths:
//!
//! * `cpu`: the custom-op library (RegisterCustomOpsLibrary_V2, `with_operator_library`),
//!   every node on ONNX Runtime's CPU execution provider;
//! * `mlu`: the MLUExecutionProvider plugin on the emulated card (MLU_EP_EMULATE=1, set here
//!   before ONNX Runtime is loaded), registered on the environment
//!   (RegisterExecutionProviderLibrary) and appended for its devices
//!   (SessionOptionsAppendExecutionProvider_V2); the nodes it declines (the four forward
//!   partners, ...) run on the CPU execution provider inside the same session.
//!
//! It is meant to run under valgrind, so it keeps the process small and deterministic: one
//! intra-op and one inter-op thread, sequential execution, one run per session, and every
//! session, the environment and with it the EP library released before the process exits.
//! ONNX Runtime's CPU memory arena and memory-pattern plan are off, so every tensor is a heap
//! block of its own size and an access past the end of an input or output our kernels touch
//! is an invalid read or write for memcheck, not a silent hit on an arena neighbour.
//! (Card memory on the emulated card is its own exactly-sized block already, but the emulator
//! fills it with 0xFF when allocated, as it does on-chip memory: a kernel that leaves device
//! output unwritten shows as NaN / -1 in the golden comparison, not as uninitialised memory.)
//! On `mlu` too, what runs on the host (ORT's CPU nodes, the host side of every copy) gets
//! exact-size buffers.
//! Every output is compared with its golden (models/<name>.npz) under the tolerance of
//! models/zoo.json (the demo model: exact for integer outputs, accumulating 3e-3 otherwise), so
//! every output byte is read and a kernel that leaves part of an output uninitialised shows up
//! under memcheck as a use of an uninitialised value (with --track-origins, its allocation). The
//! node assignment the session records is checked too: on `cpu` nothing runs on the MLU EP; with
//! every model, each of the nine operators ran on each path, and on `mlu` each of the five MLU
//! operators on the MLU EP.
//!
//! ONNX Runtime's telemetry is switched off (ORT_DISABLE_TELEMETRY=1 unless set): the 1.31
//! Linux wheel's 1DS telemetry thread races with ORT's static destructors at process exit.
//!
//! The inputs and goldens are read from .npy files: `scripts/valgrind.sh` unpacks each
//! models/<name>.npz (deflate-compressed zip) into <data>/<name>/ first (the crate has no
//! inflate implementation, and this keeps the driver's own work under valgrind small).
//!
//! Usage: valgrind_sessions --data DIR [--paths cpu,mlu] [--models a,b,...] [--lib PATH]
//! ONNX Runtime is loaded from ORT_DYLIB_PATH (`source scripts/setup.sh`); the library under
//! test is --lib, else MLU_EP_LIB, else target/<profile>/libonnxruntime_ep_mlu.so next to this
//! example's directory. Exits 1 when a session fails, an output misses its golden or the
//! assignment is not the expected one.

use onnxruntime_ep_mlu::ops::{self, device::Backend};
use ort::AsPointer;
use ort::environment::Environment;
use ort::logging::LogLevel;
use ort::memory::Allocator;
use ort::session::Session;
use ort::session::builder::{AutoDevicePolicy, GraphOptimizationLevel};
use ort::value::{DynTensor, DynTensorValueType, TensorElementType};
use serde_json::Value;
use std::collections::BTreeSet;
use std::ffi::{CStr, c_char};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const EP: &str = "MLUExecutionProvider";
const DEMO_TOLERANCE: f64 = 3e-3;

type Result<T> = std::result::Result<T, String>;

// ------------------------------------------------------------------------------ .npy

/// One array of a .npy file: its element type, shape and little-endian bytes.
struct Npy {
    ty: TensorElementType,
    shape: Vec<i64>,
    bytes: Vec<u8>,
}

fn read_npy(path: &Path) -> Result<Npy> {
    let raw = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let bad = |what: &str| format!("{}: {what}", path.display());
    if raw.len() < 10 || &raw[..6] != b"\x93NUMPY" {
        return Err(bad("not a .npy file"));
    }
    let (header_len, start) = match raw[6] {
        1 => (u16::from_le_bytes([raw[8], raw[9]]) as usize, 10),
        2 | 3 if raw.len() >= 12 => {
            (u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]) as usize, 12)
        }
        _ => return Err(bad("unsupported .npy version")),
    };
    let header = std::str::from_utf8(
        raw.get(start..start + header_len).ok_or_else(|| bad("truncated header"))?,
    )
    .map_err(|_| bad("header is not UTF-8"))?;
    let field = |key: &str| -> Result<&str> {
        let at = header
            .find(&format!("'{key}':"))
            .ok_or_else(|| bad(&format!("no '{key}' in the header")))?;
        Ok(header[at + key.len() + 3..].trim_start())
    };
    let descr = field("descr")?;
    let (ty, size) = match descr.get(..5) {
        Some("'<f4'") => (TensorElementType::Float32, 4),
        Some("'<f2'") => (TensorElementType::Float16, 2),
        Some("'<f8'") => (TensorElementType::Float64, 8),
        Some("'<i4'") => (TensorElementType::Int32, 4),
        Some("'<i8'") => (TensorElementType::Int64, 8),
        Some("'|u1'") => (TensorElementType::Uint8, 1),
        Some("'|b1'") => (TensorElementType::Bool, 1),
        _ => return Err(bad(&format!("unsupported dtype {descr}"))),
    };
    if !field("fortran_order")?.starts_with("False") {
        return Err(bad("fortran_order arrays are not supported"));
    }
    let dims = field("shape")?;
    let dims = &dims[1..dims.find(')').ok_or_else(|| bad("shape"))?];
    let shape: Vec<i64> = dims
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| d.parse().map_err(|_| bad("shape")))
        .collect::<Result<_>>()?;
    let bytes = raw[start + header_len..].to_vec();
    let n: i64 = shape.iter().product();
    if bytes.len() != n as usize * size {
        return Err(bad(&format!(
            "{} data bytes for shape {shape:?} of {size}-byte elements",
            bytes.len()
        )));
    }
    Ok(Npy { ty, shape, bytes })
}

fn element_size(ty: TensorElementType) -> usize {
    match ty {
        TensorElementType::Float64 | TensorElementType::Int64 => 8,
        TensorElementType::Float32 | TensorElementType::Int32 => 4,
        TensorElementType::Float16 => 2,
        _ => 1,
    }
}

/// The element values as f64 (integer and float types alike).
fn values(ty: TensorElementType, bytes: &[u8]) -> Vec<f64> {
    let size = element_size(ty);
    bytes
        .chunks_exact(size)
        .map(|c| match ty {
            TensorElementType::Float32 => f32::from_le_bytes(c.try_into().unwrap()) as f64,
            TensorElementType::Float64 => f64::from_le_bytes(c.try_into().unwrap()),
            TensorElementType::Float16 => half::f16::from_le_bytes(c.try_into().unwrap()).to_f64(),
            TensorElementType::Int32 => i32::from_le_bytes(c.try_into().unwrap()) as f64,
            TensorElementType::Int64 => i64::from_le_bytes(c.try_into().unwrap()) as f64,
            _ => c[0] as f64,
        })
        .collect()
}

// ------------------------------------------------------------------------------ comparison

enum Tolerance {
    Exact,
    Accumulating { diff1: f64, diff2: f64 },
}

/// None when `got` meets the golden under `tol`, else what differs.
fn compare(got: &Npy, want: &Npy, tol: &Tolerance) -> Option<String> {
    if got.shape != want.shape || got.ty != want.ty {
        return Some(format!(
            "{:?} {:?} != golden {:?} {:?}",
            got.ty, got.shape, want.ty, want.shape
        ));
    }
    let (a, b) = (values(got.ty, &got.bytes), values(want.ty, &want.bytes));
    match *tol {
        Tolerance::Exact => {
            let bad =
                a.iter().zip(&b).filter(|(x, y)| !(x == y || (x.is_nan() && y.is_nan()))).count();
            (bad > 0).then(|| format!("{bad} of {} elements differ", a.len()))
        }
        Tolerance::Accumulating { diff1, diff2 } => {
            // models/run_zoo.py's metric (tests/python/reference.py accumulating_metrics).
            let (mut e1, mut n1, mut e2, mut n2, mut nan) = (0f64, 0f64, 0f64, 0f64, false);
            for (&x, &y) in a.iter().zip(&b) {
                let d = x - y;
                e1 += d.abs();
                n1 += y.abs();
                e2 += d * d;
                n2 += y * y;
                nan |= x.is_nan();
            }
            let (d1, d2) = if n1 == 0.0 {
                if e1 == 0.0 && !nan { (0.0, 0.0) } else { (f64::INFINITY, f64::INFINITY) }
            } else {
                (e1 / n1, (e2 / n2).sqrt())
            };
            (!(d1 <= diff1 && d2 <= diff2))
                .then(|| format!("diff1 {d1:.2e} diff2 {d2:.2e} (<= {diff1:e}, {diff2:e})"))
        }
    }
}

// ------------------------------------------------------------------------------ models

struct Model {
    name: String,
    onnx: PathBuf,
    /// Output name -> tolerance; None: every output the session has, by its type.
    outputs: Option<Vec<(String, Tolerance)>>,
}

fn models(repo: &Path, only: Option<&[String]>) -> Result<Vec<Model>> {
    let zoo_path = repo.join("models/zoo.json");
    let zoo: Value = serde_json::from_str(
        &std::fs::read_to_string(&zoo_path).map_err(|e| format!("{}: {e}", zoo_path.display()))?,
    )
    .map_err(|e| format!("{}: {e}", zoo_path.display()))?;
    let mut all = Vec::new();
    for (name, spec) in zoo["models"].as_object().ok_or("zoo.json: no models")? {
        let mut outputs = Vec::new();
        for (out, t) in
            spec["outputs"].as_object().ok_or_else(|| format!("zoo.json: {name}: no outputs"))?
        {
            let tol = match t["class"].as_str() {
                Some("exact") => Tolerance::Exact,
                Some("accumulating") => Tolerance::Accumulating {
                    diff1: t["diff1"].as_f64().ok_or("zoo.json: diff1")?,
                    diff2: t["diff2"].as_f64().ok_or("zoo.json: diff2")?,
                },
                other => return Err(format!("zoo.json: {name}.{out}: class {other:?}")),
            };
            outputs.push((out.clone(), tol));
        }
        let file = spec["model"].as_str().ok_or_else(|| format!("zoo.json: {name}: no model"))?;
        all.push(Model {
            name: name.clone(),
            onnx: repo.join("models").join(file),
            outputs: Some(outputs),
        });
    }
    all.push(Model {
        name: "mluops_demo".into(),
        onnx: repo.join("models/mluops_demo.onnx"),
        outputs: None,
    });
    match only {
        None => Ok(all),
        Some(names) => names
            .iter()
            .map(|n| {
                let at = all
                    .iter()
                    .position(|m| &m.name == n)
                    .ok_or_else(|| format!("unknown model {n}"))?;
                Ok(all.remove(at))
            })
            .collect(),
    }
}

// ------------------------------------------------------------------------------ sessions

/// Copies a NUL-terminated string owned by ONNX Runtime.
fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-null strings returned by the C API are NUL-terminated and live as long as the
    // session they were read from, which the caller holds.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn check(status: ort_sys::OrtStatusPtr, what: &str) -> Result<()> {
    if status.0.is_null() {
        return Ok(());
    }
    let api = ort::api();
    // SAFETY: a non-null status just returned by ONNX Runtime, read then released once.
    let message = unsafe {
        let m = text((api.GetErrorMessage)(status.0));
        (api.ReleaseStatus)(status.0);
        m
    };
    Err(format!("{what}: {message}"))
}

/// (EP name, domain, op type) of every node of the session's assignment record.
fn assignment(session: &Session) -> Result<Vec<(String, String, String)>> {
    let api = ort::api();
    let mut subgraphs: *const *const ort_sys::OrtEpAssignedSubgraph = std::ptr::null();
    let mut n = 0usize;
    // SAFETY: the session is live; valid out pointers. The record is owned by the session.
    check(
        unsafe { (api.Session_GetEpGraphAssignmentInfo)(session.ptr(), &mut subgraphs, &mut n) },
        "Session_GetEpGraphAssignmentInfo",
    )?;
    let mut out = Vec::new();
    for i in 0..n {
        // SAFETY: ONNX Runtime returned n live subgraphs; every accessor takes a live object and
        // valid out pointers, and the strings are copied at once.
        unsafe {
            let sub = *subgraphs.add(i);
            let mut p: *const c_char = std::ptr::null();
            check((api.EpAssignedSubgraph_GetEpName)(sub, &mut p), "EpAssignedSubgraph_GetEpName")?;
            let ep = text(p);
            let mut nodes: *const *const ort_sys::OrtEpAssignedNode = std::ptr::null();
            let mut count = 0usize;
            check(
                (api.EpAssignedSubgraph_GetNodes)(sub, &mut nodes, &mut count),
                "EpAssignedSubgraph_GetNodes",
            )?;
            for j in 0..count {
                let node = *nodes.add(j);
                check((api.EpAssignedNode_GetDomain)(node, &mut p), "EpAssignedNode_GetDomain")?;
                let domain = text(p);
                check(
                    (api.EpAssignedNode_GetOperatorType)(node, &mut p),
                    "EpAssignedNode_GetOperatorType",
                )?;
                out.push((ep.clone(), domain, text(p)));
            }
        }
    }
    Ok(out)
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum PathKind {
    Cpu,
    Mlu,
}

impl std::fmt::Display for PathKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PathKind::Cpu => "cpu",
            PathKind::Mlu => "mlu",
        })
    }
}

/// What one session ran: the `mluops` op types of its nodes, on any EP and on the MLU EP.
struct Ran {
    mluops: BTreeSet<String>,
    on_mlu: BTreeSet<String>,
}

/// Runs one model on one path once.
fn run_model(
    env: &Environment,
    lib: &Path,
    data: &Path,
    model: &Model,
    path: PathKind,
) -> Result<Ran> {
    let opt =
        |e: ort::Error<ort::session::builder::SessionBuilder>| format!("session options: {e}");
    let mut builder = Session::builder(env)
        .map_err(|e| format!("session builder: {e}"))?
        .with_log_level(LogLevel::Error)
        .map_err(opt)?
        .with_intra_threads(1)
        .map_err(opt)?
        .with_inter_threads(1)
        .map_err(opt)?
        .with_parallel_execution(false)
        .map_err(opt)?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(opt)?
        // Every tensor ORT allocates in its own block of exactly its size (no memory-pattern
        // plan, no CPU arena), so memcheck sees the bounds of the buffers our kernels read and
        // write; inside an arena chunk an overrun would land in a neighbour, unseen.
        .with_memory_pattern(false)
        .map_err(opt)?
        .with_config_entry("session.record_ep_graph_assignment_info", "1")
        .map_err(opt)?;
    let api = ort::api();
    // SAFETY: the builder's live OrtSessionOptions.
    check(unsafe { (api.DisableCpuMemArena)(builder.ptr_mut()) }, "DisableCpuMemArena")?;
    let mut builder = match path {
        // PREFER_CPU: the builder's default MAX_EFFICIENCY policy would pick the MLU EP if this
        // process had registered it; the cpu path is the custom-op library alone.
        PathKind::Cpu => builder
            .with_auto_device(AutoDevicePolicy::PreferCPU)
            .map_err(opt)?
            .with_operator_library(lib)
            .map_err(opt)?,
        PathKind::Mlu => {
            let devices: Vec<_> = env.devices().filter(|d| d.ep().is_ok_and(|n| n == EP)).collect();
            if devices.is_empty() {
                return Err(format!("{EP} reports no device (is MLU_EP_EMULATE=1?)"));
            }
            builder.with_devices(devices, None).map_err(opt)?
        }
    };
    let mut session = builder.commit_from_file(&model.onnx).map_err(|e| format!("session: {e}"))?;
    // The assignment is recorded when the session is created.
    let placed = assignment(&session)?;
    let on_mlu: BTreeSet<String> =
        placed.iter().filter(|(ep, ..)| ep == EP).map(|(_, _, op)| op.clone()).collect();
    if path == PathKind::Cpu && !on_mlu.is_empty() {
        return Err(format!("nodes on {EP} in a custom-op session: {on_mlu:?}"));
    }

    let dir = data.join(&model.name);
    let mut feeds: Vec<(String, DynTensor)> = Vec::new();
    for input in session.inputs() {
        let npy = read_npy(&dir.join(format!("in.{}.npy", input.name())))?;
        let mut t = DynTensor::new(&Allocator::default(), npy.ty, npy.shape.clone())
            .map_err(|e| format!("input {}: {e}", input.name()))?;
        if !npy.bytes.is_empty() {
            // SAFETY: a CPU tensor just allocated with exactly as many bytes as the .npy holds
            // (its element type and shape are the file's).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    npy.bytes.as_ptr(),
                    t.data_ptr_mut().cast::<u8>(),
                    npy.bytes.len(),
                )
            };
        }
        feeds.push((input.name().to_string(), t));
    }
    let names: Vec<String> = session.outputs().iter().map(|o| o.name().to_string()).collect();

    let mut outputs = session.run(feeds).map_err(|e| format!("run: {e}"))?;
    let mut failures = Vec::new();
    for name in &names {
        let value =
            outputs.remove(name.as_str()).ok_or_else(|| format!("output {name} missing"))?;
        let t =
            value.downcast::<DynTensorValueType>().map_err(|e| format!("output {name}: {e}"))?;
        let ty = *t.data_type();
        let shape: Vec<i64> = t.shape().to_vec();
        let len = shape.iter().product::<i64>() as usize * element_size(ty);
        let bytes = if len == 0 {
            Vec::new()
        } else {
            // SAFETY: a CPU output tensor of `len` bytes, alive while `t` is.
            unsafe { std::slice::from_raw_parts(t.data_ptr().cast::<u8>(), len) }.to_vec()
        };
        let got = Npy { ty, shape, bytes };
        let want = read_npy(&dir.join(format!("out.{name}.npy")))?;
        let tol = match &model.outputs {
            Some(list) => match list.iter().find(|(n, _)| n == name) {
                Some((_, t)) => t,
                None => return Err(format!("output {name} has no tolerance in zoo.json")),
            },
            None if matches!(
                ty,
                TensorElementType::Float32
                    | TensorElementType::Float16
                    | TensorElementType::Float64
            ) =>
            {
                &Tolerance::Accumulating { diff1: DEMO_TOLERANCE, diff2: DEMO_TOLERANCE }
            }
            None => &Tolerance::Exact,
        };
        if let Some(why) = compare(&got, &want, tol) {
            failures.push(format!("{name}: {why}"));
        }
    }
    if !failures.is_empty() {
        return Err(failures.join("; "));
    }

    let mluops = placed.iter().filter(|(_, d, _)| d == "mluops").count();
    println!(
        "    {} nodes, {mluops} mluops; on {EP}: {}",
        placed.len(),
        if on_mlu.is_empty() {
            "none".to_string()
        } else {
            on_mlu.iter().cloned().collect::<Vec<_>>().join(", ")
        }
    );
    let mluops =
        placed.iter().filter(|(_, d, _)| d == "mluops").map(|(_, _, op)| op.clone()).collect();
    Ok(Ran { mluops, on_mlu })
}

// ------------------------------------------------------------------------------ main

struct Args {
    data: PathBuf,
    paths: Vec<PathKind>,
    models: Option<Vec<String>>,
    lib: Option<PathBuf>,
}

fn args() -> Result<Args> {
    let mut a = Args {
        data: PathBuf::new(),
        paths: vec![PathKind::Cpu, PathKind::Mlu],
        models: None,
        lib: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--data" => a.data = PathBuf::from(value()?),
            "--lib" => a.lib = Some(PathBuf::from(value()?)),
            "--models" => {
                a.models =
                    Some(value()?.split(',').filter(|s| !s.is_empty()).map(String::from).collect())
            }
            "--paths" => {
                a.paths = value()?
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|p| match p {
                        "cpu" => Ok(PathKind::Cpu),
                        "mlu" => Ok(PathKind::Mlu),
                        _ => Err(format!("--paths takes cpu and/or mlu, got {p}")),
                    })
                    .collect::<Result<_>>()?
            }
            _ => {
                return Err(format!(
                    "unknown argument {flag} (usage: --data DIR [--paths cpu,mlu] [--models a,b] [--lib PATH])"
                ));
            }
        }
    }
    if a.data.as_os_str().is_empty() {
        return Err("--data DIR (the unpacked .npz files) is required".into());
    }
    Ok(a)
}

fn library(arg: Option<PathBuf>) -> Result<PathBuf> {
    let lib = match arg.or_else(|| std::env::var_os("MLU_EP_LIB").map(PathBuf::from)) {
        Some(p) => p,
        None => {
            // target/<profile>/examples/valgrind_sessions -> target/<profile>/
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            exe.parent()
                .and_then(Path::parent)
                .ok_or("no profile directory")?
                .join("libonnxruntime_ep_mlu.so")
        }
    };
    if !lib.is_file() {
        return Err(format!(
            "library under test not found at {} (cargo build --release --lib, or --lib / MLU_EP_LIB)",
            lib.display()
        ));
    }
    std::fs::canonicalize(&lib).map_err(|e| format!("{}: {e}", lib.display()))
}

fn main() -> ExitCode {
    match real_main() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("valgrind_sessions: {e}");
            ExitCode::from(1)
        }
    }
}

fn real_main() -> Result<bool> {
    let args = args()?;
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lib = library(args.lib)?;
    let models = models(&repo, args.models.as_deref())?;
    let mlu = args.paths.contains(&PathKind::Mlu);
    if mlu && std::env::var("MLU_EP_EMULATE").as_deref() != Ok("1") {
        // SAFETY: single-threaded here: nothing has been loaded or spawned yet.
        unsafe { std::env::set_var("MLU_EP_EMULATE", "1") };
    }
    if std::env::var_os("ORT_DISABLE_TELEMETRY").is_none() {
        // The onnxruntime 1.31 Linux wheel starts a 1DS telemetry worker thread in CreateEnv
        // (offline storage in ~/.cache/Microsoft/DeveloperTools/.onnxruntime, uploads to
        // mobile.events.data.microsoft.com) that outlives ReleaseEnv and, at process exit,
        // can read a string ORT's static destructors already freed: a use-after-free in ORT
        // whose report depends on thread scheduling. Not our code; off for a clean signal.
        // SAFETY: single-threaded here: nothing has been loaded or spawned yet.
        unsafe { std::env::set_var("ORT_DISABLE_TELEMETRY", "1") };
    }
    let ort_path = std::env::var("ORT_DYLIB_PATH")
        .map_err(|_| "ORT_DYLIB_PATH is not set (source scripts/setup.sh)".to_string())?;
    let env = ort::init_from(&ort_path)
        .map_err(|e| format!("cannot load ONNX Runtime from {ort_path}: {e}"))?
        .with_name("valgrind_sessions")
        .build()
        .map_err(|e| format!("environment: {e}"))?;
    if mlu {
        env.register_ep_library("onnxruntime_ep_mlu", &lib)
            .map_err(|e| format!("RegisterExecutionProviderLibrary({}): {e}", lib.display()))?;
    }
    println!("library {}", lib.display());

    let mut ok = true;
    for &path in &args.paths {
        let (mut ran, mut ran_on_mlu) = (BTreeSet::new(), BTreeSet::new());
        for model in &models {
            println!("{path} {}", model.name);
            match run_model(&env, &lib, &args.data, model, path) {
                Ok(r) => {
                    ran.extend(r.mluops);
                    ran_on_mlu.extend(r.on_mlu);
                }
                Err(e) => {
                    println!("    FAIL {e}");
                    ok = false;
                }
            }
        }
        // With every model (no --models): each operator of the registry ran in a session of
        // this path, and on `mlu` each the BANG backend runs (the provider's `auto` without an
        // MLU-OPS library) on the MLU EP.
        if args.models.is_none() {
            let missing: Vec<&str> =
                ops::ALL.iter().map(|e| e.name).filter(|op| !ran.contains(*op)).collect();
            if !missing.is_empty() {
                println!("FAIL {path}: no session ran {}", missing.join(", "));
                ok = false;
            }
            let missing: Vec<&str> = ops::ALL
                .iter()
                .filter(|e| e.card_backends.contains(&Backend::Bang))
                .map(|e| e.name)
                .filter(|op| !ran_on_mlu.contains(*op))
                .collect();
            if path == PathKind::Mlu && !missing.is_empty() {
                println!("FAIL never ran on {EP}: {}", missing.join(", "));
                ok = false;
            }
        }
        println!(
            "{path}: operators run: {}; on {EP}: {}",
            ran.iter().cloned().collect::<Vec<_>>().join(", "),
            if ran_on_mlu.is_empty() {
                "none".to_string()
            } else {
                ran_on_mlu.iter().cloned().collect::<Vec<_>>().join(", ")
            }
        );
    }
    // Releasing the environment releases the EP library (its factories, then dlclose), so its
    // teardown runs under valgrind too.
    drop(env);
    println!("{}", if ok { "all sessions OK" } else { "FAILED" });
    Ok(ok)
}
