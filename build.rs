//! Builds the BANG kernels of kernels/.
//! - Always: every `.mlu` source plus the emulator runtime, compiled for the host with the
//!   system C++ compiler (C++20, FP contraction off) into a static library linked into
//!   this crate: the emulated MLU card runs these.
//! - When a Cambricon toolkit is present (NEUWARE_HOME with bin/cncc): the same sources
//!   compiled by cncc into `libmluops_kernels_mlu.so`, which the Cambricon runtime path
//!   opens with libloading; its path is baked in as MLUOPS_DEVICE_KERNELS.

use std::path::{Path, PathBuf};
use std::process::Command;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).expect("kernels/ is readable").flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "mlu") {
            out.push(p);
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-env-changed=NEUWARE_HOME");
    let mut mlu = Vec::new();
    sources(Path::new("kernels"), &mut mlu);

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++20")
        .flag("-ffp-contract=off")
        .flag_if_supported("-Wno-unused-parameter")
        .warnings(true)
        .opt_level(2)
        .file("kernels/emulator/emu_runtime.cc")
        // The emulator's self-test kernels (host only, driven by tests/emulator.rs).
        .file("kernels/emulator/selftest.cc")
        .file("kernels/emulator/selftest_nram.cc");
    // .mlu is not a C++ extension to the compiler: say so for those files only.
    build.flag("-x").flag("c++");
    for f in &mlu {
        build.file(f);
    }
    build.compile("mluops_kernels_emu");

    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let device_lib = std::env::var("NEUWARE_HOME").ok().and_then(|home| {
        let cncc = Path::new(&home).join("bin/cncc");
        cncc.exists().then(|| {
            let lib = out_dir.join("libmluops_kernels_mlu.so");
            let status = Command::new(&cncc)
                .args(["--bang-mlu-arch=mtp_372", "-O3", "-ffp-contract=off", "-fPIC", "-shared", "-o"])
                .arg(&lib)
                .args(&mlu)
                .status()
                .expect("cncc runs");
            assert!(status.success(), "cncc failed to build the BANG kernels");
            lib
        })
    });
    println!(
        "cargo:rustc-env=MLUOPS_DEVICE_KERNELS={}",
        device_lib.map(|p| p.display().to_string()).unwrap_or_default()
    );
}
