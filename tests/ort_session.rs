//! ONNX Runtime sessions driven from Rust through the `ort` crate (2.0.0-rc.15, load-dynamic):
//! the error/edge table of tests/cases/errors.json (shared with tests/python/test_errors.py)
//! and a few valid runs, each through a single-node model built with `onnx-protobuf`.
//!
//! ONNX Runtime is loaded from ORT_DYLIB_PATH, else from .venv's onnxruntime wheel
//! (`common::ort_dylib_path`; scripts/setup.sh installs it); the library
//! under test is MLU_EP_LIB, else the cdylib next to this test executable
//! (target/<profile>/libonnxruntime_ep_mlu.so), registered with
//! `SessionBuilder::with_operator_library` (RegisterCustomOpsLibrary_V2). Nothing is skipped:
//! a missing runtime or library fails every test with a message saying what to do.

use half::f16;
use onnx_protobuf::AttributeProto;
use onnx_protobuf::tensor_proto::DataType;
use ort::environment::Environment;
use ort::logging::LogLevel;
use ort::memory::Allocator;
use ort::session::Session;
use ort::value::{DynTensor, DynTensorValueType, TensorElementType};
use ort::{Error, ErrorCode};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::sync::OnceLock;
mod common;
use common::{Rng, library};
use onnxruntime_ep_mlu::ops;

#[path = "../models/onnx_builder.rs"]
mod onnx_builder;
use onnx_builder::{Dim, Graph, attr_float, attr_int, attr_ints, attr_string};

const DOMAIN: &str = "mluops";

// ------------------------------------------------------------------------------ environment

fn environment() -> &'static Environment {
    static ENV: OnceLock<Environment> = OnceLock::new();
    ENV.get_or_init(|| {
        let path = common::ort_dylib_path();
        ort::init_from(&path)
            .unwrap_or_else(|e| panic!("cannot load ONNX Runtime from {}: {e}", path.display()))
            .with_name("ort_session_tests")
            .build()
            .unwrap_or_else(|e| panic!("cannot create the ONNX Runtime environment: {e}"))
    })
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

// ------------------------------------------------------------------------------ data

#[derive(Clone, Copy, Debug, PartialEq)]
enum DType {
    F32,
    F16,
    F64,
    I32,
    I64,
}

impl DType {
    fn parse(s: &str) -> DType {
        match s {
            "float32" => DType::F32,
            "float16" => DType::F16,
            "float64" => DType::F64,
            "int32" => DType::I32,
            "int64" => DType::I64,
            _ => panic!("unknown dtype {s}"),
        }
    }
    fn from_onnx(s: &str) -> Option<DType> {
        Some(match s {
            "tensor(float)" => DType::F32,
            "tensor(float16)" => DType::F16,
            "tensor(int32)" => DType::I32,
            "tensor(int64)" => DType::I64,
            _ => return None,
        })
    }
    fn onnx(self) -> DataType {
        match self {
            DType::F32 => DataType::FLOAT,
            DType::F16 => DataType::FLOAT16,
            DType::F64 => DataType::DOUBLE,
            DType::I32 => DataType::INT32,
            DType::I64 => DataType::INT64,
        }
    }
    fn ort(self) -> TensorElementType {
        match self {
            DType::F32 => TensorElementType::Float32,
            DType::F16 => TensorElementType::Float16,
            DType::F64 => TensorElementType::Float64,
            DType::I32 => TensorElementType::Int32,
            DType::I64 => TensorElementType::Int64,
        }
    }
    fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::F64)
    }
}

/// A host tensor: values kept as f64 (exact for every int32 and for the table's int64 and
/// float values), written in the tensor's own dtype when fed.
#[derive(Clone, Debug)]
struct HostTensor {
    dtype: DType,
    shape: Vec<i64>,
    values: Vec<f64>,
}

impl HostTensor {
    fn new(dtype: DType, shape: &[i64], values: Vec<f64>) -> Self {
        assert_eq!(
            values.len() as i64,
            shape.iter().product::<i64>(),
            "{} values for shape {shape:?}",
            values.len()
        );
        HostTensor { dtype, shape: shape.to_vec(), values }
    }

