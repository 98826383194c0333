//! The Cambricon-toolkit build of kernels/: each `.mlu` compiled by cncc, the objects linked
//! into `libbang_kernels_mlu.so` (without the kernel families cncc failed on). Plain std Rust without dependencies, included by build.rs
//! and by tests/cncc_build.rs (`#[path]`), so the test runs the very commands the build runs.
//!
//! Precedents, Cambricon's public build code:
//! - torch_mlu, torch_mlu/utils/cpp_extension.py (branch r1.22_pt2.1.0, commit d578002):
//!   each `.mlu` through its own `$cncc -c $in -o $out` with `-I$NEUWARE_HOME/include`; the
//!   extension linked by the host C++ compiler (`$cxx -shared $in $ldflags -o $out`, cxx being
//!   `$CXX` or `c++`) against `$NEUWARE_HOME/lib64`.
//! - mlu-ops, CMakeLists.txt (tag v1.4.0): every `.mlu` compiled separately by FindBANG's
//!   `bang_add_library` with `-std=c++17 -fPIC -O3 --bang-mlu-arch=mtp_372
//!   --neuware-path=$NEUWARE_HOME`; the objects linked as a C++ library (CMake's C++ linker,
//!   not cncc) with `target_link_libraries(mluops ... cnrt cndrv dl)`.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The MLU architecture compiled for unless MLU_EP_BANG_ARCH names another: MLU370, the card
/// kernels/common/kernel.h budgets NRAM for (mlu-ops v1.4.0 CMakeLists.txt builds it too).
pub const DEFAULT_ARCH: &str = "mtp_372";

/// What build.rs produces and the runtime opens (src/mlu/cnrt.rs).
const LIBRARY: &str = "libbang_kernels_mlu.so";

/// The toolkit's compiler, `None` when `neuware_home` has none (then only the emulated card's
/// kernels are built).
pub fn cncc(neuware_home: &Path) -> Option<PathBuf> {
    let path = neuware_home.join("bin/cncc");
    path.is_file().then_some(path)
}

/// The `.mlu` sources under `dir`, recursively, in a stable (sorted) order.
pub fn mlu_sources(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    collect(dir, &mut out)?;
    Ok(out)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()?;
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "mlu") {
            out.push(p);
        }
    }
    Ok(())
}

/// The programs and target of one build.
pub struct Toolchain<'a> {
    pub neuware_home: &'a Path,
    /// `$NEUWARE_HOME/bin/cncc` (see [`cncc`]).
    pub cncc: &'a Path,
    /// The host C++ compiler, the link driver (see the module's precedents).
    pub cxx: &'a Path,
    /// `--bang-mlu-arch` value, e.g. [`DEFAULT_ARCH`].
    pub arch: &'a str,
}

/// A tool that failed: its own output, verbatim, then which command and how.
#[derive(Debug)]
pub struct Failure {
    command: String,
    reason: String,
    output: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.output)?;
        if !self.output.is_empty() && !self.output.ends_with('\n') {
            f.write_str("\n")?;
        }
        write!(f, "`{}` failed: {}", self.command, self.reason)
    }
}

/// A kernel library and the kernel families cncc could not compile (left out of it).
#[derive(Debug)]
pub struct Built {
    pub library: PathBuf,
    /// (family, cncc's failure), a family being the folder of kernels/ its source is in.
    pub failed: Vec<(String, Failure)>,
}

/// Compiles every source into `out_dir/cncc/`, then links the objects into
/// `out_dir/libbang_kernels_mlu.so`. A source cncc fails on leaves its kernel family out
/// of the library (the provider then runs that family's nodes elsewhere: src/mlu/cnrt.rs);
/// the build fails when no source compiles or the link fails.
pub fn build_library(
    tc: &Toolchain<'_>,
    sources: &[PathBuf],
    out_dir: &Path,
) -> Result<Built, Failure> {
    let obj_dir = out_dir.join("cncc");
    std::fs::create_dir_all(&obj_dir).map_err(|e| Failure {
        command: format!("mkdir {}", obj_dir.display()),
        reason: e.to_string(),
        output: String::new(),
    })?;
    let mut objects = Vec::new();
    let mut failed: Vec<(String, Failure)> = Vec::new();
    for (i, source) in sources.iter().enumerate() {
        // The index keeps objects apart when two directories hold sources of the same name.
        let stem = source.file_stem().map_or_else(|| "kernel".into(), |s| s.to_string_lossy());
        let object = obj_dir.join(format!("{i:02}_{stem}.o"));
        match run(tc.cncc, &compile_args(tc, source, &object)) {
            Ok(()) => objects.push(object),
            Err(e) => failed.push((family(source), e)),
        }
    }
    if objects.is_empty() && !failed.is_empty() {
        return Err(failed.swap_remove(0).1);
    }
    let library = out_dir.join(LIBRARY);
    run(tc.cxx, &link_args(tc, &objects, &library))?;
    Ok(Built { library, failed })
}

