//! The kernels' C ABI is written once, in kernels/<family>/<family>.h: each .mlu includes its
//! header, so the C++ compiler holds the entry definitions' types to it, and this test holds
//! the Rust declarations to it: the launch entries of `mlu::KERNEL_SIGNATURES` (the
//! `kernels!` table) and the structs declared with `c_struct!`, by name, count, order and
//! type of every parameter and member. It also checks the parameter names of the .mlu
//! definitions the compiler cannot see (its types are checked, names are not).

use onnxruntime_ep_mlu::mlu::KERNEL_SIGNATURES;
use onnxruntime_ep_mlu::mlu::{GipGeometry, IntBounds};
use std::collections::BTreeSet;
use std::path::Path;

/// A Rust declaration's (name, Rust type) list.
type Fields<'a> = &'a [(&'a str, &'a str)];
type Signature<'a> = (&'a str, Fields<'a>);

/// The headers' structs with their Rust counterparts: (C name, Rust name, Rust fields).
const STRUCTS: &[(&str, &str, Fields)] =
    &[("MluopsGipGeometry", "GipGeometry", GipGeometry::FIELDS), ("MluopsIntBounds", "IntBounds", IntBounds::FIELDS)];

/// A parameter or struct member: C type tokens, name, array length.
struct Decl {
    ty: Vec<String>,
    name: String,
    len: Option<String>,
}

struct Entry {
    name: String,
    params: Vec<Decl>,
}

struct CStruct {
    name: String,
    fields: Vec<Decl>,
}

#[derive(Default)]
struct Header {
    entries: Vec<Entry>,
    structs: Vec<CStruct>,
}

/// Identifiers/numbers and single punctuation characters, without comments, string
/// literals and preprocessor directives (continuation lines included).
fn tokens(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = src.chars().peekable();
    let mut line_start = true;
    while let Some(c) = chars.next() {
        match c {
            '\n' => line_start = true,
            c if c.is_whitespace() => {}
            '#' if line_start => {
                let mut prev = '#';
                while let Some(c) = chars.next_if(|&c| c != '\n' || prev == '\\') {
                    prev = c;
                }
            }
            '/' if chars.peek() == Some(&'/') => while chars.next_if(|&c| c != '\n').is_some() {},
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut prev = ' ';
                for c in chars.by_ref() {
                    if prev == '*' && c == '/' {
                        break;
                    }
                    prev = c;
                }
            }
            '"' => {
                let mut prev = ' ';
                for c in chars.by_ref() {
                    if c == '"' && prev != '\\' {
                        break;
                    }
                    prev = c;
                }
            }
            c if c.is_alphanumeric() || c == '_' => {
                let mut word = c.to_string();
                while let Some(c) = chars.next_if(|&c| c.is_alphanumeric() || c == '_') {
                    word.push(c);
                }
                out.push(word);
            }
            c => out.push(c.to_string()),
        }
        if c != '\n' && !c.is_whitespace() {
            line_start = false;
        }
    }
    out
}

struct Cursor<'a> {
    toks: &'a [String],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn next(&mut self) -> Result<&'a str, String> {
        let t = self.toks.get(self.at).ok_or("unexpected end")?;
        self.at += 1;
        Ok(t)
    }

    fn expect(&mut self, want: &str) -> Result<(), String> {
        match self.next()? {
            t if t == want => Ok(()),
            t => Err(format!("expected `{want}`, found `{t}` (token {})", self.at - 1)),
        }
    }

    /// Tokens up to (not including) the next `end`, which is consumed.
    fn until(&mut self, end: &str) -> Result<&'a [String], String> {
        let start = self.at;
        let len = self.toks[start..].iter().position(|t| t == end).ok_or(format!("no `{end}`"))?;
        self.at += len + 1;
        Ok(&self.toks[start..start + len])
    }

    /// `MLUOPS_EXPORT int name(type name, ...)`, the cursor on MLUOPS_EXPORT.
    fn prototype(&mut self) -> Result<Entry, String> {
        self.expect("MLUOPS_EXPORT")?;
        self.expect("int")?;
        let name = self.next()?.to_owned();
        self.expect("(")?;
        let params = self.until(")")?.split(|t| t == ",").map(decl).collect::<Result<_, _>>()?;
        Ok(Entry { name, params })
    }
}

