//! The kernels' C ABI is written once, in kernels/<family>/<family>.h, and its Rust side is
//! generated from it by build.rs (build_support/abi.rs, included here). These tests hold the
//! generator to C: its type mapping, what it refuses, the .mlu definitions' parameter names
//! it checks, the list of entries the card's library must export, and the structs' layout
//! against the C compiler's.

#[path = "../build_support/abi.rs"]
mod abi;

use onnxruntime_ep_mlu::mlu::KERNEL_FAMILIES;
use onnxruntime_ep_mlu::mlu::abi::IntBounds;
use onnxruntime_ep_mlu::ops::sparse_conv::abi::GipGeometry;
use std::path::Path;
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every kernels/<family>/ with a <family>.mlu: (family, .h source).
fn headers() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for dir in std::fs::read_dir(Path::new(ROOT).join("kernels")).unwrap().flatten() {
        let family = dir.file_name().to_string_lossy().into_owned();
        if dir.path().join(format!("{family}.mlu")).exists() {
            out.push((
                family.clone(),
                std::fs::read_to_string(dir.path().join(format!("{family}.h"))).unwrap(),
            ));
        }
    }
    out.sort();
    out
}

#[test]
fn every_header_generates_and_the_library_check_lists_every_entry() {
    let headers = headers();
    assert!(headers.len() >= 6, "{:?}", headers.iter().map(|h| &h.0).collect::<Vec<_>>());
    for (family, src) in &headers {
        abi::generate(family, src).unwrap_or_else(|e| panic!("{family}.h: {e}"));
    }
    let families: Vec<&str> = KERNEL_FAMILIES.iter().map(|f| f.0).collect();
    assert_eq!(families, headers.iter().map(|h| h.0.as_str()).collect::<Vec<_>>());
    let names = abi::entry_names(&headers.into_iter().map(|h| h.1).collect::<Vec<_>>()).unwrap();
    let listed: Vec<&str> = KERNEL_FAMILIES
        .iter()
        .flat_map(|f| f.1.iter())
        .map(|n| n.strip_suffix('\0').expect("NUL-terminated"))
        .collect();
    assert_eq!(listed, names);
    assert!(
        listed.contains(&"bang_get_indice_pairs_mark") && listed.contains(&"bang_check_float_rows")
    );
}

#[test]
fn c_types_map_to_their_rust_types() {
    let rust = abi::generate(
        "demo_family",
        "// a comment\n#pragma once\ntypedef struct BangDemo { int32_t lo[4]; float scale; } BangDemo;\n\
         BANG_EXPORT int bang_demo(cnrtQueue_t queue, uint32_t task_dim, const half *x, half *y,\n\
             const BangDemo *demo, int64_t n, const float *f, int32_t *out);",
    )
    .unwrap();
    assert!(
        rust.contains("pub struct Demo {\n    pub lo: [i32; 4],\n    pub scale: f32,\n}"),
        "{rust}"
    );
    let sig = "queue: crate::mlu::QueuePtr, task_dim: u32, x: *const u16, y: *mut u16, demo: *const Demo, n: i64, \
               f: *const f32, out: *mut i32";
    assert!(rust.contains(&format!("pub struct DemoFamilyKernels {{\n    pub bang_demo: unsafe extern \"C\" fn({sig}) -> i32,")), "{rust}");
    assert!(rust.contains(&format!("pub fn bang_demo({sig}) -> i32;")), "{rust}");
    assert!(rust.contains("(lib, crate::mlu::KERNEL_LIBRARY, \"bang_demo\\0\") }?"), "{rust}");
}

#[test]
fn a_header_outside_the_mapping_is_refused() {
    let refused = [
        ("BANG_EXPORT int e(cnrtQueue_t queue, long n);", "no Rust type for C `long`"),
        (
            "BANG_EXPORT int e(cnrtQueue_t queue, unsigned int n);",
            "unsupported C type `unsigned int`",
        ),
        (
            "BANG_EXPORT int e(int32_t n, cnrtQueue_t queue);",
            "the first parameter must be the cnrtQueue_t",
        ),
        (
            "typedef struct Geometry { int32_t a; } Geometry; BANG_EXPORT int e(cnrtQueue_t q);",
            "must start with Bang",
        ),
        ("BANG_EXPORT int e(cnrtQueue_t queue, const Other *o);", "no Rust type for C `Other`"),
        ("static int x; BANG_EXPORT int e(cnrtQueue_t queue);", "unexpected `static`"),
        ("BANG_EXPORT void e(cnrtQueue_t queue);", "expected `int`, found `void`"),
        ("#pragma once\n", "no launch entry"),
    ];
    for (src, why) in refused {
        let err = abi::generate("f", src).expect_err(src);
        assert!(err.contains(why), "{src}: {err}");
    }
}

