//! The layering rules of docs/LAYOUT.md that a grep can check: only src/ffi/ calls ONNX
//! Runtime and, under it, only the custom-op host names the operators; the device runtime
//! (src/mlu/) and the MLU-OPS binding (src/mluops/) know no operator; unit tests over 150
//! lines live in their own file.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code lines of a file (comment lines dropped), numbered from 1.
fn code_lines(path: &Path) -> Vec<(usize, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l.to_owned()))
        .collect()
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// A call through a C function table: `(<expr>.<Member>)(`, the member capitalised as in
/// `OrtApi`, `OrtEpApi` and `OrtApiBase` (`(api.KernelContext_GetInput)(`,
/// `((*base).GetVersionString)(`).
fn table_call(line: &str) -> bool {
    let bytes = line.as_bytes();
    (1..bytes.len()).filter(|&i| bytes[i - 1] == b')' && bytes[i] == b'(').any(|close| {
        let close = close - 1;
        let mut depth = 0usize;
        let open = (0..=close).rev().find(|&j| {
            match bytes[j] {
                b')' => depth += 1,
                b'(' => depth -= 1,
                _ => {}
            }
            depth == 0
        });
        let Some(open) = open else { return false };
        let inner = &line[open + 1..close];
        inner.rsplit_once('.').is_some_and(|(_, member)| {
            member.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                && member.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    })
}

#[test]
fn the_table_call_pattern_finds_calls_and_only_calls() {
    assert!(table_call("check(unsafe { (api.KernelContext_GetInput)(ctx, i, &mut v) })"));
    assert!(table_call("let s = unsafe { (api().CreateStatus)(code, c.as_ptr()) };"));
    assert!(table_call("CStr::from_ptr(((*api_base).GetVersionString)())"));
    assert!(!table_call("(job.f)(i)"));
    assert!(!table_call("(0..tasks).for_each(f)"));
    assert!(!table_call("unsafe { std::slice::from_raw_parts(p, n) }"));
}

#[test]
fn only_the_ffi_module_calls_onnx_runtime() {
    let ffi = src().join("ffi");
    let mut files = Vec::new();
    sources(&src(), &mut files);
    files.retain(|f| !f.starts_with(&ffi));
    let found = lines_where(&files, |_, line| {
        line.contains("api()") || line.contains("ep_api()") || table_call(line)
    });
    assert!(found.is_empty(), "ONNX Runtime called outside src/ffi/:\n{}", found.join("\n"));
}

#[test]
fn the_device_runtime_knows_no_operator() {
    let mut files = Vec::new();
    sources(&src().join("mlu"), &mut files);
    let mut found = uses_of_ops(&files);
    // Nor any family's kernels: their entry tables are generated into the families.
    let families: Vec<String> = std::fs::read_dir(src().join("ops"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        // ops/device/ is the card driver, not a family (and "device" is the runtime's word).
        .filter(|name| name != "device")
        .collect();
    assert!(families.len() >= 5, "{families:?}");
    found.extend(lines_where(&files, |_, l| {
        families.iter().any(|family| l.contains(family.as_str()))
    }));
    assert!(found.is_empty(), "src/mlu/ uses the operators:\n{}", found.join("\n"));
}

/// The code lines of `files` for which `pred(file, line)` holds, as `file:line: text`.
fn lines_where(files: &[PathBuf], pred: impl Fn(&Path, &str) -> bool) -> Vec<String> {
    files
        .iter()
        .flat_map(|f| code_lines(f).into_iter().map(move |(n, l)| (f, n, l)))
        .filter(|(f, _, l)| pred(f, l))
        .map(|(f, n, l)| format!("{}:{n}: {}", f.display(), l.trim()))
        .collect()
}

/// `crate::ops` named in the code lines of `files`.
fn uses_of_ops(files: &[PathBuf]) -> Vec<String> {
    lines_where(files, |_, l| l.contains("crate::ops"))
}

#[test]
fn under_ffi_only_the_custom_op_host_knows_the_operators() {
    let mut files = Vec::new();
    sources(&src().join("ffi"), &mut files);
    files.retain(|f| !f.ends_with("custom_op.rs"));
    let found = uses_of_ops(&files);
    assert!(
        found.is_empty(),
        "src/ffi/ (but custom_op.rs) uses the operators:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_mlu_ops_binding_knows_no_operator() {
    let mut files = Vec::new();
    sources(&src().join("mluops"), &mut files);
    let found = uses_of_ops(&files);
    assert!(found.is_empty(), "src/mluops/ uses the operators:\n{}", found.join("\n"));
}

/// Unit tests longer than this live in a sibling file (`mod tests;`), not inline.
const INLINE_TEST_LINES: usize = 150;

#[test]
fn inline_test_modules_are_short() {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let mut long = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("source");
        let lines: Vec<&str> = text.lines().collect();
        let Some(start) = lines.iter().position(|l| l.trim_start().starts_with("mod tests {"))
        else {
            continue;
        };
        // The module's closing brace at its own indentation.
        let indent = lines[start].len() - lines[start].trim_start().len();
        let close = format!("{}}}", " ".repeat(indent));
        let end =
            lines[start..].iter().position(|l| *l == close).map_or(lines.len(), |e| start + e);
        if end - start > INLINE_TEST_LINES {
            long.push(format!(
                "{}: mod tests of {} lines (line {})",
                file.display(),
                end - start,
                start + 1
            ));
        }
    }
    assert!(
        long.is_empty(),
        "inline test modules over {INLINE_TEST_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// One error type through the crate: no function returns a bare `String` (or another error
/// type) as its error, and ONNX Runtime statuses come from `ffi::guard` only.
#[test]
fn one_error_type_and_one_status_conversion() {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let found = lines_where(&files, |f, l| {
        let bare =
            l.contains("Result<") && (l.contains(", String>") || l.contains(", &'static str>"));
        bare || (l.contains("CreateStatus") && !f.ends_with("ffi/mod.rs"))
    });
    assert!(found.is_empty(), "a second error type or status conversion:\n{}", found.join("\n"));
}
