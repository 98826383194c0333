//! The BANG kernels of kernels/ on the card under test (`common::card`: a real MLU card when
//! the Cambricon runtime lists one, else the emulated card, the same sources compiled for
//! the host against kernels/emulator), against the Rust CPU kernels: exact for index
//! outputs and DynamicScatterBackward, the contract's accumulating class otherwise.

use half::f16;
use onnxruntime_ep_mlu::mlu::Device;
use onnxruntime_ep_mlu::ops::device::{BangOperator, run_on_device};
use onnxruntime_ep_mlu::ops::{descriptor, run};
use onnxruntime_ep_mlu::parallel::Threads;
use onnxruntime_ep_mlu::schema::AttrValue;
use onnxruntime_ep_mlu::tensor::{OwnedData, Tensor};
use std::collections::HashMap;
use std::sync::Arc;
mod common;
use common::{ELEM_REL, ELEM_REL_F16, Rng, assert_accumulating_within, assert_rejects_planted};

/// The card under test: the emulated one unless a real card is present (common::card).
fn device() -> Arc<Device> {
    common::card()
}

/// Full network scale when MLU_EP_FULL_SCALE=1, else the reduced size.
fn scale(full: usize, reduced: usize) -> usize {
    if std::env::var("MLU_EP_FULL_SCALE").as_deref() == Ok("1") { full } else { reduced }
}

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as u64) as i64
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
}

/// Runs `op` on CPU and on the card under test.
fn both<O: BangOperator + Clone>(op: &O, inputs: &[Option<&Tensor>]) -> (Vec<Tensor>, Vec<Tensor>) {
    let cpu = run(op, inputs, &Threads(2)).expect("CPU kernel runs");
    let mlu = run_on_device(&device(), op, inputs).expect("BANG kernels run on the card");
    assert_eq!(cpu.len(), mlu.len());
    for (c, m) in cpu.iter().zip(&mlu) {
        assert_eq!(c.shape, m.shape, "output shapes");
    }
    (cpu, mlu)
}

fn assert_exact(cpu: &Tensor, mlu: &Tensor, what: &str) {
    match (&cpu.data, &mlu.data) {
        (OwnedData::I32(a), OwnedData::I32(b)) => {
            if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
                panic!("{what}[{i}]: CPU {} MLU {}", a[i], b[i]);
            }
        }
        (OwnedData::F32(a), OwnedData::F32(b)) => {
            if let Some(i) = (0..a.len()).find(|&i| a[i].to_bits() != b[i].to_bits()) {
                panic!("{what}[{i}]: CPU {} MLU {}", a[i], b[i]);
            }
        }
        _ => panic!("{what}: dtype"),
    }
}

/// An accumulating output of the CPU and the card as the judge takes it, with its E.
fn judged(cpu: &Tensor, mlu: &Tensor, what: &str) -> (Vec<f32>, Vec<f64>, f64) {
    match (&cpu.data, &mlu.data) {
        (OwnedData::F32(a), OwnedData::F32(b)) => {
            (b.clone(), a.iter().map(|&v| v as f64).collect(), ELEM_REL)
        }
        (OwnedData::F16(a), OwnedData::F16(b)) => (
            b.iter().map(|v| v.to_f32()).collect(),
            a.iter().map(|v| v.to_f64()).collect(),
            ELEM_REL_F16,
        ),
        _ => panic!("{what}: dtype"),
    }
}

fn assert_close(cpu: &Tensor, mlu: &Tensor, what: &str) {
    let (got, want, elem_rel) = judged(cpu, mlu, what);
    assert_accumulating_within(&got, &want, elem_rel, what);
}

/// One wrong element planted in the card's network-scale output fails the judge.
fn assert_planted_rejected(cpu: &Tensor, mlu: &Tensor, what: &str) {
    let (got, want, elem_rel) = judged(cpu, mlu, what);
    assert_rejects_planted(&got, &want, elem_rel, what);
}

#[path = "bang_kernels/bad_input.rs"]
mod bad_input;
#[path = "bang_kernels/dynamic_scatter.rs"]
mod dynamic_scatter;
#[path = "bang_kernels/dynamic_scatter_backward.rs"]
mod dynamic_scatter_backward;
#[path = "bang_kernels/fuzz.rs"]
mod fuzz;
#[path = "bang_kernels/get_indice_pairs.rs"]
mod get_indice_pairs;
#[path = "bang_kernels/psroipool_backward.rs"]
mod psroipool_backward;
#[path = "bang_kernels/three_interpolate_backward.rs"]
mod three_interpolate_backward;
#[path = "bang_kernels/voxel_pooling_forward.rs"]
mod voxel_pooling_forward;