/// `type name` or `type name[len]`.
fn decl(toks: &[String]) -> Result<Decl, String> {
    let (toks, len) = match toks {
        [head @ .., open, len, close] if open == "[" && close == "]" => (head, Some(len.clone())),
        _ => (toks, None),
    };
    match toks {
        [ty @ .., name] if !ty.is_empty() => Ok(Decl { ty: ty.to_vec(), name: name.clone(), len }),
        _ => Err(format!("not a declaration: {}", toks.join(" "))),
    }
}

/// A header: `typedef struct X { ... } X;` and `MLUOPS_EXPORT int ...(...);`, nothing else.
fn parse_header(src: &str) -> Result<Header, String> {
    let toks = tokens(src);
    let mut c = Cursor { toks: &toks, at: 0 };
    let mut header = Header::default();
    while let Some(t) = toks.get(c.at) {
        match t.as_str() {
            "typedef" => {
                c.next()?;
                c.expect("struct")?;
                let name = c.next()?.to_owned();
                c.expect("{")?;
                let body = c.until("}")?;
                let fields = body.split(|t| t == ";").filter(|f| !f.is_empty()).map(decl).collect::<Result<_, _>>()?;
                c.expect(&name)?;
                c.expect(";")?;
                header.structs.push(CStruct { name, fields });
            }
            "MLUOPS_EXPORT" => {
                header.entries.push(c.prototype()?);
                c.expect(";")?;
            }
            t => return Err(format!("unexpected `{t}` (token {})", c.at)),
        }
    }
    Ok(header)
}

/// The entry definitions written out in a .mlu (not those a macro generates).
fn mlu_definitions(src: &str) -> Result<Vec<Entry>, String> {
    let toks = tokens(src);
    let mut out = Vec::new();
    for at in (0..toks.len()).filter(|&i| toks[i] == "MLUOPS_EXPORT") {
        let mut c = Cursor { toks: &toks, at };
        out.push(c.prototype()?);
        c.expect("{")?;
    }
    Ok(out)
}

/// The Rust type a C type is declared as, as tokens (see [`rust_type`]).
fn rust_of_c(d: &Decl) -> Result<Vec<String>, String> {
    let scalar = |t: &[String]| -> Result<String, String> {
        let rust = match t {
            [t] => match t.as_str() {
                "int32_t" => "i32",
                "uint32_t" => "u32",
                "int64_t" => "i64",
                "uint64_t" => "u64",
                "float" => "f32",
                // float16 crosses as its bits.
                "half" => "u16",
                "cnrtQueue_t" => "QueuePtr",
                s => STRUCTS.iter().find(|st| st.0 == s).map(|st| st.1).ok_or(format!("no Rust type for C `{s}`"))?,
            },
            _ => return Err(format!("unsupported C type `{}`", t.join(" "))),
        };
        Ok(rust.to_owned())
    };
    let s = |v: &[&str]| v.iter().map(|t| t.to_string()).collect::<Vec<_>>();
    let ty = match d.ty.as_slice() {
        [inner @ .., star] if star == "*" => match inner {
            [c, rest @ ..] if c == "const" => s(&["*", "const", &scalar(rest)?]),
            _ => s(&["*", "mut", &scalar(inner)?]),
        },
        t => vec![scalar(t)?],
    };
    Ok(match &d.len {
        Some(n) => [s(&["["]), ty, s(&[";", n, "]"])].concat(),
        None => ty,
    })
}

/// A stringified Rust type as tokens, paths reduced to their last segment.
fn rust_type(s: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut after_colon = false;
    for t in tokens(s) {
        if t == ":" {
            if !after_colon {
                out.pop();
            }
            after_colon = true;
            continue;
        }
        after_colon = false;
        out.push(t);
    }
    out
}

/// Type tokens written as Rust: `*const f32`, `[i32; 3]`.
fn show(tokens: &[String]) -> String {
    tokens.join(" ").replace("* ", "*").replace("[ ", "[").replace(" ;", ";").replace(" ]", "]")
}