#[test]
fn definitions_must_use_the_headers_parameter_names() {
    let header = "BANG_EXPORT int bang_mark(cnrtQueue_t queue, int32_t count, int32_t words);";
    let same =
        "BANG_EXPORT int bang_mark(cnrtQueue_t queue, int32_t count, int32_t words) { return 0; }";
    abi::check_definitions(same, header).unwrap();
    // Same types, so the compiler accepts the swap; the build does not.
    let swapped =
        "BANG_EXPORT int bang_mark(cnrtQueue_t queue, int32_t words, int32_t count) { return 0; }";
    let err = abi::check_definitions(swapped, header).unwrap_err();
    assert!(
        err.contains(r#"bang_mark: parameters ["queue", "words", "count"] in the .mlu"#),
        "{err}"
    );
    let extra = "BANG_EXPORT int bang_other(cnrtQueue_t queue) { return 0; }";
    let err = abi::check_definitions(extra, header).unwrap_err();
    assert!(err.contains("bang_other: defined in the .mlu, not declared in the header"), "{err}");
}

/// The generated structs' size and member offsets against the C compiler's, for the
/// headers' structs.
#[test]
fn struct_layouts_match_the_c_compilers() {
    let dir = std::env::temp_dir().join(format!("kernel_abi_layout_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let program = dir.join("layout.c");
    let members = |s: &str, fields: &[&str]| -> String {
        let mut out = format!("  printf(\"{s} %zu\\n\", sizeof({s}));\n");
        for f in fields {
            out += &format!("  printf(\"{s}.{f} %zu\\n\", offsetof({s}, {f}));\n");
        }
        out
    };
    let gip = ["in_space", "out_space", "kernel", "stride", "pad", "dilation", "subm"];
    let bounds = ["lo", "hi"];
    std::fs::write(
        &program,
        format!(
            "#include <stddef.h>\n#include <stdint.h>\n#include <stdio.h>\n#define BANG_EXPORT\ntypedef void *cnrtQueue_t;\n\
             #include \"sparse_conv/sparse_conv.h\"\n#include \"check/check.h\"\nint main(void) {{\n{}{}  return 0;\n}}\n",
            members("BangGipGeometry", &gip),
            members("BangIntBounds", &bounds)
        ),
    )
    .unwrap();
    let exe = dir.join("layout");
    let cc = Command::new("cc")
        .arg("-I")
        .arg(Path::new(ROOT).join("kernels"))
        .arg(&program)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(cc.status.success(), "{}", String::from_utf8_lossy(&cc.stderr));
    let out = String::from_utf8(Command::new(&exe).output().unwrap().stdout).unwrap();
    use std::mem::{offset_of, size_of};
    let rust = [
        ("BangGipGeometry", size_of::<GipGeometry>()),
        ("BangGipGeometry.in_space", offset_of!(GipGeometry, in_space)),
        ("BangGipGeometry.out_space", offset_of!(GipGeometry, out_space)),
        ("BangGipGeometry.kernel", offset_of!(GipGeometry, kernel)),
        ("BangGipGeometry.stride", offset_of!(GipGeometry, stride)),
        ("BangGipGeometry.pad", offset_of!(GipGeometry, pad)),
        ("BangGipGeometry.dilation", offset_of!(GipGeometry, dilation)),
        ("BangGipGeometry.subm", offset_of!(GipGeometry, subm)),
        ("BangIntBounds", size_of::<IntBounds>()),
        ("BangIntBounds.lo", offset_of!(IntBounds, lo)),
        ("BangIntBounds.hi", offset_of!(IntBounds, hi)),
    ];
    let rust: String = rust.iter().map(|(k, v)| format!("{k} {v}\n")).collect();
    assert_eq!(out, rust);
    let _ = std::fs::remove_dir_all(&dir);
}
