//! Self-tests of the BANG host emulator (kernels/emulator): every intrinsic the kernels
//! use against a scalar definition, and every enforced rule caught, with kernel, task and
//! source line, by a deliberately broken kernel (kernels/emulator/selftest.cc).

use onnxruntime_ep_mlu::mlu::{
    Device, NRAM_BUDGET, TASK_BLOCK, TASK_UNION1, TASK_UNION2, kernel_nram_budget,
};
use std::sync::Arc;

#[path = "common/selftest.rs"]
mod selftest;

use selftest::{
    Entry, OPS, bang_emu_selftest_broken, bang_emu_selftest_f32, bang_emu_selftest_fresh,
    bang_emu_selftest_i32, bang_emu_selftest_nram_over_budget, bang_emu_selftest_order, op,
};

/// The emulator mode `name` is set to `value` (kernels/README.md, "Modes").
fn mode(name: &str, value: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == value)
}

fn device() -> Arc<Device> {
    Device::emulated().expect("emulated card")
}

/// Scalar definition of the element-wise ops (1/0 for comparisons and logic).
#[allow(clippy::too_many_arguments)]
fn scalar_def<T: Copy + PartialOrd + Default + std::fmt::Debug>(
    name: &str,
    x: T,
    y: T,
    s: T,
    one: T,
    add: fn(T, T) -> T,
    sub: fn(T, T) -> T,
    mul: fn(T, T) -> T,
) -> Option<T> {
    let z = T::default();
    let b = |c: bool| if c { one } else { z };
    Some(match name {
        "add" => add(x, y),
        "mul" => mul(x, y),
        "eq" => b(x == y),
        "and" => b(x != z && y != z),
        "minequal" => {
            if x < y {
                x
            } else {
                y
            }
        }
        "add_scalar" => add(x, s),
        "sub_scalar" => sub(x, s),
        "mul_scalar" => mul(x, s),
        "ne_scalar" => b(x != s),
        "lt_scalar" => b(x < s),
        "ge_scalar" => b(x >= s),
        "write_value" => s,
        _ => return None,
    })
}

/// One element-wise self-test launch (`entry`, the float32 or int32 entry of selftest.cc) of
/// op `name` over `tasks` UNION1 tasks, from host inputs to the downloaded output.
#[allow(clippy::too_many_arguments)]
fn run<T: Copy + Default>(
    entry: Entry<T>,
    name: &str,
    tasks: u32,
    n: usize,
    m: usize,
    s: T,
    a: &[T],
    b: &[T],
    out0: &[T],
) -> Vec<T> {
    let dev = device();
    let (da, db, dout) =
        (dev.upload(a).unwrap(), dev.upload(b).unwrap(), dev.upload(out0).unwrap());
    let q = dev.queue().unwrap();
    // SAFETY: device buffers of n elements (out0's length for out).
    let code = unsafe {
        entry(
            q.ptr(),
            tasks,
            TASK_UNION1,
            op(name),
            n as i64,
            m as i64,
            s,
            da.ptr(),
            db.ptr(),
            dout.ptr(),
        )
    };
    assert_eq!(code, 0, "launch {name}");
    q.sync().unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut out = vec![T::default(); out0.len()];
    dev.download(&dout, &mut out).unwrap();
    out
}

const N: usize = 64;

fn inputs_f32() -> (Vec<f32>, Vec<f32>) {
    // Values with ties, zeros, signed zeros, NaN and infinities.
    let pool = [0.0, -0.0, 1.0, -1.5, 2.25, f32::NAN, f32::INFINITY, -3.0];
    let a: Vec<f32> = (0..N).map(|i| pool[i % 8]).collect();
    let b: Vec<f32> = (0..N).map(|i| pool[(i / 8) % 8]).collect();
    (a, b)
}

