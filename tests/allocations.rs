//! The audit of host allocations sized by inputs or attributes (docs/CONTRACT.md §1.6: an
//! allocation that cannot be obtained is an error, never an abort). Every allocation
//! construct in the library's non-test code (`vec![x; n]`, `with_capacity`, `resize`,
//! `resize_with`, `to_vec`, `collect`, `partition`, `unzip`, `Box::new([..])`; code after a
//! `#[cfg(test)]` is skipped only to the end of the item it marks) must either go through the fallible
//! helpers of `src/scratch.rs` (not matched here) or be listed below with why its size is
//! bounded without them. A new site fails this test until it is made fallible or listed;
//! a listed site that no longer exists fails it too, so the list stays the audit.

use std::path::Path;

/// Sized by the schema (inputs, outputs, attributes), by a rank or an attribute array ONNX
/// Runtime already holds, or by the cards.
const META: &str = "schema, rank, attribute array or card count";
/// One row of a value rule: at most 5 values.
const ROW: &str = "one value-rule row (<= 5 values)";
/// A constant bound named at the site (radix digits, K <= 4096, task caps, 4 dims).
const CONST: &str = "bounded by a constant";
/// One entry per parallel task; tasks are cut from data already in memory by a grain.
const TASKS: &str = "one per task";
/// Per-task scratch of one row of an output that is already allocated and non-empty.
const OUTPUT_ROW: &str = "one row of an allocated, non-empty output";
/// DynamicScatter's D coordinate columns on the card: a row of D int32 fits the NRAM tile
/// (`forward_tiles` declines the launch otherwise), so D < NRAM_BUDGET / 12.
const NRAM_ROW: &str = "D columns, one NRAM row (forward_tiles)";
/// Inside a capacity reserved fallibly just before, or the fallible helpers themselves.
const FALLIBLE: &str = "within a fallible reservation";

