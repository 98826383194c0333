//! The BANG constructs the kernels use are the allow-list of kernels/README.md, each with
//! a Cambricon precedent; under the emulator, a construct off the list does not compile.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The constructs named in the first column of the allow-list table.
fn allow_list() -> BTreeSet<String> {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("kernels/README.md")).unwrap();
    let table = readme.split("## The allow-list").nth(1).expect("an allow-list section");
    let table = table.split("\n## ").next().unwrap();
    let mut names = BTreeSet::new();
    for row in table.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        assert_eq!(cells.len(), 4, "construct | form | precedent | arch: {row}");
        assert!(cells[2].contains(".mlu") || cells[2].contains(".h"), "no precedent: {row}");
        assert!(cells[3].contains("mtp_372") || cells[3].contains("CNRT"), "no arch: {row}");
        for name in cells[0].split('`').skip(1).step_by(2) {
            names.insert(name.trim_end_matches("()").to_owned());
        }
    }
    names
}

fn mlu_sources() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in std::fs::read_dir(Path::new(ROOT).join("kernels")).unwrap().flatten() {
        if dir.file_name() == "emulator" || !dir.path().is_dir() {
            continue;
        }
        for f in std::fs::read_dir(dir.path()).unwrap().flatten() {
            let p = f.path();
            if p.extension().is_some_and(|e| e == "mlu" || e == "h") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// `__`-prefixed identifiers outside comments and strings.
fn dunder_names(src: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in src.lines() {
        let code = line.split("//").next().unwrap();
        let bytes = code.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let starts = bytes[i] == b'_'
                && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'));
            if starts {
                let end = (i..bytes.len())
                    .find(|&j| !(bytes[j].is_ascii_alphanumeric() || bytes[j] == b'_'))
                    .unwrap_or(bytes.len());
                let word = &code[i..end];
                if word.starts_with("__") {
                    names.insert(word.to_owned());
                }
                i = end;
            } else {
                i += 1;
            }
        }
    }
    names
}

#[test]
fn every_construct_the_kernels_use_is_on_the_allow_list() {
    let listed = allow_list();
    // Macros of the compilers and of kernel.h's own plumbing, not device constructs.
    let plumbing = ["__BANG__", "__VA_ARGS__", "__FILE__", "__LINE__", "__attribute__"];
    let mut used = BTreeSet::new();
    for f in mlu_sources().iter().chain([&Path::new(ROOT).join("kernels/common/kernel.h")]) {
        used.extend(dunder_names(&std::fs::read_to_string(f).unwrap()));
    }
    let missing: Vec<_> =
        used.iter().filter(|n| !listed.contains(*n) && !plumbing.contains(&n.as_str())).collect();
    assert!(missing.is_empty(), "used but not on the allow-list of kernels/README.md: {missing:?}");
    for required in ["__is_mpu", "__sync_all_ipu", "__nram__", "__bang_atomic_reduce_add", "isnan"]
    {
        assert!(listed.contains(required), "{required} listed");
    }
    // The toolkit headers kernel.h includes under cncc (the first `#if defined(__BANG__)`).
    let kernel_h =
        std::fs::read_to_string(Path::new(ROOT).join("kernels/common/kernel.h")).unwrap();
    let bang =
        kernel_h.split("#if defined(__BANG__)").nth(1).unwrap().split("#else").next().unwrap();
    let headers: Vec<&str> = bang.lines().filter_map(|l| l.strip_prefix("#include ")).collect();
    assert!(!headers.is_empty(), "kernel.h includes the toolkit's headers under __BANG__");
    for h in headers {
        assert!(
            listed.contains(h),
            "{h}, included by kernel.h under cncc, is not on the allow-list"
        );
    }
}

/// Device code computes indices in 32 bits, as mlu-ops does on mtp_372 (kernels/README.md).
#[test]
fn device_code_has_no_64_bit_integer_variables() {
    let wide = ["long", "int64_t", "uint64_t", "size_t", "ptrdiff_t", "intptr_t"];
    for f in mlu_sources().iter().chain([&Path::new(ROOT).join("kernels/common/kernel.h")]) {
        let src = std::fs::read_to_string(f).unwrap();
        for (n, line) in src.lines().enumerate() {
            let code = line.split("//").next().unwrap();
            let words: Vec<&str> =
                code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).collect();
            // A launch entry's own signature is host code.
            if let Some(w) =
                wide.iter().find(|w| words.contains(w)).filter(|_| !code.starts_with("BANG_EXPORT"))
            {
                panic!("{}:{}: `{w}` in device code: {line}", f.display(), n + 1);
            }
        }
    }
}