    fn to_ort(&self) -> DynTensor {
        let mut t = DynTensor::new(&Allocator::default(), self.dtype.ort(), self.shape.clone())
            .unwrap_or_else(|e| {
                panic!("cannot allocate a {:?} tensor {:?}: {e}", self.dtype, self.shape)
            });
        if self.values.is_empty() {
            return t;
        }
        let p = t.data_ptr_mut();
        // SAFETY: the tensor was just allocated on CPU with `values.len()` elements of `dtype`.
        unsafe {
            match self.dtype {
                DType::F32 => write(p.cast::<f32>(), self.values.iter().map(|&v| v as f32)),
                DType::F16 => {
                    write(p.cast::<u16>(), self.values.iter().map(|&v| f16::from_f64(v).to_bits()))
                }
                DType::F64 => write(p.cast::<f64>(), self.values.iter().copied()),
                DType::I32 => write(p.cast::<i32>(), self.values.iter().map(|&v| v as i32)),
                DType::I64 => write(p.cast::<i64>(), self.values.iter().map(|&v| v as i64)),
            }
        }
        t
    }

    fn from_ort(value: ort::value::DynValue) -> HostTensor {
        let t = value.downcast::<DynTensorValueType>().expect("output is a tensor");
        let shape: Vec<i64> = t.shape().to_vec();
        let n: usize = shape.iter().map(|&d| d as usize).product();
        let dtype = match t.data_type() {
            TensorElementType::Float32 => DType::F32,
            TensorElementType::Float16 => DType::F16,
            TensorElementType::Int32 => DType::I32,
            TensorElementType::Int64 => DType::I64,
            other => panic!("unexpected output type {other:?}"),
        };
        let p = t.data_ptr();
        // SAFETY: a CPU output tensor of `n` elements of `dtype`, alive while `t` is.
        let values = unsafe {
            match dtype {
                DType::F32 => read(p.cast::<f32>(), n, |v| v as f64),
                DType::F16 => read(p.cast::<u16>(), n, |v| f16::from_bits(v).to_f64()),
                DType::I32 => read(p.cast::<i32>(), n, |v| v as f64),
                DType::I64 => read(p.cast::<i64>(), n, |v| v as f64),
                DType::F64 => unreachable!(),
            }
        };
        HostTensor { dtype, shape, values }
    }
}

/// # Safety
/// `p` must have room for every item of `it`.
unsafe fn write<T>(p: *mut T, it: impl Iterator<Item = T>) {
    for (i, v) in it.enumerate() {
        // SAFETY: caller contract.
        unsafe { p.add(i).write(v) };
    }
}

/// # Safety
/// `p` must point to `n` initialised elements (or `n` must be 0).
unsafe fn read<T: Copy>(p: *const T, n: usize, f: impl Fn(T) -> f64) -> Vec<f64> {
    if n == 0 || p.is_null() {
        return Vec::new();
    }
    // SAFETY: caller contract.
    unsafe { std::slice::from_raw_parts(p, n) }.iter().map(|&v| f(v)).collect()
}

fn number(v: &Value) -> f64 {
    match v {
        Value::Number(n) => n.as_f64().expect("number"),
        Value::String(s) => match s.as_str() {
            "nan" => f64::NAN,
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            _ => panic!("unknown number {s}"),
        },
        _ => panic!("not a number: {v}"),
    }
}

/// The values an errors.json data spec describes: a flat list, {"fill": v} or {"arange": [start, step]}.
fn materialize(data: &Value, shape: &[i64]) -> Vec<f64> {
    let n = shape.iter().product::<i64>() as usize;
    match data {
        Value::Array(items) => items.iter().map(number).collect(),
        Value::Object(spec) => {
            if let Some(v) = spec.get("fill") {
                vec![number(v); n]
            } else if let Some(Value::Array(a)) = spec.get("arange") {
                let (start, step) = (number(&a[0]), number(&a[1]));
                (0..n).map(|i| start + step * i as f64).collect()
            } else {
                panic!("unknown data generator {data}")
            }
        }
        _ => panic!("bad data spec {data}"),
    }
}

fn shape_of(v: &Value) -> Vec<i64> {
    v.as_array().expect("shape").iter().map(|d| d.as_i64().expect("dim")).collect()
}

// ------------------------------------------------------------------------------ models