/// (file, the line's start, why it needs no fallible allocation).
const AUDITED: &[(&str, &str, &str)] = &[
    (
        "src/ops/dynamic_scatter/bang.rs",
        "let host: Vec<i32> = bx.lo.iter().chain(&bx.stride)",
        NRAM_ROW,
    ),
    (
        "src/ops/dynamic_scatter/bang.rs",
        "(0..specs.len()).map(|i| outputs.allocate(i, &specs[i]))",
        META,
    ),
    ("src/ops/dynamic_scatter/bang.rs", "let mut lo = vec![i32::MAX; dd];", NRAM_ROW),
    ("src/ops/dynamic_scatter/bang.rs", "let mut hi = vec![-1i32; dd];", NRAM_ROW),
    ("src/ops/dynamic_scatter/bang.rs", "return Ok(CoordinateBox { lo: vec![0; dd]", NRAM_ROW),
    ("src/ops/dynamic_scatter/bang.rs", "let extents: Vec<u64> = lo.iter().zip(&hi)", NRAM_ROW),
    ("src/ops/dynamic_scatter/bang.rs", "let mut stride = vec![1i32; dd];", NRAM_ROW),
    (
        "src/ep/factory.rs",
        "let transfer = Transfer::new(cards.iter().map(|c| (c.id, Arc::clone(&c.d",
        META,
    ),
    ("src/ep/factory.rs", "let ids: Vec<u32> = self.cards.iter().map(|c| c.id).collect();", META),
    (
        "src/ep/provider.rs",
        "let order: Vec<&str> = ep.backends.order.iter().map(|b| b.name()).collect",
        META,
    ),
    ("src/ep/provider.rs", "serde_json::Value::Object(map.collect())", META),
    ("src/ops/device/backends.rs", "std::iter::once(\"auto\").chain(Backend::NAMES", META),
    ("src/mluops/mod.rs", ".collect::<Result<_>>()?;", META),
    ("src/ops/sparse_conv/get_indice_pairs/mluops.rs", "let mut counts = vec![0i32; k];", CONST),
    (
        "src/ops/device/mod.rs",
        "tensors.iter().map(|d| d.as_ref().map(|d| (d.dtype, d.shape.clone()))).co",
        META,
    ),
    ("src/ops/device/mod.rs", "let mut staged = Vec::with_capacity(tensors.len());", META),
    // At most Backend::COUNT backends each.
    (
        "src/ops/device/mod.rs",
        "paths.iter().map(|p| p(&op, backends)).partition(|k| backends.order.contains(&k.b",
        CONST,
    ),
    (
        "src/ops/device/mod.rs",
        "let elsewhere = left_out.iter().map(|k| k.backend()).collect();",
        CONST,
    ),
    (
        "src/lib.rs",
        "let backends: Vec<&str> = e.card_backends.iter().map(|b| b.name()).collec",
        CONST,
    ),
    (
        "src/lib.rs",
        "let names: Vec<&str> = ops::device::Backend::ALL.iter().map(|b| b.name()).",
        CONST,
    ),
    // One row per operator of the registry.
    ("src/lib.rs", ".collect();", META),
    (
        "src/ops/device/mod.rs",
        "let names: Vec<_> = self.elsewhere.iter().map(|b| b.name()).collect();",
        CONST,
    ),
    (
        "src/ops/device/mod.rs",
        "declined.iter().map(|(b, why)| format!(\"{}: {why}\", b.name())).collect",
        META,
    ),
    ("src/ops/device/drivers.rs", "shape: t.shape.iter().map(|&d| d as i64).collect(),", META),
    ("src/tensor.rs", ".collect::<std::result::Result<Vec<usize>, _>>()", META),
    ("src/ffi/attributes.rs", "let mut v = vec![0i64; n];", META),
    ("src/ffi/attributes.rs", "let mut buf = vec![0u8; needed];", META),
    (
        "src/ffi/custom_op.rs",
        "input_types: schema.inputs.iter().map(|f| onnx_type(schema.dtype(f, &bin",
        META,
    ),
    (
        "src/ffi/custom_op.rs",
        "output_types: schema.outputs.iter().map(|f| onnx_type(schema.dtype(f, &b",
        META,
    ),
    ("src/ffi/custom_op.rs", ".collect()", META),
    ("src/ffi/graph.rs", "let mut nodes: Vec<*const OrtNode> = vec![std::ptr::null(); n];", META),
    (
        "src/ffi/graph.rs",
        "Ok(nodes.into_iter().map(|ptr| unsafe { Node::from_raw(ptr) }).collect()",
        META,
    ),
    (
        "src/ffi/graph.rs",
        "let mut inputs: Vec<*const OrtValueInfo> = vec![std::ptr::null(); n];",
        META,
    ),
    ("src/ffi/graph.rs", "let mut shapes = Vec::with_capacity(n);", META),
    ("src/ffi/graph.rs", "let mut dims = vec![0i64; rank];", META),
    (
        "src/ffi/graph.rs",
        "shapes.push(Some(dims.into_iter().map(|d| usize::try_from(d).ok()).colle",
        META,
    ),
    ("src/ffi/kernel.rs", "let mut tensors = Vec::with_capacity(n);", META),
    (
        "src/ffi/kernel.rs",
        "Some(CardTensor { shape: shape.to_vec(), dtype, data: v.data()? })",
        META,
    ),
    (
        "src/ffi/kernel.rs",
        "let dims: Vec<i64> = spec.shape.iter().map(|&d| d as i64).collect();",
        META,
    ),
    ("src/ffi/kernel.rs", "let mut views = Vec::with_capacity(names.len());", META),
    ("src/ffi/kernel.rs", "let mut bufs = Vec::with_capacity(specs.len());", META),
    ("src/ffi/mod.rs", "let mut buf = vec![0u8; size.max(1)];", META),
    ("src/ops/device/checks.rs", "let mut v = vec![0i32; cols];", ROW),
    ("src/ops/device/checks.rs", "let mut v = vec![0f32; cols];", ROW),
    ("src/ops/device/mod.rs", ".collect();", META),
    ("src/ops/device/drivers.rs", ".collect();", META),
    ("src/ops/device/mod.rs", "let mut sizes = vec![None; inputs.len()];", META),
    ("src/ops/device/drivers.rs", "self.bufs.resize_with(index + 1, || None);", META),
    (
        "src/ops/dynamic_scatter/backward.rs",
        "let mut quotient = vec![0f32; if mean { c } else { 0 }];",
        OUTPUT_ROW,
    ),
    ("src/ops/dynamic_scatter/backward.rs", "let zeros = vec![0f32; c];", OUTPUT_ROW),
    ("src/ops/dynamic_scatter/backward.rs", "slots.resize_with(total, || None);", FALLIBLE),
    (
        "src/ops/dynamic_scatter/backward.rs",
        "let mut first_voxel = Vec::with_capacity(tasks + 1);",
        TASKS,
    ),
    ("src/ops/dynamic_scatter/backward.rs", "let mut taken = vec![0u32; c];", OUTPUT_ROW),
    ("src/ops/dynamic_scatter/backward.rs", "let mut row = vec![0f32; c];", OUTPUT_ROW),
    ("src/ops/host.rs", "self.specs = specs.to_vec();", META),
    (
        "src/ops/host.rs",
        "Ok(Outputs::new(self.names.clone(), self.data.iter_mut().map(OwnedData::",
        META,
    ),
    (
        "src/ops/operator.rs",
        "let refs: Vec<Option<TensorRef<'_>>> = inputs.iter().map(|t| t.map(Tenso",
        META,
    ),
    ("src/ops/host.rs", "self.owned.specs = specs.to_vec();", META),
    ("src/ops/host.rs", "Ok(Outputs::new(self.owned.names.clone(), parts.collect()))", META),
    ("src/ops/host.rs", "parts.collect()", META),
    ("src/ops/psroipool/backward.rs", ".collect::<std::result::Result<_, _>>()", CONST),
    ("src/ops/psroipool/backward.rs", "let mut values = vec![0f32; od];", OUTPUT_ROW),
    ("src/ops/psroipool/forward.rs", "let mut rows = vec![Span::default(); p];", OUTPUT_ROW),
    ("src/ops/psroipool/forward.rs", "let mut cols = vec![Span::default(); p];", OUTPUT_ROW),
    ("src/ops/psroipool/forward.rs", "let mut acc = vec![0f32; od];", OUTPUT_ROW),
    (
        "src/ops/rules.rs",
        ".map(|row| (row, RowValues::I32(data[row * cols..(row + 1) * cols].to_ve",
        ROW,
    ),
    (
        "src/ops/rules.rs",
        ".map(|row| (row, RowValues::F32(data[row * cols..(row + 1) * cols].to_ve",
        ROW,
    ),
    (
        "src/ops/sparse_conv/get_indice_pairs/rulebook.rs",
        "rows: vec![Vec::new(); kernel_volume],",
        CONST,
    ),
    (
        "src/ops/sparse_conv/get_indice_pairs/rulebook.rs",
        "keys: vec![Vec::new(); kernel_volume],",
        CONST,
    ),
    (
        "src/ops/sparse_conv/get_indice_pairs/rulebook.rs",
        "starts: if dense.is_some() { Vec::new() } else { vec![0; prefix_mask + 2] },",
        CONST,
    ),
    (
        "src/ops/sparse_conv/get_indice_pairs/rulebook.rs",
        "blocks.resize_with(pieces(data.len() / 4, emit_rows), Emitted::empty);",
        TASKS,
    ),
    (
        "src/ops/sparse_conv/get_indice_pairs/rulebook.rs",
        "let mut counts = vec![0usize; prefix_mask + 1];",
        CONST,
    ),
    (
        "src/ops/sparse_conv/get_indice_pairs/rulebook.rs",
        "let mut ranges: Vec<Vec<K>> = vec![Vec::new(); cuts.len() - 1];",
        TASKS,
    ),
    ("src/ops/sparse_conv/get_indice_pairs/rulebook.rs", ".collect()", CONST),
    (
        "src/ops/sparse_conv/get_indice_pairs/rulebook.rs",
        "let mut ptrs = vec![0usize; x_taps.len()];",
        CONST,
    ),
    (
        "src/ops/sparse_conv/get_indice_pairs/rulebook.rs",
        "let counts: Vec<AtomicUsize> = (0..num.len()).map(|_| AtomicUsize::new(0",
        CONST,
    ),
    (
        "src/ops/sparse_conv/indice_conv/mod.rs",
        "books.resize_with(n_pieces, Piece::default);",
        TASKS,
    ),
    (
        "src/schema.rs",
        "Some(c) => c.allowed_types.iter().filter_map(|t| DType::from_onnx_name(t",
        META,
    ),
    (
        "src/schema.rs",
        "None => DType::from_onnx_name(&formal.type_str).into_iter().collect(),",
        META,
    ),
    (
        "src/schema.rs",
        "c.allowed_types.iter().filter_map(|t| DType::from_onnx_name(t)).collect(",
        META,
    ),
    ("src/schema.rs", "self.inputs.iter().map(|f| f.name.clone()).collect()", META),
    ("src/schema.rs", "self.outputs.iter().map(|f| f.name.clone()).collect()", META),
    ("src/scratch.rs", "v.resize(len, value);", FALLIBLE),
    ("src/scratch.rs", "let mut v = with_capacity(iter.size_hint().0, what)?;", FALLIBLE),
    ("src/tensor.rs", "let mut shapes = Vec::with_capacity(tensors.len());", META),
    ("src/tensor.rs", "let mut dims = Vec::with_capacity(t.shape.len());", META),
    ("src/tensor.rs", "shape: self.shape.iter().map(|&d| d as i64).collect(),", META),
    ("src/schema.rs", ".collect(),", META),
    (
        "src/schema.rs",
        "AttrValue::Ints(v.as_array()?.iter().map(|x| x.as_i64()).collect::<Optio",
        META,
    ),
    ("src/ep/kernel.rs", ".collect::<Vec<_>>()", META),
    ("src/ep/doctor.rs", ".collect();", META),
    (
        "src/ep/doctor.rs",
        "entries.iter().map(|e| e.trim_end_matches('\\0')).collect::<Vec<_>>().joi",
        META,
    ),
    ("src/ops/host.rs", ".collect()", META),
    ("src/ops/host.rs", ".collect();", META),
    (
        "src/ops/device/mod.rs",
        "staged.iter().map(|t| t.as_ref().map(Tensor::view)).collect();",
        META,
    ),
    (
        "src/ops/device/mod.rs",
        "shape.iter().map(|&d| usize::try_from(d)).collect::<std::result::Result<",
        META,
    ),
    (
        "src/ops/psroipool/forward.rs",
        "(vec![Span::default(); d.pooled], vec![Span::default(); d.pooled]);",
        OUTPUT_ROW,
    ),
    ("src/ops/psroipool/backward.rs", ".collect();", CONST),
    (
        "src/ops/sparse_conv/get_indice_pairs/rulebook.rs",
        "book.taps[2].iter().enumerate().filter_map(|(kx, t)| Some((kx, (*t)?))).",
        CONST,
    ),
    (
        "src/ops/sparse_conv/get_indice_pairs/rulebook.rs",
        "chunk.chunks_exact_mut(2 * l).map(|c| c.split_at_mut(l)).collect();",
        CONST,
    ),
    (
        "src/ops/sparse_conv/indice_conv/mod.rs",
        "cuts.iter().map(|&t| (t * tile_rows).min(dims.rows) * cout).collect();",
        TASKS,
    ),
    ("src/ops/voxel_pooling/forward.rs", ".collect())", TASKS),
    (
        "src/ops/dynamic_scatter/backward.rs",
        "first_voxel.iter().map(|&vx| csr.offsets.get(vx).copied().unwrap_or(tota",
        TASKS,
    ),
    (
        "src/mluops/mod.rs",
        "dirs.iter().flat_map(|d| [format!(\"{d}libmluops.so\"), format!(\"{d}libmlu",
        META,
    ),
    ("src/ffi/attributes.rs", ".collect::<Vec<_>>()", META),
    ("src/ffi/attributes.rs", "Ok(vec![0u8; needed])", META),
];