#[test]
fn the_emulator_offers_nothing_off_the_list() {
    let listed = allow_list();
    let emu = std::fs::read_to_string(Path::new(ROOT).join("kernels/emulator/bang_emu.h")).unwrap();
    let surface = emu
        .split("#ifndef BANG_EMU_RUNTIME")
        .nth(1)
        .expect("the kernel surface")
        .split("#endif")
        .next()
        .unwrap();
    let mut offered = BTreeSet::new();
    for line in surface.lines() {
        if let Some(def) = line.strip_prefix("#define ") {
            offered.insert(def.split(['(', ' ']).next().unwrap().to_owned());
        } else if let Some(f) = line.strip_prefix("inline ") {
            // `inline float round(float x) { ... }`: the function's name.
            offered.insert(f.split('(').next().unwrap().rsplit(' ').next().unwrap().to_owned());
        }
    }
    assert!(offered.len() > 20, "{offered:?}");
    let off: Vec<_> = offered.iter().filter(|n| !listed.contains(*n)).collect();
    assert!(
        off.is_empty(),
        "bang_emu.h offers kernels constructs missing from the allow-list: {off:?}"
    );
}

#[test]
fn every_union_kernel_starts_with_the_memory_core_guard() {
    for f in mlu_sources().into_iter().filter(|p| p.extension().is_some_and(|e| e == "mlu")) {
        let src = std::fs::read_to_string(&f).unwrap();
        assert_eq!(src.matches("__bang_atomic_reduce_or").count(), 0, "{f:?}");
        for kernel in src.split("__mlu_global__ void ").skip(1) {
            let body = kernel.split_once('{').expect("a body").1;
            let first = body.lines().map(str::trim).find(|l| !l.is_empty()).unwrap();
            assert_eq!(
                first,
                "if (__is_mpu()) return;",
                "{f:?}: {}",
                kernel.lines().next().unwrap()
            );
        }
        if src.contains("__mlu_global__") {
            assert_eq!(
                src.matches("BANG_NRAM_BUFFER(").count(),
                1,
                "one file-scope NRAM buffer: {f:?}"
            );
        }
    }
}