struct Schema {
    json: Value,
}

impl Schema {
    fn load(op: &str) -> Schema {
        let dir = repo().join("schemas");
        let families =
            std::fs::read_dir(&dir).expect("schemas/").map(|f| f.expect("family").path());
        for path in families.flat_map(|f| std::fs::read_dir(f).expect("schemas/<family>/")) {
            let text = std::fs::read_to_string(path.expect("entry").path()).expect("schema file");
            let json: Value = serde_json::from_str(&text).expect("schema json");
            if json["op_type"] == op {
                return Schema { json };
            }
        }
        panic!("no schema for {op} in {}", dir.display())
    }

    /// (name, dtype) of each output; a type constraint takes the dtype of the first input
    /// bound to it when allowed, float32 otherwise.
    fn outputs(&self, inputs: &[(String, HostTensor)]) -> Vec<(String, DType)> {
        let constraints: Vec<(String, Vec<DType>)> = self.json["type_constraints"]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .map(|c| {
                        let allowed = c["allowed_types"].as_array().unwrap().iter();
                        (
                            c["type_str"].as_str().unwrap().to_string(),
                            allowed.filter_map(|a| DType::from_onnx(a.as_str().unwrap())).collect(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let resolve = |type_str: &str| -> DType {
            if let Some(d) = DType::from_onnx(type_str) {
                return d;
            }
            let (_, allowed) = constraints.iter().find(|(t, _)| t == type_str).expect("constraint");
            for formal in self.json["inputs"].as_array().unwrap() {
                if formal["type_str"] == type_str
                    && let Some((_, t)) = inputs.iter().find(|(n, _)| formal["name"] == n.as_str())
                    && allowed.contains(&t.dtype)
                {
                    return t.dtype;
                }
            }
            allowed[0]
        };
        self.json["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                (o["name"].as_str().unwrap().to_string(), resolve(o["type_str"].as_str().unwrap()))
            })
            .collect()
    }

    fn input_names(&self) -> Vec<String> {
        self.json["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap().to_string())
            .collect()
    }
}

/// errors.json typed attribute -> AttributeProto.
fn attribute(name: &str, spec: &Value) -> AttributeProto {
    let (kind, value) = spec.as_object().and_then(|o| o.iter().next()).expect("typed attribute");
    match kind.as_str() {
        "int" => attr_int(name, value.as_i64().expect("int")),
        "ints" => attr_ints(
            name,
            &value
                .as_array()
                .expect("ints")
                .iter()
                .map(|v| v.as_i64().expect("int"))
                .collect::<Vec<_>>(),
        ),
        "float" => attr_float(name, number(value) as f32),
        "string" => attr_string(name, value.as_str().expect("string")),
        _ => panic!("attribute {name}: unknown kind {kind}"),
    }
}

fn model_bytes(
    op: &str,
    attributes: &Map<String, Value>,
    inputs: &[(String, HostTensor)],
    node_name: &str,
) -> Vec<u8> {
    let schema = Schema::load(op);
    let outputs = schema.outputs(inputs);
    let mut g = Graph::new(&format!("single_{op}"));
    for (n, t) in inputs {
        let dims: Vec<Dim> = t.shape.iter().map(|&d| Dim::Fixed(d)).collect();
        g.input(n, t.dtype.onnx(), Some(&dims));
    }
    let input_names: Vec<&str> = inputs.iter().map(|(n, _)| n.as_str()).collect();
    let output_names: Vec<&str> = outputs.iter().map(|(n, _)| n.as_str()).collect();
    g.node(
        node_name,
        op,
        DOMAIN,
        &input_names,
        &output_names,
        attributes.iter().map(|(k, v)| attribute(k, v)).collect(),
    );
    for (n, d) in &outputs {
        g.output(n, d.onnx(), None);
    }
    g.bytes()
}

/// A session of `model` with the library registered. The first call creates one warm-up
/// session before any other: ONNX Runtime adds a custom domain to ONNX's process-wide
/// domain-version map the first time a session uses it, without a lock, so the first sessions
/// created in parallel (libtest runs tests on several threads) can fail with "Trying to add a
/// domain to DomainToVersion map, but the domain is already exist". That race is ONNX
/// Runtime's, not the library's; once the domain is known, parallel creation is safe.
fn session(model: &[u8], threads: Option<usize>) -> Result<Session, Error> {
    static WARM_UP: OnceLock<()> = OnceLock::new();
    WARM_UP.get_or_init(|| {
        let inputs = named(vec![
            ("grad_output", HostTensor::new(DType::F32, &[0, 0, 0], vec![])),
            ("indices", HostTensor::new(DType::I32, &[0, 0, 3], vec![])),
            ("weights", HostTensor::new(DType::F32, &[0, 0, 3], vec![])),
        ]);
        let bytes = model_bytes(
            "ThreeInterpolateBackward",
            &attrs(serde_json::json!({"m": {"int": 0}})),
            &inputs,
            "warm_up",
        );
        // Its outcome is not the point (every test reports its own failures).
        let _ = open_session(&bytes, None);
    });
    open_session(model, threads)
}

fn open_session(model: &[u8], threads: Option<usize>) -> Result<Session, Error> {
    let lib = library();
    let mut builder = Session::builder(environment())?.with_log_level(LogLevel::Fatal)?;
    if let Some(n) = threads {
        builder = builder.with_intra_threads(n)?;
    }
    let mut builder = builder.with_operator_library(&lib)?;
    builder.commit_from_memory(model)
}

fn run(session: &mut Session, inputs: &[(String, HostTensor)]) -> Result<Vec<HostTensor>, Error> {
    let feeds: Vec<(String, DynTensor)> =
        inputs.iter().map(|(n, t)| (n.clone(), t.to_ort())).collect();
    let names: Vec<String> = session.outputs().iter().map(|o| o.name().to_string()).collect();
    let mut outputs = session.run(feeds)?;
    Ok(names
        .iter()
        .map(|n| HostTensor::from_ort(outputs.remove(n.as_str()).expect("output present")))
        .collect())
}

// ------------------------------------------------------------------------------ the table

struct Case {
    json: Value,
}

impl Case {
    fn name(&self) -> &str {
        self.json["name"].as_str().unwrap()
    }
    fn op(&self) -> &str {
        self.json["op"].as_str().unwrap()
    }
    fn node(&self) -> String {
        format!("n_{}", self.name())
    }
    fn inputs(&self) -> Vec<(String, HostTensor)> {
        self.json["inputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| {
                let shape = shape_of(&t["shape"]);
                let values = materialize(&t["data"], &shape);
                let dtype = DType::parse(t["dtype"].as_str().unwrap());
                (t["name"].as_str().unwrap().to_string(), HostTensor::new(dtype, &shape, values))
            })
            .collect()
    }
    fn model(&self) -> Vec<u8> {
        model_bytes(
            self.op(),
            self.json["attributes"].as_object().unwrap(),
            &self.inputs(),
            &self.node(),
        )
    }
    fn strings(&self, key: &str) -> Vec<String> {
        self.json[key]
            .as_array()
            .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
            .unwrap_or_default()
    }
}

fn cases(op: &str, kind: &str) -> Vec<Case> {
    let path = repo().join("tests/cases/errors.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let table: Value = serde_json::from_str(&text).expect("errors.json");
    table["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| c["op"] == op && c["kind"] == kind)
        .map(|c| Case { json: c.clone() })
        .collect()
}

enum Outcome {
    Created(Error),
    Ran(Error),
    Succeeded(Vec<HostTensor>),
}

fn outcome(case: &Case) -> Outcome {
    let mut s = match session(&case.model(), None) {
        Ok(s) => s,
        Err(e) => return Outcome::Created(e),
    };
    match run(&mut s, &case.inputs()) {
        Ok(out) => Outcome::Succeeded(out),
        Err(e) => Outcome::Ran(e),
    }
}

/// None when the case fails as the table says, else what went wrong.
fn check_error_case(case: &Case) -> Option<String> {
    let (phase, err) = match outcome(case) {
        Outcome::Created(e) => ("create", e),
        Outcome::Ran(e) => ("run", e),
        Outcome::Succeeded(out) => {
            let shapes: Vec<_> = out.iter().map(|t| t.shape.clone()).collect();
            return Some(format!("no error; outputs of shapes {shapes:?}"));
        }
    };
    let msg = err.message().to_string();
    let allowed = match case.json["phase"].as_str().unwrap() {
        "create" => phase == "create",
        "run" => phase == "run",
        "either" => true,
        p => panic!("unknown phase {p}"),
    };
    if !allowed {
        return Some(format!("failed at {phase}, table phase is {}: {msg}", case.json["phase"]));
    }
    let missing: Vec<String> =
        case.strings("expect").into_iter().filter(|s| !msg.contains(s.as_str())).collect();
    if !missing.is_empty() {
        return Some(format!("message lacks {missing:?}: {msg}"));
    }
    let any = case.strings("expect_any");
    if !any.is_empty() && !any.iter().any(|s| msg.contains(s.as_str())) {
        return Some(format!("message names none of {any:?}: {msg}"));
    }
    if !msg.contains(&case.node()) {
        return Some(format!("message does not name node {}: {msg}", case.node()));
    }
    if phase == "run"
        && msg.contains(&format!("mluops.{}", case.op()))
        && err.code() != ErrorCode::InvalidArgument
    {
        return Some(format!(
            "library error reported as {:?}, not InvalidArgument: {msg}",
            err.code()
        ));
    }
    None
}

fn close(got: f64, want: f64) -> bool {
    (got.is_nan() && want.is_nan()) || got == want || (got - want).abs() <= 1e-7 + 1e-5 * want.abs()
}

fn check_valid_case(case: &Case) -> Option<String> {
    let outputs = match outcome(case) {
        Outcome::Succeeded(out) => out,
        Outcome::Created(e) => {
            return Some(format!("rejected at session creation: {}", e.message()));
        }
        Outcome::Ran(e) => return Some(format!("rejected at run: {}", e.message())),
    };
    let expected = case.json["outputs"].as_array().unwrap();
    if outputs.len() != expected.len() {
        return Some(format!("{} outputs, expected {}", outputs.len(), expected.len()));
    }
    for (got, exp) in outputs.iter().zip(expected) {
        let name = exp["name"].as_str().unwrap();
        let shape = shape_of(&exp["shape"]);
        if got.shape != shape {
            return Some(format!("{name}: shape {:?}, expected {shape:?}", got.shape));
        }
        if exp.get("data").is_none() {
            continue;
        }
        let want = materialize(&exp["data"], &shape);
        let bad = got
            .values
            .iter()
            .zip(&want)
            .position(|(&g, &w)| if got.dtype.is_float() { !close(g, w) } else { g != w });
        if let Some(i) = bad {
            return Some(format!("{name}[{i}] = {}, expected {}", got.values[i], want[i]));
        }
    }
    None
}

/// What failed among `op`'s `kind` cases (an operator without any fails too).
fn failures(op: &str, kind: &str, check: fn(&Case) -> Option<String>) -> Option<String> {
    let cases = cases(op, kind);
    if cases.is_empty() {
        return Some(format!("{op}: errors.json has no {kind} case"));
    }
    let failures: Vec<String> =
        cases.iter().filter_map(|c| check(c).map(|why| format!("  {}: {why}", c.name()))).collect();
    (!failures.is_empty()).then(|| {
        format!(
            "{} of {} {op} {kind} cases failed:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        )
    })
}

/// `kind`'s cases of every operator of the registry (`ops::ALL`, so an operator added
/// without its cases fails here by name), one thread per operator.
fn report(kind: &str, check: fn(&Case) -> Option<String>) {
    let failed: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = ops::ALL
            .iter()
            .map(|e| (e.name, s.spawn(move || failures(e.name, kind, check))))
            .collect();
        runs.into_iter()
            .filter_map(|(op, run)| {
                run.join().unwrap_or_else(|_| Some(format!("{op}: a {kind} case panicked")))
            })
            .collect()
    });
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn error_rules_are_rejected() {
    report("error", check_error_case);
}

#[test]
fn valid_edges_run() {
    report("valid_edge", check_valid_case);
}

// ------------------------------------------------------------------------------ valid runs

impl Rng {
    fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn named(inputs: Vec<(&str, HostTensor)>) -> Vec<(String, HostTensor)> {
    inputs.into_iter().map(|(n, t)| (n.to_string(), t)).collect()
}

fn attrs(json: Value) -> Map<String, Value> {
    json.as_object().expect("attributes").clone()
}

fn diff1_diff2(got: &[f64], reference: &[f64]) -> (f64, f64) {
    let (mut e1, mut e2, mut b1, mut b2) = (0.0, 0.0, 0.0, 0.0);
    for (&a, &b) in got.iter().zip(reference) {
        e1 += (a - b).abs();
        e2 += (a - b) * (a - b);
        b1 += b.abs();
        b2 += b * b;
    }
    if b1 == 0.0 {
        return if e1 == 0.0 { (0.0, 0.0) } else { (f64::INFINITY, f64::INFINITY) };
    }
    (e1 / b1, (e2 / b2).sqrt())
}

fn three_interpolate_case(dtype: DType, seed: u64) {
    let (b, c, n, m) = (2usize, 5usize, 33usize, 7usize);
    let mut rng = Rng(seed);
    let round =
        |v: f64| if dtype == DType::F16 { f16::from_f64(v).to_f64() } else { v as f32 as f64 };
    let go: Vec<f64> = (0..b * c * n).map(|_| round(rng.uniform() * 2.0 - 1.0)).collect();
    let idx: Vec<f64> = (0..b * n * 3).map(|_| rng.below(m as u64) as f64).collect();
    let w: Vec<f64> = (0..b * n * 3).map(|_| round(rng.uniform())).collect();
    let mut reference = vec![0.0f64; b * c * m];
    for bi in 0..b {
        for ci in 0..c {
            for ni in 0..n {
                for k in 0..3 {
                    let src = idx[(bi * n + ni) * 3 + k] as usize;
                    reference[(bi * c + ci) * m + src] +=
                        go[(bi * c + ci) * n + ni] * w[(bi * n + ni) * 3 + k];
                }
            }
        }
    }
    let inputs = named(vec![
        ("grad_output", HostTensor::new(dtype, &[b as i64, c as i64, n as i64], go)),
        ("indices", HostTensor::new(DType::I32, &[b as i64, n as i64, 3], idx)),
        ("weights", HostTensor::new(dtype, &[b as i64, n as i64, 3], w)),
    ]);
    let bytes = model_bytes(
        "ThreeInterpolateBackward",
        &attrs(serde_json::json!({"m": {"int": m}})),
        &inputs,
        "tib",
    );
    let mut s = session(&bytes, None).unwrap_or_else(|e| panic!("session: {e}"));
    let out = run(&mut s, &inputs).unwrap_or_else(|e| panic!("run: {e}"));
    assert_eq!(out[0].dtype, dtype);
    assert_eq!(out[0].shape, vec![b as i64, c as i64, m as i64]);
    let (d1, d2) = diff1_diff2(&out[0].values, &reference);
    assert!(d1 <= 3e-3 && d2 <= 3e-3, "{dtype:?}: diff1 {d1}, diff2 {d2}");
}

#[test]
fn three_interpolate_backward_float32_run_meets_accumulating_accuracy() {
    three_interpolate_case(DType::F32, 1);
    three_interpolate_case(DType::F32, 2);
}

#[test]
fn three_interpolate_backward_float16_run_meets_accumulating_accuracy() {
    three_interpolate_case(DType::F16, 3);
}

#[test]
fn get_indice_pairs_subm_run_pairs_every_site_with_itself_at_the_centre_offset() {
    // 3x3x3 submanifold conv on a random set of unique sites.
    let (batch, d, h, w) = (2i64, 4i64, 5i64, 6i64);
    let mut rng = Rng(7);
    let mut sites: Vec<[i64; 4]> = Vec::new();
    while sites.len() < 25 {
        let s = [
            rng.below(batch as u64) as i64,
            rng.below(d as u64) as i64,
            rng.below(h as u64) as i64,
            rng.below(w as u64) as i64,
        ];
        if !sites.contains(&s) {
            sites.push(s);
        }
    }
    let l = sites.len();
    let flat: Vec<f64> = sites.iter().flatten().map(|&v| v as f64).collect();
    let inputs =
        named(vec![("indices", HostTensor::new(DType::I32, &[l as i64, 4], flat.clone()))]);
    let a = attrs(serde_json::json!({
        "batch_size": {"int": batch}, "spatial_shape": {"ints": [d, h, w]}, "kernel_size": {"ints": [3, 3, 3]},
        "padding": {"ints": [1, 1, 1]}, "subm": {"int": 1}
    }));
    let bytes = model_bytes("GetIndicePairs", &a, &inputs, "gip");
    let mut s = session(&bytes, None).unwrap_or_else(|e| panic!("session: {e}"));
    let out = run(&mut s, &inputs).unwrap_or_else(|e| panic!("run: {e}"));
    let (pairs, out_indices, num) = (&out[0], &out[1], &out[2]);
    assert_eq!(pairs.shape, vec![27, 2, l as i64]);
    assert_eq!(out_indices.shape, vec![l as i64, 4]);
    assert_eq!(out_indices.values, flat, "subm out_indices must equal indices row for row");
    assert_eq!(num.shape, vec![27]);
    // centre offset k = 13: every site with itself, in input-row order
    assert_eq!(num.values[13], l as f64);
    let centre = &pairs.values[13 * 2 * l..14 * 2 * l];
    let rows: Vec<f64> = (0..l).map(|j| j as f64).collect();
    assert_eq!(&centre[..l], rows.as_slice());
    assert_eq!(&centre[l..], rows.as_slice());
    // every pair is symmetric: (i, o) at offset k  <=>  (o, i) at offset 26 - k
    for k in 0..27 {
        let n_k = num.values[k] as usize;
        let base = k * 2 * l;
        for j in 0..n_k {
            let (i, o) = (pairs.values[base + j], pairs.values[base + l + j]);
            let mirror = (26 - k) * 2 * l;
            let m_n = num.values[26 - k] as usize;
            let found = (0..m_n)
                .any(|q| pairs.values[mirror + q] == o && pairs.values[mirror + l + q] == i);
            assert!(found, "pair ({i}, {o}) at offset {k} has no mirror at {}", 26 - k);
        }
        let unused = pairs.values[base + n_k..base + l]
            .iter()
            .chain(&pairs.values[base + l + n_k..base + 2 * l]);
        assert!(unused.copied().all(|v| v == -1.0), "unused slots of offset {k} are not -1");
    }
}

/// ONNX Runtime tells the kernel info's reader that a node lacks an attribute only by the
/// message text (ORT_FAIL, as for a mistyped one); src/ffi/attributes.rs reads that text in
/// one place, and this pins it for scalar and list attributes: an absent optional attribute
/// takes its schema default, an absent required one is reported missing, a mistyped one is
/// a type error (not a default).
#[test]
fn kernel_info_attribute_reads_tell_absent_from_mistyped() {
    let inputs = named(vec![(
        "indices",
        HostTensor::new(DType::I32, &[2, 4], vec![0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]),
    )]);
    let required = serde_json::json!({"batch_size": {"int": 1}, "spatial_shape": {"ints": [3, 3, 3]}, "kernel_size": {"ints": [3, 3, 3]}});
    let with = |extra: Value| {
        let mut a = attrs(required.clone());
        a.extend(attrs(extra));
        a
    };
    let outputs = |a: &Map<String, Value>, node: &str| {
        let mut s = session(&model_bytes("GetIndicePairs", a, &inputs, node), None)
            .unwrap_or_else(|e| panic!("{node}: {e}"));
        run(&mut s, &inputs)
            .unwrap_or_else(|e| panic!("{node}: {e}"))
            .into_iter()
            .map(|t| (t.shape, t.values))
            .collect::<Vec<_>>()
    };
    let explicit = with(serde_json::json!({
        "stride": {"ints": [1, 1, 1]}, "padding": {"ints": [0, 0, 0]}, "dilation": {"ints": [1, 1, 1]},
        "output_padding": {"ints": [0, 0, 0]}, "subm": {"int": 0}, "transpose": {"int": 0}, "inverse": {"int": 0}
    }));
    assert_eq!(
        outputs(&attrs(required.clone()), "gip_defaults"),
        outputs(&explicit, "gip_explicit")
    );
    let create_error = |a: &Map<String, Value>, node: &str| match session(
        &model_bytes("GetIndicePairs", a, &inputs, node),
        None,
    ) {
        Ok(_) => panic!("{node}: the session was created"),
        Err(e) => e.message().to_owned(),
    };
    for (absent, node) in
        [("batch_size", "gip_no_batch_size"), ("kernel_size", "gip_no_kernel_size")]
    {
        let mut a = attrs(required.clone());
        a.remove(absent);
        let msg = create_error(&a, node);
        assert!(
            msg.contains(&format!(
                "node '{node}': attribute '{absent}': required attribute is missing"
            )),
            "{msg}"
        );
    }
    let msg = create_error(&with(serde_json::json!({"subm": {"float": 1.0}})), "gip_float_subm");
    assert!(msg.contains("node 'gip_float_subm': attribute 'subm': expected type Int"), "{msg}");
}

#[test]
fn voxel_pooling_forward_is_bit_identical_with_one_and_four_threads() {
    let (b, n, c, nx, ny) = (2usize, 5000usize, 4usize, 8i64, 8i64);
    let mut rng = Rng(11);
    let geom: Vec<f64> = (0..b * n)
        .flat_map(|_| [rng.below(10) as f64 - 1.0, rng.below(10) as f64 - 1.0, rng.below(2) as f64])
        .collect();
    let feats: Vec<f64> = (0..b * n * c)
        .map(|_| ((rng.uniform() - 0.5) * 10f64.powf(rng.uniform() * 6.0 - 3.0)) as f32 as f64)
        .collect();
    let inputs = named(vec![
        ("geom_xyz", HostTensor::new(DType::I32, &[b as i64, n as i64, 3], geom)),
        ("input_features", HostTensor::new(DType::F32, &[b as i64, n as i64, c as i64], feats)),
    ]);
    let bytes = model_bytes(
        "VoxelPoolingForward",
        &attrs(serde_json::json!({"voxel_num": {"ints": [nx, ny, 1]}})),
        &inputs,
        "vpf",
    );
    let mut results = Vec::new();
    for threads in [1usize, 4] {
        let mut s = session(&bytes, Some(threads)).unwrap_or_else(|e| panic!("session: {e}"));
        let out = run(&mut s, &inputs).unwrap_or_else(|e| panic!("run: {e}"));
        assert_eq!(out[0].shape, vec![b as i64, ny, nx, c as i64]);
        results.push(out);
    }
    let bits = |t: &HostTensor| t.values.iter().map(|v| (*v as f32).to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&results[0][0]),
        bits(&results[1][0]),
        "output_features differ between 1 and 4 threads"
    );
    assert_eq!(
        results[0][1].values, results[1][1].values,
        "pos_memo differs between 1 and 4 threads"
    );
}

#[test]
fn float64_feats_is_rejected_as_a_type_error() {
    let inputs = named(vec![
        ("grad_voxel_feats", HostTensor::new(DType::F32, &[2, 2], vec![1.0; 4])),
        ("feats", HostTensor::new(DType::F64, &[3, 2], vec![1.0; 6])),
        ("voxel_feats", HostTensor::new(DType::F32, &[2, 2], vec![1.0; 4])),
        ("point2voxel_map", HostTensor::new(DType::I32, &[3], vec![0.0, 1.0, 0.0])),
        ("voxel_points_count", HostTensor::new(DType::I32, &[2], vec![2.0, 1.0])),
    ]);
    let bytes = model_bytes("DynamicScatterBackward", &Map::new(), &inputs, "dsb_f64");
    let err = match session(&bytes, None) {
        Err(e) => e,
        Ok(mut s) => match run(&mut s, &inputs) {
            Err(e) => e,
            Ok(_) => panic!("float64 feats was accepted"),
        },
    };
    let msg = err.message();
    assert!(msg.contains("feats") && msg.contains("DynamicScatterBackward"), "{msg}");
}

#[test]
fn error_table_inputs_follow_schema_order() {
    let path = repo().join("tests/cases/errors.json");
    let table: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for c in table["cases"].as_array().unwrap() {
        let case = Case { json: c.clone() };
        let formal = Schema::load(case.op()).input_names();
        let names: Vec<String> = case.inputs().into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names.as_slice(),
            &formal[..names.len()],
            "{}: inputs out of schema order",
            case.name()
        );
    }
}
