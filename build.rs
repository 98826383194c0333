//! Builds the BANG kernels of kernels/.
//! - Always: every `.mlu` source plus the emulator runtime, compiled for the host with the
//!   system C++ compiler (C++17, FP contraction off) into a static library linked into
//!   this crate: the emulated MLU card runs these.
//! - When a Cambricon toolkit is present (NEUWARE_HOME with bin/cncc): the same sources
//!   compiled one by one by cncc (for MLU_EP_BANG_ARCH, default mtp_372) and linked into
//!   `libbang_kernels_mlu.so` (build_support/cncc.rs), which the Cambricon runtime path
//!   opens with libloading; its path is baked in as BANG_DEVICE_KERNELS.
//! - The Rust side of each family's C header kernels/<family>/<family>.h, into
//!   `$OUT_DIR/kernels/` (build_support/abi.rs), and the list of every launch entry.

#[path = "build_support/abi.rs"]
mod abi;
#[path = "build_support/cncc.rs"]
mod cncc;

use std::path::{Path, PathBuf};

/// Stops the build with `message` and no panic backtrace: cargo shows the script's stderr.
fn fail(message: &str) -> ! {
    eprintln!("{message}");
    std::process::exit(1);
}

fn main() {
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-env-changed=NEUWARE_HOME");
    println!("cargo:rerun-if-env-changed=MLU_EP_BANG_ARCH");
    // Never unmapped by dlclose: ONNX Runtime unloads an EP library when it is unregistered,
    // while sessions created with it may still run (and release) its kernels and EPs.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    let mlu = cncc::mlu_sources(Path::new("kernels"))
        .unwrap_or_else(|e| fail(&format!("error: reading kernels/: {e}")));

    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    generate_abi(&mlu, &out_dir.join("kernels")).unwrap_or_else(|e| fail(&format!("error: {e}")));

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .std("c++17")
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
    build.compile("bang_kernels_emu");

    let device_lib = std::env::var_os("NEUWARE_HOME").and_then(|home| {
        let home = PathBuf::from(home);
        let Some(cncc) = cncc::cncc(&home) else {
            println!("cargo:warning=NEUWARE_HOME={} has no bin/cncc: only the emulated card's kernels are built", home.display());
            return None;
        };
        // The link driver: the host C++ compiler the emulator build uses (honours CXX).
        let cxx = build.get_compiler().path().to_path_buf();
        let arch = std::env::var("MLU_EP_BANG_ARCH").ok().filter(|a| !a.is_empty());
        if let Some(a) = arch.as_deref().filter(|&a| a != cncc::DEFAULT_ARCH) {
            println!(
                "cargo:warning=MLU_EP_BANG_ARCH={a}: the kernels' NRAM budget and the allow-list of kernels/README.md were checked for {} only",
                cncc::DEFAULT_ARCH
            );
        }
        let toolchain = cncc::Toolchain { neuware_home: &home, cncc: &cncc, cxx: &cxx, arch: arch.as_deref().unwrap_or(cncc::DEFAULT_ARCH) };
        match cncc::build_library(&toolchain, &mlu, &out_dir) {
            Ok(built) => Some(built),
            Err(e) => fail(&format!(
                "{e}\nerror: the Cambricon toolkit build of kernels/ failed; to build without it (emulated card only), unset NEUWARE_HOME"
            )),
        }
    });
    // A family cncc failed on is left out of the library; the provider logs this message
    // and runs that family's nodes elsewhere (src/mlu/cnrt.rs).
    let failed = device_lib.as_ref().map_or(&[][..], |b| &b.failed[..]);
    for (family, e) in failed {
        println!(
            "cargo:warning=cncc failed on the kernel family {family}: its nodes will not run on our BANG kernels ({})",
            e.to_string().lines().next().unwrap_or_default()
        );
    }
    let list: String =
        failed.iter().map(|(f, e)| format!("    ({f:?}, {:?}),\n", e.to_string())).collect();
    let table = format!(
        "/// The kernel families cncc failed on when this library was built: (family, cncc's output).\npub const CNCC_FAILED: &[(&str, &str)] = &[\n{list}];\n"
    );
    std::fs::write(out_dir.join("kernels/cncc_failed.rs"), table)
        .unwrap_or_else(|e| fail(&format!("error: {e}")));
    println!(
        "cargo:rustc-env=BANG_DEVICE_KERNELS={}",
        device_lib.as_ref().map(|b| b.library.display().to_string()).unwrap_or_default()
    );
    // The architecture that library was compiled for: a card of the Cambricon runtime is
    // of it (src/mluops: MLU-OPS versions are checked against it).
    let arch = std::env::var("MLU_EP_BANG_ARCH").ok().filter(|a| !a.is_empty());
    println!(
        "cargo:rustc-env=BANG_DEVICE_ARCH={}",
        device_lib
            .map(|_| arch.unwrap_or_else(|| cncc::DEFAULT_ARCH.to_owned()))
            .unwrap_or_default()
    );
}

/// For every family (a kernels/<family>/<family>.mlu), its header's Rust side in
/// `dir/<family>.rs`, and `dir/entries.rs`: `KERNEL_FAMILIES`, every family with its launch
/// entries' names.
fn generate_abi(mlu: &[PathBuf], dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut families = String::new();
    for f in mlu {
        let family = f.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        if f.parent().and_then(|p| p.file_name()).and_then(|n| n.to_str()) != Some(family) {
            continue;
        }
        let header = f.with_extension("h");
        let src =
            std::fs::read_to_string(&header).map_err(|e| format!("{}: {e}", header.display()))?;
        let rust = abi::generate(family, &src).map_err(|e| format!("{}: {e}", header.display()))?;
        let code = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        if !code.lines().any(|l| l.trim() == format!("#include \"{family}.h\"")) {
            return Err(format!("{}: does not include {family}.h", f.display()));
        }
        abi::check_definitions(&code, &src).map_err(|e| format!("{}: {e}", f.display()))?;
        std::fs::write(dir.join(format!("{family}.rs")), rust).map_err(|e| e.to_string())?;
        let names = abi::entry_names(&[src])?;
        let list: String = names.iter().map(|n| format!("\"{n}\\0\", ")).collect();
        families.push_str(&format!("    (\"{family}\", &[{list}]),\n"));
    }
    let entries = format!(
        "/// Every kernel family of kernels/ with the launch entries of its header, NUL-terminated.\npub const KERNEL_FAMILIES: &[(&str, &[&str])] = &[\n{families}];\n"
    );
    std::fs::write(dir.join("entries.rs"), entries).map_err(|e| e.to_string())
}