/// The kernel family of a source: the name of the folder of kernels/ it is in.
pub fn family(source: &Path) -> String {
    source
        .parent()
        .and_then(Path::file_name)
        .map_or_else(String::new, |f| f.to_string_lossy().into_owned())
}

/// `cncc -c <source> -o <object>` and its flags. Sources include their headers relatively
/// (`../common/kernel.h`), so no kernels/ include path is needed.
fn compile_args(tc: &Toolchain<'_>, source: &Path, object: &Path) -> Vec<OsString> {
    let home = tc.neuware_home;
    let mut args: Vec<OsString> = vec!["-c".into(), source.into(), "-o".into(), object.into()];
    args.push(format!("--bang-mlu-arch={}", tc.arch).into());
    // As mlu-ops: the toolkit cncc compiles against is the one NEUWARE_HOME names.
    args.push(prefixed("--neuware-path=", home));
    // <mlu.h> and <cnrt.h> of kernels/common/kernel.h (torch_mlu passes the same -I).
    args.push(prefixed("-I", &home.join("include")));
    args.extend(["-std=c++17", "-O3", "-fPIC"].map(OsString::from));
    // Not in Cambricon's flags: the emulator build (build.rs) has it so that results match
    // the CPU kernels without fused multiply-adds, and the device build must compute the
    // same. cncc is clang-based (mlu-ops v1.4.0 CMakeLists.txt passes it clang's
    // -fprofile-instr-generate and links $NEUWARE_HOME/lib/clang/11.1.0's runtime), and
    // -ffp-contract is a clang driver flag.
    args.push("-ffp-contract=off".into());
    args
}

/// `c++ -shared <objects> -L$NEUWARE_HOME/lib64 -Wl,-rpath=$NEUWARE_HOME/lib64 -lcnrt -lcndrv
/// -o <library>`, the order of torch_mlu's link rule. libcnrt is linked so that the launches
/// cncc emitted (CNRT calls) name their library; mlu-ops' `dl` is left out: nothing here
/// calls dlopen. The rpath lets the loader find libcnrt and libcndrv in the toolkit the
/// library was built against without LD_LIBRARY_PATH; precedent: mlu-ops v1.4.0
/// test/mlu_op_gtest/CMakeLists.txt:158 (`-L ${NEUWARE_HOME}/lib64 -lcnrt ...
/// -Wl,-rpath=${NEUWARE_HOME}/lib64`, a host tool it builds).
fn link_args(tc: &Toolchain<'_>, objects: &[PathBuf], library: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["-shared".into()];
    args.extend(objects.iter().map(OsString::from));
    args.push(prefixed("-L", &tc.neuware_home.join("lib64")));
    args.push(prefixed("-Wl,-rpath=", &tc.neuware_home.join("lib64")));
    args.extend(["-lcnrt", "-lcndrv", "-o"].map(OsString::from));
    args.push(library.into());
    args
}

fn prefixed(flag: &str, path: &Path) -> OsString {
    let mut s = OsString::from(flag);
    s.push(path);
    s
}

/// Runs `program`, capturing its output so a failure carries it.
fn run(program: &Path, args: &[OsString]) -> Result<(), Failure> {
    let command = std::iter::once(program.as_os_str())
        .chain(args.iter().map(OsString::as_os_str))
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new(program).args(args).output().map_err(|e| Failure {
        command: command.clone(),
        reason: format!("could not be started: {e}"),
        output: String::new(),
    })?;
    if out.status.success() {
        return Ok(());
    }
    let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
    output.push_str(&String::from_utf8_lossy(&out.stderr));
    Err(Failure { command, reason: out.status.to_string(), output })
}