#[test]
fn elementwise_intrinsics_match_their_scalar_definitions() {
    let (a, b) = inputs_f32();
    let (ai, bi): (Vec<i32>, Vec<i32>) =
        ((0..N as i32).map(|i| i % 7 - 3).collect(), (0..N as i32).map(|i| i % 5 - 2).collect());
    for name in &OPS[..12] {
        let got = run(bang_emu_selftest_f32, name, 4, N, 0, 1.5, &a, &b, &vec![0.0; N]);
        for i in 0..N {
            let want =
                scalar_def(name, a[i], b[i], 1.5, 1.0, |x, y| x + y, |x, y| x - y, |x, y| x * y)
                    .unwrap();
            assert!(
                got[i].to_bits() == want.to_bits() || (got[i].is_nan() && want.is_nan()),
                "{name}[{i}]: {} vs {want} ({}, {})",
                got[i],
                a[i],
                b[i]
            );
        }
        let got = run(bang_emu_selftest_i32, name, 4, N, 0, -2, &ai, &bi, &vec![0; N]);
        for i in 0..N {
            let want =
                scalar_def(name, ai[i], bi[i], -2, 1, |x, y| x + y, |x, y| x - y, |x, y| x * y)
                    .unwrap();
            assert_eq!(got[i], want, "{name} int32 [{i}]");
        }
    }
}

#[test]
fn transpose_conversion_and_copy_intrinsics() {
    let a: Vec<f32> = (0..N).map(|i| i as f32 * 0.5 - 7.0).collect();
    // 16 x 16 transpose of 256 floats.
    let t: Vec<f32> = (0..256).map(|i| i as f32).collect();
    let got = run(bang_emu_selftest_f32, "transpose", 4, 256, 16, 0.0, &t, &t, &vec![0.0; 256]);
    assert!((0..16).all(|h| (0..16).all(|w| got[w * 16 + h] == t[h * 16 + w])));
    // float -> half -> float rounds to nearest even, as half::f16 does.
    let v: Vec<f32> =
        (0..N).map(|i| 1.0 + i as f32 * 0.000_37 - 0.01).chain(std::iter::empty()).collect();
    let got = run(bang_emu_selftest_f32, "half_round_trip", 4, N, 0, 0.0, &v, &v, &vec![0.0; N]);
    assert!((0..N).all(|i| got[i] == half::f16::from_f32(v[i]).to_f32()), "half rounding");
    let got = run(bang_emu_selftest_f32, "strided_copy", 4, N, 0, 0.0, &a, &a, &[0.0; N / 2]);
    assert!((0..N / 2).all(|i| got[i] == a[2 * i]));
}

/// The software binary16 conversions (kernels/emulator/emu_runtime.cc) bit for bit against
/// half::f16 over every half value, every tie between neighbouring halves and the floats on
/// either side of it (subnormals, the normal/subnormal edge, 65504 and the overflow tie
/// included), float subnormals, infinities and NaN payloads of both signs.
#[test]
fn half_conversions_round_to_nearest_even_over_the_whole_range() {
    let mut v: Vec<f32> = Vec::new();
    for h in 0..=u16::MAX {
        v.push(half::f16::from_bits(h).to_f32());
    }
    for h in 0..0x7c00u16 {
        let (lo, hi) = (half::f16::from_bits(h).to_f32(), half::f16::from_bits(h + 1).to_f32());
        // The tie is exact in float32 (12 significant bits).
        let tie = (lo + hi) / 2.0;
        for x in [tie, f32::from_bits(tie.to_bits() - 1), f32::from_bits(tie.to_bits() + 1)] {
            v.extend([x, -x]);
        }
    }
    v.extend([
        f32::from_bits(1),
        1e-40,
        2.0f32.powi(-25),
        2.0f32.powi(-26),
        1e10,
        f32::MAX,
        f32::from_bits(0x7f80_0001),
    ]);
    v.extend([
        f32::from_bits(0xffc0_1234),
        f32::from_bits(0x7fbf_ffff),
        f32::INFINITY,
        f32::NEG_INFINITY,
    ]);
    // Launches of 8192 (a multiple of the 64 halves of one 128-byte vector), zero padded.
    const CHUNK: usize = 8192;
    v.resize(v.len().div_ceil(CHUNK) * CHUNK, 0.0);
    for (c, chunk) in v.chunks(CHUNK).enumerate() {
        let got = run(
            bang_emu_selftest_f32,
            "half_round_trip",
            4,
            CHUNK,
            0,
            0.0,
            chunk,
            chunk,
            &vec![0.0; CHUNK],
        );
        for (i, (&x, g)) in chunk.iter().zip(got).enumerate() {
            let want = half::f16::from_f32(x).to_f32();
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "element {}: {x:e} ({:#010x}) gave {g:e}, half::f16 {want:e}",
                c * CHUNK + i,
                x.to_bits()
            );
        }
    }
}

