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

/// The emulated library opened on the emulated card.
fn library() -> onnxruntime_ep_mlu::error::Result<Arc<mluops::Library>> {
    let _one = OPENING.lock().unwrap_or_else(|e| e.into_inner());
    let path = emulated_library();
    mluops::open(Some(path.to_str().expect("UTF-8 path")), &device())
}

fn backends(order: &'static [Backend]) -> CardBackends {
    CardBackends::new(order).with_mluops(library())
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

fn refs(v: &[Tensor]) -> Vec<Option<&Tensor>> {
    v.iter().map(Some).collect()
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

#[path = "mluops_backend/indice_conv.rs"]
mod indice_conv;
#[path = "mluops_backend/library.rs"]
mod library;
#[path = "mluops_backend/operators.rs"]
mod operators;
#[path = "mluops_backend/psroipool.rs"]
mod psroipool;