/// Declarations (parameters or members) of `what` against the Rust (name, type) list.
fn compare_decls(what: &str, c: &[Decl], rust: Fields, report: &mut Vec<String>) {
    let c_names: Vec<&str> = c.iter().map(|d| d.name.as_str()).collect();
    let rust_names: Vec<&str> = rust.iter().map(|r| r.0).collect();
    if c_names.len() != rust_names.len() {
        report.push(format!("{what}: {} in C {c_names:?}, {} in Rust {rust_names:?}", c.len(), rust.len()));
        return;
    }
    for (i, (d, (name, ty))) in c.iter().zip(rust).enumerate() {
        let expected = rust_of_c(d);
        if d.name != *name || expected.as_ref() != Ok(&rust_type(ty)) {
            let expected = expected.map(|t| show(&t)).unwrap_or_else(|e| e);
            let len = d.len.as_ref().map(|n| format!("[{n}]")).unwrap_or_default();
            report.push(format!(
                "{what} #{i}: C `{} {}{len}` (Rust `{expected}`), Rust `{name}: {ty}`",
                d.ty.join(" "),
                d.name
            ));
        }
    }
}

/// Every mismatch between the headers' entries and the Rust declarations.
fn compare_entries(c: &[Entry], rust: &[Signature]) -> Vec<String> {
    let mut report = Vec::new();
    let c_names: BTreeSet<&str> = c.iter().map(|e| e.name.as_str()).collect();
    if c_names.len() != c.len() {
        report.push("an entry is declared twice in the headers".to_owned());
    }
    for e in c {
        match rust.iter().find(|r| r.0 == e.name) {
            Some(r) => compare_decls(&e.name, &e.params, r.1, &mut report),
            None => report.push(format!("{}: in a header, not in kernels! (src/mlu/mod.rs)", e.name)),
        }
    }
    for r in rust.iter().filter(|r| !c_names.contains(r.0)) {
        report.push(format!("{}: in kernels! (src/mlu/mod.rs), in no header", r.0));
    }
    report
}

/// Every mismatch between the headers' structs and their Rust counterparts of [`STRUCTS`].
fn compare_structs(c: &[CStruct]) -> Vec<String> {
    let mut report = Vec::new();
    for s in c {
        match STRUCTS.iter().find(|r| r.0 == s.name) {
            Some(r) => compare_decls(&s.name, &s.fields, r.2, &mut report),
            None => report.push(format!("struct {}: no Rust counterpart in STRUCTS", s.name)),
        }
    }
    for r in STRUCTS.iter().filter(|r| !c.iter().any(|s| s.name == r.0)) {
        report.push(format!("struct {}: in STRUCTS, in no header", r.0));
    }
    report
}

/// Every kernels/<family>/ with a <family>.mlu: (family, .mlu source, .h source).
fn families() -> Vec<(String, String, String)> {
    let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let mut out = Vec::new();
    for dir in std::fs::read_dir(&kernels).unwrap().flatten() {
        let family = dir.file_name().to_string_lossy().into_owned();
        let mlu = dir.path().join(format!("{family}.mlu"));
        if mlu.exists() {
            let header = dir.path().join(format!("{family}.h"));
            let h = std::fs::read_to_string(&header).unwrap_or_else(|e| panic!("{}: {e}", header.display()));
            out.push((family, std::fs::read_to_string(mlu).unwrap(), h));
        }
    }
    out.sort();
    out
}

fn signature(name: &str) -> Signature<'static> {
    *KERNEL_SIGNATURES.iter().find(|s| s.0 == name).unwrap()
}

#[test]
fn the_headers_match_the_rust_declarations() {
    let mut all = Header::default();
    let mut report = Vec::new();
    for (family, mlu, h) in &families() {
        let include = format!("#include \"{family}.h\"");
        assert!(mlu.lines().any(|l| l.trim() == include), "{family}.mlu does not include {family}.h");
        let header = parse_header(h).unwrap_or_else(|e| panic!("{family}.h: {e}"));
        // The compiler checks the definitions' types against the header, not their names.
        for def in mlu_definitions(mlu).unwrap_or_else(|e| panic!("{family}.mlu: {e}")) {
            match header.entries.iter().find(|e| e.name == def.name) {
                Some(decl) => {
                    let names = |e: &Entry| e.params.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
                    if names(decl) != names(&def) {
                        report.push(format!(
                            "{}: parameters {:?} in {family}.mlu, {:?} in {family}.h",
                            def.name,
                            names(&def),
                            names(decl)
                        ));
                    }
                }
                None => report.push(format!("{}: defined in {family}.mlu, not declared in {family}.h", def.name)),
            }
        }
        all.entries.extend(header.entries);
        all.structs.extend(header.structs);
    }
    report.extend(compare_entries(&all.entries, KERNEL_SIGNATURES));
    report.extend(compare_structs(&all.structs));
    assert!(report.is_empty(), "the kernels' C ABI and the Rust declarations differ:\n{}", report.join("\n"));
}