#[test]
fn atomics_combine_every_task() {
    let a: Vec<f32> = (0..N).map(|i| i as f32).collect();
    let got = run(bang_emu_selftest_f32, "atomic_add", 8, N, 0, 0.0, &a, &a, &vec![0.0; N]);
    assert!((0..N).all(|i| got[i] == 8.0 * a[i]), "atomic add over 8 tasks");
    let got = run(bang_emu_selftest_f32, "atomic_add_value", 8, N, 0, 0.0, &a, &a, &vec![1.0; N]);
    assert!((0..N).all(|i| got[i] == 1.0 + 8.0 * a[i]), "single-value atomic add over 8 tasks");
}

/// Runs broken kernel `rule` and returns the queue's error message.
fn broken(rule: i32, tasks: u32, task_type: i32) -> String {
    let dev = device();
    let buf = dev.upload(&[1.0f32; 256]).unwrap();
    let q = dev.queue().unwrap();
    // SAFETY: `buf` is a device buffer of 256 floats; the kernel breaks emulator rules only.
    let code = unsafe { bang_emu_selftest_broken(q.ptr(), tasks, task_type, rule, buf.ptr(), 256) };
    assert_eq!(code, 0, "launch");
    q.sync().expect_err("the broken rule is caught").to_string()
}

fn assert_caught(rule: i32, tasks: u32, task_type: i32, words: &[&str]) {
    let msg = broken(rule, tasks, task_type);
    assert!(msg.contains("kernel 'MLUKernelSelftestBroken' task"), "names kernel and task: {msg}");
    assert!(msg.contains("selftest.cc:"), "names the source line: {msg}");
    for w in words {
        assert!(msg.contains(w), "expected '{w}' in: {msg}");
    }
}

#[test]
fn every_enforced_rule_is_caught() {
    let b = TASK_BLOCK;
    let u = TASK_UNION1;
    assert_caught(
        0,
        1,
        b,
        &["NRAM buffer 'one_more'", "does not fit", "MLU370", "128 KB for the stack"],
    );
    assert_caught(1, 4, u, &["SRAM buffer 'big_sram'", "does not fit"]);
    assert_caught(2, 1, b, &["WRAM buffer 'big_wram'", "does not fit"]);
    assert_caught(3, 1, b, &["BLOCK tasks have no cluster SRAM"]);
    assert_caught(4, 1, b, &["__bang_add", "not 64-byte aligned"]);
    assert_caught(5, 1, b, &["__bang_add", "element count 10", "multiple of 128 bytes"]);
    assert_caught(6, 1, b, &["__bang_add", "in GDRAM", "must be in NRAM"]);
    assert_caught(7, 1, b, &["GDRAM2NRAM source", "leave the allocated GDRAM buffer"]);
    assert_caught(8, 1, b, &["GDRAM2NRAM destination", "NRAM buffer 'tile'"]);
    assert_caught(9, 1, b, &["direction GDRAM2NRAM", "destination in GDRAM"]);
    assert_caught(10, 1, b, &["size 0 must be positive"]);
    assert_caught(11, 1, b, &["__sync_all_ipu in a BLOCK task"]);
    let msg = broken(12, 4, u);
    assert!(
        msg.contains("barrier") && msg.contains("hang") || msg.contains("can never complete"),
        "{msg}"
    );
    assert_caught(13, 1, b, &["__bang_transpose", "multiple of 64"]);
    assert_caught(14, 1, b, &["in no allocated device buffer"]);
    assert_caught(18, 1, b, &["strides (4, 2147483648)", "int range"]);
}

