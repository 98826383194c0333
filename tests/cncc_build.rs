//! The Cambricon-toolkit build of kernels/ (build_support/cncc.rs, the code build.rs runs)
//! against a fake toolkit: no Cambricon toolkit exists on this project's machines, so shell
//! scripts stand in for cncc and the host C++ compiler. They log every command line and write
//! the files the real tools would.

#[path = "../build_support/cncc.rs"]
mod cncc;

use std::path::{Path, PathBuf};

/// Logs its argv (tab-separated, `$0` first, one line per call) to `log`; writes an empty
/// object for `-c` and a stub library for `-shared` at the `-o` path.
fn logging_tool(log: &Path) -> String {
    format!(
        r#"#!/bin/sh
printf '%s\t' "$0" "$@" >> '{log}'
printf '\n' >> '{log}'
out=
prev=
for a in "$@"; do
  if [ "$prev" = "-o" ]; then out="$a"; fi
  prev="$a"
done
for a in "$@"; do
  case "$a" in
    -c) : > "$out"; exit 0 ;;
    -shared) echo 'stub shared object' > "$out"; exit 0 ;;
  esac
done
echo 'fake tool: neither -c nor -shared' >&2
exit 2
"#,
        log = log.display()
    )
}

/// A cncc whose compile fails with a diagnostic, as a real one does on a broken source.
const FAILING_CNCC: &str = "#!/bin/sh\n\
echo \"$2:3:1: error: unknown type name '__nram_t'\" >&2\n\
exit 1\n";

struct FakeToolkit {
    home: PathBuf,
    cxx: PathBuf,
    log: PathBuf,
    out: PathBuf,
}

/// Tests run on parallel threads of one process: a script being written has an open write
/// descriptor that a child forked by another test's build inherits until it execs, and
/// executing the script then fails with ETXTBSY ("Text file busy"). Scripts are written
/// under the write lock and builds (which fork) run under the read lock.
static FORKS: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn write_script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    let _writing = FORKS.write().unwrap_or_else(|e| e.into_inner());
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A fresh NEUWARE_HOME (bin/cncc, include/, lib64/), a fake host C++ compiler and an output
/// directory, under a directory of this test's own.
fn fake_toolkit(test: &str, cncc_script: Option<&str>) -> FakeToolkit {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cncc_build").join(test);
    let _ = std::fs::remove_dir_all(&root);
    let home = root.join("neuware");
    for d in ["bin", "include", "lib64"] {
        std::fs::create_dir_all(home.join(d)).unwrap();
    }
    let log = root.join("argv.log");
    let tool = logging_tool(&log);
    write_script(&home.join("bin/cncc"), cncc_script.unwrap_or(&tool));
    let cxx = root.join("c++");
    write_script(&cxx, &tool);
    let out = root.join("out");
    std::fs::create_dir_all(&out).unwrap();
    FakeToolkit { home, cxx, log, out }
}

/// The logged command lines, each as its argv (`$0` first).
fn calls(log: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(|l| l.strip_suffix('\t').unwrap_or(l).split('\t').map(str::to_owned).collect())
        .collect()
}

/// The `.mlu` files of kernels/, found independently of cncc::mlu_sources.
fn kernel_sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.to_string_lossy().ends_with(".mlu") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels"), &mut out);
    out.sort();
    out
}

/// Builds kernels/ with the fake toolkit for `arch`; returns the library and the calls.
fn build(test: &str, arch: &str) -> (FakeToolkit, PathBuf, Vec<Vec<String>>) {
    let tk = fake_toolkit(test, None);
    let cncc = cncc::cncc(&tk.home).expect("the fake toolkit has bin/cncc");
    let sources =
        cncc::mlu_sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels")).unwrap();
    assert_eq!(sources, kernel_sources(), "mlu_sources finds every .mlu of kernels/");
    let toolchain = cncc::Toolchain { neuware_home: &tk.home, cncc: &cncc, cxx: &tk.cxx, arch };
    let lib = {
        let _forking = FORKS.read().unwrap_or_else(|e| e.into_inner());
        cncc::build_library(&toolchain, &sources, &tk.out).expect("the fake toolkit succeeds")
    };
    assert!(lib.failed.is_empty(), "no family failed");
    let lib = lib.library;
    let calls = calls(&tk.log);
    (tk, lib, calls)
}

fn has(call: &[String], arg: &str) -> bool {
    call.iter().any(|a| a == arg)
}

/// The value after `flag` in `call`.
fn after<'a>(call: &'a [String], flag: &str) -> &'a str {
    let i =
        call.iter().position(|a| a == flag).unwrap_or_else(|| panic!("{flag} missing in {call:?}"));
    &call[i + 1]
}