#[test]
fn swapped_parameters_of_the_same_type_are_reported() {
    // kernels/sparse_conv/sparse_conv.h with `count` and `words` swapped.
    let header = parse_header(
        "MLUOPS_EXPORT int mluops_get_indice_pairs_mark(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type,
             int32_t words, int32_t count, int32_t tile, const int32_t *src, int32_t *bitmap);",
    )
    .unwrap();
    let report = compare_entries(&header.entries, &[signature("mluops_get_indice_pairs_mark")]);
    assert_eq!(report.len(), 2, "{report:#?}");
    assert!(report[0].starts_with("mluops_get_indice_pairs_mark #3: C `int32_t words`"), "{report:#?}");
    assert!(report[1].starts_with("mluops_get_indice_pairs_mark #4: C `int32_t count`"), "{report:#?}");
}

#[test]
fn a_changed_type_or_a_missing_entry_is_reported() {
    // bins_per_load as float, weights as float, and an entry Rust does not declare.
    let header = parse_header(
        "MLUOPS_EXPORT int mluops_psroipool_backward(cnrtQueue_t queue, uint32_t task_dim, int32_t task_type,
             int32_t rois_num, int32_t pooled, int32_t output_dim, int32_t height, int32_t width, int32_t channels,
             float bins_per_load, int32_t deal, const float *top_grad, const int32_t *spans,
             const int32_t *mapping_channel, float *bottom_grad, const int32_t *gate, int32_t gates);
         MLUOPS_EXPORT int mluops_three_interpolate_backward_f16(cnrtQueue_t queue, uint32_t task_dim,
             int32_t task_type, int32_t batches, int32_t channels, int32_t n_points, int32_t m_points, int32_t mo,
             int32_t no, int32_t co, const half *grad_output, const int32_t *indices, const float *weights,
             half *grad_features);
         MLUOPS_EXPORT int mluops_extra(cnrtQueue_t queue);",
    )
    .unwrap();
    let rust = [signature("mluops_psroipool_backward"), signature("mluops_three_interpolate_backward_f16")];
    let report = compare_entries(&header.entries, &rust);
    assert_eq!(report.len(), 3, "{report:#?}");
    assert!(
        report[0].starts_with("mluops_psroipool_backward #9: C `float bins_per_load` (Rust `f32`)"),
        "{report:#?}"
    );
    assert!(
        report[1].contains("#12: C `const float * weights` (Rust `*const f32`), Rust `weights: *const u16`"),
        "{report:#?}"
    );
    assert!(report[2].starts_with("mluops_extra: in a header, not in kernels!"), "{report:#?}");
}

#[test]
fn a_changed_struct_member_is_reported() {
    // MluopsGipGeometry with pad and stride swapped and subm widened to an array.
    let header = parse_header(
        "typedef struct MluopsGipGeometry {
           int32_t in_space[3]; int32_t out_space[3]; int32_t kernel[3];
           int32_t pad[3]; int32_t stride[3]; int32_t dilation[3]; int32_t subm[2];
         } MluopsGipGeometry;
         typedef struct MluopsIntBounds { int32_t lo[4]; int32_t hi[4]; } MluopsIntBounds;",
    )
    .unwrap();
    let report = compare_structs(&header.structs);
    assert_eq!(report.len(), 3, "{report:#?}");
    assert!(report[0].starts_with("MluopsGipGeometry #3: C `int32_t pad[3]`"), "{report:#?}");
    assert!(report[1].starts_with("MluopsGipGeometry #4: C `int32_t stride[3]`"), "{report:#?}");
    assert!(
        report[2].starts_with("MluopsGipGeometry #6: C `int32_t subm[2]` (Rust `[i32; 2]`), Rust `subm: i32`"),
        "{report:#?}"
    );
}