/// Compiles a kernel whose body computes `expr` (a float from `v`) against the emulator.
fn compiles(expr: &str) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("bang_allow_list_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir
        .join(format!("k{}.cc", expr.len() * 7919 + expr.bytes().map(usize::from).sum::<usize>()));
    let src = format!(
        "#include \"kernel.h\"\nBANG_NRAM_BUFFER(nram_buffer);\n__mlu_global__ void K(float *out) {{\n  if (__is_mpu()) return;\n  float v = out[0];\n  out[0] = {expr};\n}}\n"
    );
    std::fs::write(&file, src).unwrap();
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
    let out = Command::new(cxx)
        .args(["-std=c++17", "-fsyntax-only", "-x", "c++", "-I"])
        .arg(Path::new(ROOT).join("kernels/common"))
        .arg(&file)
        .output()
        .expect("the C++ compiler runs");
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn constructs_off_the_list_do_not_compile_under_the_emulator() {
    compiles("isnan(v) || isinf(v) ? 1.0f : 0.0f").expect("the listed math compiles");
    // No rounding on the card: PsRoiPoolBackward's bin spans come from the host.
    for off in [
        "round(v)",
        "floor(v)",
        "ceil(v)",
        "roundf(v)",
        "truncf(v)",
        "isfinite(v) ? 1.0f : 0.0f",
        "sqrtf(v)",
        "(__bang_atomic_reduce_or((int *)out, (int *)out, 1), v)",
        "(__bang_atomic_reduce_min((int *)out, (int *)out, 1), v)",
        "(__sync_all(), v)",
        "(__bang_cycle_add(out, out, out, 32, 32), v)",
        "(float)coreId",
    ] {
        let err = compiles(off).expect_err(off);
        assert!(err.contains("error"), "{off}: {err}");
    }
}

/// The NRAM2GDRAM `__memcpy` lines of `src` whose source tile took a scalar store since the
/// last `__sync()` (in source order, within one function), as "line: text".
fn unsynced_scalar_stores(src: &str) -> Vec<String> {
    let mut dirty = BTreeSet::new();
    let mut found = Vec::new();
    for (n, line) in src.lines().enumerate() {
        let code = line.split("//").next().unwrap();
        if code.contains("__sync()")
            || code.contains("__mlu_global__")
            || code.contains("__mlu_func__")
        {
            dirty.clear();
        }
        if let Some(args) = code.split("__memcpy(").nth(1).filter(|_| code.contains("NRAM2GDRAM")) {
            let source = args.split(',').nth(1).unwrap_or("").trim();
            if dirty.contains(source) {
                found.push(format!("{}: {}", n + 1, line.trim()));
            }
        }
        // `<tile>_nram[...] = ` or a compound assignment: a scalar store to an NRAM tile.
        for (at, _) in code.match_indices("_nram[") {
            let start = code[..at]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map_or(0, |i| i + 1);
            let Some(close) = code[at..].find(']') else { continue };
            let rest = code[at + close + 1..].trim_start();
            let op = rest.split('=').next().unwrap_or("").trim();
            if rest.contains('=')
                && !rest.starts_with("==")
                && ["", "+", "-", "|", "&", "*"].contains(&op)
            {
                dirty.insert(code[start..at + "_nram".len()].to_owned());
            }
        }
    }
    found
}

/// A scalar NRAM store is synced (`__sync()`) before the tile is copied to GDRAM, as mlu-ops
/// does (Cambricon/mlu-ops@v1.4.0 kernels/psroipool/psroipool_block.mlu:149-159: scalar
/// stores to `nram_mapping_channel`, `__sync()`, then its NRAM2GDRAM `__memcpy`). The
/// emulator runs scalar stores in program order, so only this source check sees a missing one.
#[test]
fn scalar_nram_stores_are_synced_before_a_copy_to_gdram() {
    let unsynced = "__mlu_global__ void K(int32_t *out) {\n  slot_nram[0] = 1;\n  __memcpy(out, slot_nram, 4, NRAM2GDRAM);\n}\n";
    assert_eq!(unsynced_scalar_stores(unsynced).len(), 1, "the check finds a missing sync");
    let synced = unsynced.replace("  __memcpy", "  __sync();\n  __memcpy");
    assert!(unsynced_scalar_stores(&synced).is_empty(), "and accepts the synced form");
    let reads = "  const int32_t v = rows_nram[r * cols + c];\n  if (rows_nram[i] == 0) x = 1;\n  __memcpy(out, rows_nram, 4, NRAM2GDRAM);\n";
    assert!(unsynced_scalar_stores(reads).is_empty(), "scalar loads are not stores");
    for f in mlu_sources().into_iter().filter(|p| p.extension().is_some_and(|e| e == "mlu")) {
        let found = unsynced_scalar_stores(&std::fs::read_to_string(&f).unwrap());
        assert!(
            found.is_empty(),
            "{}: scalar NRAM stores copied to GDRAM without __sync(): {found:?}",
            f.display()
        );
    }
}