const PATTERNS: &[&str] = &[
    "with_capacity(",
    ".resize(",
    ".resize_with(",
    "Box::new([",
    ".to_vec()",
    ".collect",
    ".partition(",
    ".unzip(",
];

/// `vec![x; n]`: a `vec![` with a `;` before its closing bracket.
fn sized_vec(line: &str) -> bool {
    line.split("vec![")
        .skip(1)
        .any(|rest| rest.split(']').next().is_some_and(|inside| inside.contains(';')))
}

/// Allocation sites of the non-test code of one file: (file, trimmed line). A `tests.rs`
/// is a module's unit tests (`#[cfg(test)] mod tests;`): none.
fn sites(file: &Path, rel: &str) -> Vec<(String, String)> {
    if file.file_name().is_some_and(|n| n == "tests.rs") {
        return Vec::new();
    }
    let text = std::fs::read_to_string(file).unwrap();
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let t = line.trim();
        if t.starts_with("#[cfg(test)]") {
            skip_item(&mut lines);
            continue;
        }
        if t.starts_with("//") || t.contains("scratch::") {
            continue;
        }
        if sized_vec(t) || PATTERNS.iter().any(|p| t.contains(p)) {
            out.push((rel.to_string(), t.to_string()));
        }
    }
    out
}

/// Skips the item a `#[cfg(test)]` introduces (its further attributes, then one line ending
/// in `;` or the lines up to the brace that closes its first `{`), so what follows it is
/// still scanned. Braces are counted naively: test items here have balanced braces in
/// their strings too (format strings).
fn skip_item<'a>(lines: &mut impl Iterator<Item = &'a str>) {
    let mut depth = 0usize;
    let mut opened = false;
    for line in lines {
        let t = line.trim();
        if !opened && (t.starts_with("#[") || t.is_empty() || t.starts_with("//")) {
            continue;
        }
        for c in t.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        if (opened && depth == 0) || (!opened && t.ends_with(';')) {
            return;
        }
    }
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_allocation_is_fallible_or_audited() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let mut found = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
        found.extend(sites(f, &rel));
    }
    let unaudited: Vec<_> = found
        .iter()
        .filter(|(f, line)| {
            !AUDITED.iter().any(|(af, start, _)| af == f && line.starts_with(start))
        })
        .collect();
    assert!(
        unaudited.is_empty(),
        "allocations neither fallible (src/scratch.rs) nor audited in tests/allocations.rs: {unaudited:#?}"
    );
    let stale: Vec<_> = AUDITED
        .iter()
        .filter(|(af, start, _)| !found.iter().any(|(f, line)| af == f && line.starts_with(start)))
        .collect();
    assert!(stale.is_empty(), "audited allocations that no longer exist: {stale:#?}");
    assert!(AUDITED.iter().all(|(_, _, why)| !why.is_empty()));
}

#[test]
fn the_scan_sees_the_constructs() {
    assert!(sized_vec("let v = vec![0u8; n];"));
    assert!(!sized_vec("let v = vec![a, b];"));
    let dir = std::env::temp_dir().join(format!("alloc_scan_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("x.rs");
    std::fs::write(&f, "fn a(n: usize) { let v = vec![0; n]; let w: Vec<u8> = (0..n).map(|i| i as u8).collect();\n// vec![0; n]\nlet s = scratch::filled(n, 0, \"x\");\n}\n#[cfg(test)]\nmod t { fn b() { let v = vec![0; 9]; } }\n").unwrap();
    let found = sites(&f, "x.rs");
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
}
