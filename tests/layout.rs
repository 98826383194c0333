//! The layering rules of docs/LAYOUT.md that a grep can check: only src/ffi/ calls ONNX
//! Runtime and, under it, only the custom-op host names the operators; the device runtime
//! (src/mlu/) and the MLU-OPS binding (src/mluops/) know no operator; unit tests over 150
//! lines live in their own file; and every path docs/LAYOUT.md names exists.

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

/// File extensions that make a backticked name in docs/LAYOUT.md a repository file.
const PATH_EXTENSIONS: &[&str] =
    &["rs", "py", "md", "json", "toml", "sh", "h", "cpp", "txt", "onnx"];

/// Whether a backticked span of docs/LAYOUT.md names a repository path: no spaces (a command
/// is checked by its first word), no `::`, and a `/` or a file extension. Build outputs
/// (`target/...`) are not in a checkout.
fn layout_path(span: &str) -> Option<&str> {
    let word = span.split_whitespace().next()?;
    let looks = !word.contains("::")
        && !word.starts_with(['-', '.'])
        && !word.starts_with("target/")
        && word.chars().all(|c| c.is_ascii_alphanumeric() || "_-./<>{},".contains(c))
        && (word.contains('/')
            || word.rsplit_once('.').is_some_and(|(_, ext)| PATH_EXTENSIONS.contains(&ext)));
    looks.then_some(word)
}

/// `{a,b}` alternatives expanded (one group per path segment at most).
fn alternatives(segment: &str) -> Vec<String> {
    match (segment.find('{'), segment.find('}')) {
        (Some(open), Some(close)) if open < close => segment[open + 1..close]
            .split(',')
            .map(|alt| format!("{}{alt}{}", &segment[..open], &segment[close + 1..]))
            .collect(),
        _ => vec![segment.to_owned()],
    }
}

/// Whether `name` matches `pattern`, where each `<placeholder>` stands for any non-empty text.
fn matches(pattern: &str, name: &str) -> bool {
    let Some(open) = pattern.find('<') else { return pattern == name };
    let close = pattern[open..].find('>').map_or(pattern.len(), |c| open + c + 1);
    let (head, rest) = (&pattern[..open], &pattern[close..]);
    name.strip_prefix(head).is_some_and(|tail| {
        (1..=tail.len()).any(|n| tail.is_char_boundary(n) && matches(rest, &tail[n..]))
    })
}

/// Whether `segments` name an entry under `dir`: a `<placeholder>` segment when any entry
/// matches, `{a,b}` when every alternative exists (each is a name the layout vouches for); a
/// trailing `/` asks for a folder.
fn exists_under(dir: &Path, segments: &[&str], folder: bool) -> bool {
    let Some((first, rest)) = segments.split_first() else {
        return !folder || dir.is_dir();
    };
    alternatives(first).iter().all(|segment| {
        let candidates: Vec<PathBuf> = if segment.contains('<') {
            std::fs::read_dir(dir)
                .map(|entries| {
                    entries
                        .flatten()
                        .filter(|e| matches(segment, &e.file_name().to_string_lossy()))
                        .map(|e| e.path())
                        .collect()
                })
                .unwrap_or_default()
        } else {
            vec![dir.join(segment)]
        };
        candidates.iter().any(|c| c.exists() && exists_under(c, rest, folder))
    })
}

/// The paths docs/LAYOUT.md names that are not in the checkout. A name is looked up from the
/// repository root, else from the folders of the paths named before it in the same entry
/// and their parents (`backward.rs` in the entry of `src/ops/<family>/`).
fn missing_layout_paths(layout: &str, root: &Path) -> Vec<String> {
    let mut missing = Vec::new();
    let mut bases: Vec<String> = Vec::new();
    for (n, line) in layout.lines().enumerate() {
        if line.starts_with("- ") || line.starts_with('#') {
            bases.clear();
        }
        for span in line.split('`').skip(1).step_by(2) {
            let Some(path) = layout_path(span) else { continue };
            let folder = path.ends_with('/');
            let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
            let mut dirs = vec![String::new()];
            for base in &bases {
                let mut b = base.as_str();
                while !b.is_empty() {
                    dirs.push(b.to_owned());
                    b = b.rsplit_once('/').map_or("", |(parent, _)| parent);
                }
            }
            let found = dirs.iter().find(|d| {
                let full: Vec<&str> = d
                    .split('/')
                    .filter(|s| !s.is_empty())
                    .chain(segments.iter().copied())
                    .collect();
                exists_under(root, &full, folder)
            });
            let Some(found) = found else {
                missing.push(format!("docs/LAYOUT.md:{}: `{path}`", n + 1));
                continue;
            };
            // Later names of the entry may be relative to this one's folder.
            let dir = if folder {
                path.trim_end_matches('/')
            } else {
                path.rsplit_once('/').map_or("", |(d, _)| d)
            };
            if !dir.is_empty() {
                bases.push(if found.is_empty() {
                    dir.to_owned()
                } else {
                    format!("{found}/{dir}")
                });
            }
        }
    }
    missing
}

#[test]
fn the_layout_pattern_finds_paths_and_only_paths() {
    assert_eq!(layout_path("src/ops/<family>/"), Some("src/ops/<family>/"));
    assert_eq!(layout_path("backward.rs"), Some("backward.rs"));
    assert_eq!(layout_path("scripts/fuzz.sh --merge"), Some("scripts/fuzz.sh"));
    for not_a_path in [
        "ops::ALL",
        "cargo run --example build_models",
        "onnxruntime_ep_mlu.torch",
        "CardNode",
        ".npz",
        "target/fuzz/corpus",
    ] {
        assert_eq!(layout_path(not_a_path), None, "{not_a_path}");
    }
    assert!(matches("<op>.json", "indice_conv.json") && !matches("<op>.json", ".json"));
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let planted = "- `src/ops/<family>/` — `backward.rs`, `no_such_file.rs`, `get_indice_pairs/{mod,nope}.rs`\n";
    assert_eq!(
        missing_layout_paths(planted, root),
        [
            "docs/LAYOUT.md:1: `no_such_file.rs`",
            "docs/LAYOUT.md:1: `get_indice_pairs/{mod,nope}.rs`"
        ],
        "names found nowhere, and each alternative, are reported"
    );
}

#[test]
fn every_path_docs_layout_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let layout = std::fs::read_to_string(root.join("docs/LAYOUT.md")).expect("docs/LAYOUT.md");
    let missing = missing_layout_paths(&layout, root);
    assert!(
        missing.is_empty(),
        "docs/LAYOUT.md names paths that do not exist:\n{}",
        missing.join("\n")
    );
}