#[test]
fn the_memory_core_runs_union_kernels_without_nram() {
    // Without the __is_mpu() guard, each cluster's memory core reaches the NRAM buffer.
    for tasks in [4, 8] {
        let msg = broken(16, tasks, TASK_UNION1);
        assert!(
            msg.contains("memory core")
                && msg.contains("nram_buffer")
                && msg.contains("__is_mpu()"),
            "{msg}"
        );
    }
    // BLOCK tasks run on compute cores only.
    let dev = device();
    let buf = dev.upload(&[1.0f32; 256]).unwrap();
    let q = dev.queue().unwrap();
    // SAFETY: `buf` is a device buffer of 256 floats.
    let code = unsafe { bang_emu_selftest_broken(q.ptr(), 1, TASK_BLOCK, 16, buf.ptr(), 256) };
    q.launched("selftest", code).unwrap();
    q.sync().unwrap();
}

#[test]
fn a_union_barrier_reaches_the_clusters_of_its_task_and_no_further() {
    // Only cluster 0's cores meet at __sync_all_ipu. UNION1 over two clusters is two
    // tasks of one cluster each: the barrier completes. UNION2 is one task over both:
    // cluster 1 never arrives, which would hang a card.
    let dev = device();
    let buf = dev.upload(&[1.0f32; 256]).unwrap();
    let q = dev.queue().unwrap();
    // SAFETY: `buf` is a device buffer of 256 floats.
    let code = unsafe { bang_emu_selftest_broken(q.ptr(), 8, TASK_UNION1, 17, buf.ptr(), 256) };
    q.launched("selftest", code).unwrap();
    q.sync().expect("one barrier per cluster under UNION1");
    let msg = broken(17, 8, TASK_UNION2);
    assert!(msg.contains("can never complete") || msg.contains("hang"), "{msg}");
}

#[test]
fn file_scope_nram_is_counted_per_translation_unit() {
    let dev = device();
    let buf = dev.upload(&[1.0f32; 64]).unwrap();
    let q = dev.queue().unwrap();
    // SAFETY: `buf` is a device buffer of 64 floats.
    let code = unsafe { bang_emu_selftest_nram_over_budget(q.ptr(), buf.ptr()) };
    q.launched("selftest", code).unwrap();
    let msg = q.sync().expect_err("two budget-sized buffers in one file").to_string();
    assert!(
        msg.contains("file-scope NRAM of this file totals") && msg.contains("selftest_nram.cc"),
        "{msg}"
    );
}

#[test]
fn async_copies_land_at_the_sync() {
    let dev = device();
    let mut host = [7.0f32; 256];
    let buf = dev.upload(&host).unwrap();
    let q = dev.queue().unwrap();
    // SAFETY: `buf` is a device buffer of 256 floats.
    let code = unsafe { bang_emu_selftest_broken(q.ptr(), 1, TASK_BLOCK, 15, buf.ptr(), 256) };
    assert_eq!(code, 0);
    q.sync().unwrap();
    dev.download(&buf, &mut host).unwrap();
    if mode("MLU_EMU_ASYNC", "early") {
        assert_eq!(host[1], 7.0, "MLU_EMU_ASYNC=early: the copy has landed when it is issued");
    } else {
        assert!(host[1].is_nan(), "read before __sync_io sees the old NRAM content");
    }
    assert_eq!(host[2], 7.0, "read after __sync_io sees the copy");
}

#[test]
fn denormals_follow_mlu_emu_ftz() {
    let tiny = f32::from_bits(1 << 20); // a float32 denormal
    let out = run(bang_emu_selftest_f32, "mul", 4, 64, 1, 0.0, &[tiny; 64], &[1.0; 64], &[0.0; 64]);
    let want = if mode("MLU_EMU_FTZ", "1") { 0.0 } else { tiny };
    assert!(out.iter().all(|&v| v == want), "denormal x 1: {:?}, expected {want:e}", &out[..4]);
}

