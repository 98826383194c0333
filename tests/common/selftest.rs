//! The emulator self-test kernels' C entry points (kernels/emulator/selftest.cc, linked into
//! the library by build.rs) and their op codes, declared once for tests/emulator.rs and
//! benches/emulator.rs, which take this file by `#[path]` (each uses part of it).
#![allow(dead_code)]

use onnxruntime_ep_mlu::mlu::QueuePtr;

/// The element-wise entry of one element type: queue, task_dim, task_type, op, n, m,
/// scalar, a, b, out.
pub type Entry<T> =
    unsafe extern "C" fn(QueuePtr, u32, i32, i32, i64, i64, T, *const T, *const T, *mut T) -> i32;

unsafe extern "C" {
    pub fn bang_emu_selftest_f32(
        q: QueuePtr,
        task_dim: u32,
        task_type: i32,
        op: i32,
        n: i64,
        m: i64,
        scalar: f32,
        a: *const f32,
        b: *const f32,
        out: *mut f32,
    ) -> i32;
    pub fn bang_emu_selftest_i32(
        q: QueuePtr,
        task_dim: u32,
        task_type: i32,
        op: i32,
        n: i64,
        m: i64,
        scalar: i32,
        a: *const i32,
        b: *const i32,
        out: *mut i32,
    ) -> i32;
    pub fn bang_emu_selftest_broken(
        q: QueuePtr,
        task_dim: u32,
        task_type: i32,
        rule: i32,
        buf: *mut f32,
        n: i64,
    ) -> i32;
    pub fn bang_emu_selftest_nram_over_budget(q: QueuePtr, buf: *mut f32) -> i32;
    pub fn bang_emu_selftest_fresh(
        q: QueuePtr,
        task_dim: u32,
        task_type: i32,
        src: *const f32,
        out: *mut f32,
        n: i64,
    ) -> i32;
    pub fn bang_emu_selftest_order(
        q: QueuePtr,
        task_dim: u32,
        task_type: i32,
        tickets: *mut i32,
    ) -> i32;
}

// Op codes of selftest.cc, in its order; the first 12 are element-wise.
pub const OPS: [&str; 17] = [
    "add",
    "mul",
    "eq",
    "and",
    "minequal",
    "add_scalar",
    "sub_scalar",
    "mul_scalar",
    "ne_scalar",
    "lt_scalar",
    "ge_scalar",
    "write_value",
    "transpose",
    "half_round_trip",
    "atomic_add",
    "atomic_add_value",
    "strided_copy",
];

pub fn op(name: &str) -> i32 {
    OPS.iter().position(|&o| o == name).expect("known op") as i32
}