#[test]
fn each_kernel_source_is_compiled_alone_then_all_are_linked_against_cnrt() {
    let (tk, lib, calls) = build("default_arch", cncc::DEFAULT_ARCH);
    let sources = kernel_sources();
    assert!(sources.len() >= 2, "kernels/ has its .mlu sources: {sources:?}");
    let cncc = tk.home.join("bin/cncc").display().to_string();
    let (compiles, links): (Vec<_>, Vec<_>) = calls.iter().partition(|c| c[0] == cncc);

    assert_eq!(compiles.len(), sources.len(), "one cncc call per .mlu: {compiles:?}");
    let include = format!("-I{}", tk.home.join("include").display());
    let neuware = format!("--neuware-path={}", tk.home.display());
    let mut compiled = Vec::new();
    let mut objects = Vec::new();
    for c in &compiles {
        compiled.push(PathBuf::from(after(c, "-c")));
        objects.push(after(c, "-o").to_owned());
        for flag in [
            "--bang-mlu-arch=mtp_372",
            &include,
            &neuware,
            "-std=c++17",
            "-O3",
            "-fPIC",
            "-ffp-contract=off",
        ] {
            assert!(has(c, flag), "{flag} missing in {c:?}");
        }
        assert!(!has(c, "-shared"), "a compile is not a link: {c:?}");
    }
    compiled.sort();
    assert_eq!(compiled, sources, "every .mlu compiled exactly once");
    let mut unique = objects.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), objects.len(), "one object per source: {objects:?}");

    assert_eq!(links.len(), 1, "one link: {links:?}");
    let link = links[0];
    assert_eq!(link[0], tk.cxx.display().to_string(), "the host C++ compiler links");
    assert_eq!(calls.last(), Some(link), "the link follows every compile");
    let lib64 = format!("-L{}", tk.home.join("lib64").display());
    let rpath = format!("-Wl,-rpath={}", tk.home.join("lib64").display());
    for flag in ["-shared", &lib64, &rpath, "-lcnrt", "-lcndrv"] {
        assert!(has(link, flag), "{flag} missing in {link:?}");
    }
    for o in &objects {
        assert!(has(link, o), "object {o} not linked: {link:?}");
    }
    assert_eq!(after(link, "-o"), lib.display().to_string());
    assert_eq!(lib, tk.out.join("libbang_kernels_mlu.so"));
    assert!(lib.is_file(), "the link wrote the library");
}

#[test]
fn the_arch_given_reaches_every_compile() {
    let (tk, _, calls) = build("arch_override", "mtp_592");
    let cncc = tk.home.join("bin/cncc").display().to_string();
    let compiles: Vec<_> = calls.iter().filter(|c| c[0] == cncc).collect();
    assert_eq!(compiles.len(), kernel_sources().len());
    for c in compiles {
        assert!(has(c, "--bang-mlu-arch=mtp_592"), "{c:?}");
        assert!(!has(c, "--bang-mlu-arch=mtp_372"), "{c:?}");
    }
}

/// Every family failing leaves nothing to link: the build stops with the first failure.
#[test]
fn a_failing_cncc_stops_the_build_with_its_own_diagnostics() {
    let tk = fake_toolkit("failing_cncc", Some(FAILING_CNCC));
    let cncc = cncc::cncc(&tk.home).unwrap();
    let sources = kernel_sources();
    let toolchain = cncc::Toolchain {
        neuware_home: &tk.home,
        cncc: &cncc,
        cxx: &tk.cxx,
        arch: cncc::DEFAULT_ARCH,
    };
    let err = {
        let _forking = FORKS.read().unwrap_or_else(|e| e.into_inner());
        cncc::build_library(&toolchain, &sources, &tk.out).expect_err("cncc exits 1").to_string()
    };
    let first = sources[0].display();
    assert!(
        err.contains(&format!("{first}:3:1: error: unknown type name '__nram_t'")),
        "cncc's stderr is carried: {err}"
    );
    assert!(
        err.contains(&format!("{} -c {first}", cncc.display())),
        "the failing command is named: {err}"
    );
    assert!(err.contains("exit status: 1"), "{err}");
    assert!(calls(&tk.log).is_empty(), "nothing runs after the failure (no link)");
    assert!(!tk.out.join("libbang_kernels_mlu.so").exists());
}

#[test]
fn a_kernel_family_cncc_fails_on_is_left_out_with_its_diagnostics() {
    let test = "one_family_fails";
    let log = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cncc_build").join(test).join("argv.log");
    // The logging tool, except that the sources of kernels/sparse_conv/ fail to compile.
    let script = logging_tool(&log).replacen(
        "#!/bin/sh\n",
        "#!/bin/sh\ncase \"$2\" in */sparse_conv/*) echo \"$2:7:3: error: use of undeclared identifier '__bang_mystery'\" >&2; exit 1 ;; esac\n",
        1,
    );
    let tk = fake_toolkit(test, Some(&script));
    let cncc = cncc::cncc(&tk.home).unwrap();
    let sources = kernel_sources();
    let toolchain = cncc::Toolchain {
        neuware_home: &tk.home,
        cncc: &cncc,
        cxx: &tk.cxx,
        arch: cncc::DEFAULT_ARCH,
    };
    let built = {
        let _forking = FORKS.read().unwrap_or_else(|e| e.into_inner());
        cncc::build_library(&toolchain, &sources, &tk.out)
            .unwrap_or_else(|e| panic!("the other families build: {e}"))
    };
    let failed: Vec<(&str, String)> =
        built.failed.iter().map(|(f, e)| (f.as_str(), e.to_string())).collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    let (family, message) = &failed[0];
    assert_eq!(*family, "sparse_conv");
    assert!(
        message
            .contains("sparse_conv.mlu:7:3: error: use of undeclared identifier '__bang_mystery'"),
        "cncc's own diagnostics are kept: {message}"
    );
    let calls = calls(&tk.log);
    let link = calls.last().expect("a link");
    assert!(has(link, "-shared"), "{link:?}");
    let objects: Vec<&String> = link.iter().filter(|a| a.ends_with(".o")).collect();
    assert_eq!(objects.len(), sources.len() - 1, "every other source is linked: {link:?}");
    assert!(!objects.iter().any(|o| o.contains("sparse_conv")), "{link:?}");
    assert_eq!(built.library, tk.out.join("libbang_kernels_mlu.so"));
    assert!(built.library.is_file());
}

#[test]
fn a_neuware_home_without_cncc_builds_no_device_library() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cncc_build").join("no_cncc");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("bin")).unwrap();
    assert_eq!(cncc::cncc(&root), None);
}