#[test]
fn task_order_follows_mlu_emu_order() {
    let dev = device();
    let clusters = (dev.info.clusters as usize).max(1);
    for (task_type, tasks) in [(TASK_UNION1, 4 * clusters), (TASK_BLOCK, 8)] {
        let buf = dev.upload(&vec![-1i32; tasks]).unwrap();
        let q = dev.queue().unwrap();
        // SAFETY: `buf` holds one int32 per task.
        let code = unsafe { bang_emu_selftest_order(q.ptr(), tasks as u32, task_type, buf.ptr()) };
        q.launched("selftest", code).unwrap();
        q.sync().unwrap();
        let mut tickets = vec![0i32; tasks];
        dev.download(&buf, &mut tickets).unwrap();
        let mut sorted = tickets.clone();
        sorted.sort();
        assert_eq!(sorted, (0..tasks as i32).collect::<Vec<_>>(), "every task ran once");
        if !mode("MLU_EMU_ORDER", "serial") {
            continue;
        }
        if task_type == TASK_BLOCK {
            let want: Vec<i32> = (0..tasks as i32).rev().collect();
            assert_eq!(tickets, want, "BLOCK tasks one at a time, last first");
        } else {
            // Cluster c (tasks 4c..4c+3) starts after every later cluster has finished.
            for c in 0..clusters {
                let first = tickets[4 * c..4 * c + 4].iter().min().unwrap();
                let want = 4 * (clusters - 1 - c) as i32;
                assert_eq!(
                    *first,
                    want,
                    "cluster {c} runs in place {}: {tickets:?}",
                    clusters - 1 - c
                );
            }
        }
    }
}

#[test]
fn on_chip_memory_written_by_an_earlier_task_reads_as_poison() {
    // The card's arenas are reused: each task or launch re-poisons only what it touched.
    // BLOCK: 64 tasks on at most the card's cores, so most follow a task of the same launch
    // on their core (NRAM, WRAM); UNION1: the second launch finds the cores and SRAM the
    // first wrote. Each task reads its buffers before writing them (selftest.cc).
    const N: usize = 64;
    let dev = device();
    let clusters = (dev.info.clusters as usize).max(1);
    let src = dev.upload(&[1.0f32; N]).unwrap();
    for (task_type, tasks, sram) in [(TASK_BLOCK, 64, 0), (TASK_UNION1, 4 * clusters, clusters)] {
        for launch in 0..2 {
            let len = tasks * 2 * N + sram * N;
            let out = dev.upload(&vec![0.0f32; len]).unwrap();
            let q = dev.queue().unwrap();
            // SAFETY: `src` holds N floats, `out` 2N per task and N per cluster.
            let code = unsafe {
                bang_emu_selftest_fresh(
                    q.ptr(),
                    tasks as u32,
                    task_type,
                    src.ptr(),
                    out.ptr(),
                    N as i64,
                )
            };
            q.launched("selftest", code).unwrap();
            q.sync().unwrap();
            let mut seen = vec![0.0f32; len];
            dev.download(&out, &mut seen).unwrap();
            let fresh = seen.iter().position(|v| v.to_bits() != u32::MAX);
            assert_eq!(
                fresh,
                None,
                "type {task_type}, launch {launch}: element {} of {len} read {} (first NRAM, WRAM per task, then SRAM per cluster)",
                fresh.unwrap_or(0),
                fresh.map_or(0.0, |i| seen[i])
            );
        }
    }
}

#[test]
fn launch_configuration_rules() {
    let dev = device();
    let buf = dev.upload(&[0f32; 256]).unwrap();
    let q = dev.queue().unwrap();
    for (tasks, why) in [(3, "multiple of 4"), (4 * 64, "the card's cores")] {
        // SAFETY: rejected before anything runs.
        let code =
            unsafe { bang_emu_selftest_broken(q.ptr(), tasks, TASK_UNION1, 4, buf.ptr(), 256) };
        let msg = q.launched("selftest", code).expect_err("rejected launch").to_string();
        assert!(msg.contains(why), "{tasks} UNION1 tasks: {msg}");
    }
    q.sync().unwrap();
}

#[test]
fn the_policy_budget_is_the_kernels_budget() {
    assert_eq!(kernel_nram_budget(), NRAM_BUDGET);
    let info = onnxruntime_ep_mlu::mlu::emulator::info().unwrap();
    assert_eq!((info.nram_bytes - info.nram_reserved_bytes) as usize, NRAM_BUDGET);
    assert!(info.emulated && info.arch.contains("MLU370"));
}
