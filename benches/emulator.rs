//! Launch overhead of the emulated MLU card (kernels/emulator): launches per second of the
//! emulator's smallest self-test kernel (64 floats added in NRAM), launched and synchronised
//! one at a time on one queue, as a BLOCK launch of 1 task, a BLOCK launch of 64 tasks and
//! a UNION1 launch over every core. Run as `cargo bench --bench emulator [-- --launches N]`:
//! without --launches each shape runs for about two seconds; with it, exactly N launches
//! (for callgrind, whose instruction counts do not depend on the machine's load).

use onnxruntime_ep_mlu::mlu::{Device, TASK_BLOCK, TASK_UNION1};
use std::time::{Duration, Instant};

#[path = "../tests/common/selftest.rs"]
mod selftest;

use selftest::{bang_emu_selftest_f32, op};

const N: usize = 64;

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` only builds and starts it.
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        println!("benches/emulator.rs: run with `cargo bench --bench emulator`");
        return;
    }
    let launches: Option<u64> = args
        .iter()
        .position(|a| a == "--launches")
        .map(|i| args.get(i + 1).and_then(|n| n.parse().ok()).expect("--launches N"));
    let dev = Device::emulated().expect("emulated card");
    let cores = dev.info.clusters * dev.info.cores_per_cluster;
    let a = dev.upload(&[1.0f32; N]).unwrap();
    let out = dev.upload(&[0.0f32; N]).unwrap();
    let q = dev.queue().unwrap();
    println!(
        "emulated card: {} clusters of {} cores",
        dev.info.clusters, dev.info.cores_per_cluster
    );
    for (shape, tasks, task_type) in [
        ("BLOCK, 1 task", 1, TASK_BLOCK),
        ("BLOCK, 64 tasks", 64, TASK_BLOCK),
        ("UNION1, every core", cores, TASK_UNION1),
    ] {
        let launch = || {
            // SAFETY: `a` and `out` are device buffers of N floats.
            let code = unsafe {
                bang_emu_selftest_f32(
                    q.ptr(),
                    tasks,
                    task_type,
                    op("add"),
                    N as i64,
                    0,
                    0.0,
                    a.ptr(),
                    a.ptr(),
                    out.ptr(),
                )
            };
            q.launched("selftest", code).unwrap();
            q.sync().unwrap();
        };
        launch();
        let start = Instant::now();
        let mut done = 0u64;
        while launches.map_or(start.elapsed() < Duration::from_secs(2), |n| done < n) {
            launch();
            done += 1;
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{shape:<20} {done:>7} launches in {secs:6.3} s: {:>8.0} launches/s",
            done as f64 / secs
        );
    }
}
