//! The kernels' C ABI is written once, in kernels/<family>/<family>.h; this module reads such
//! a header and writes its Rust side (build.rs, into `$OUT_DIR/kernels/<family>.rs`, included
//! by the family's `kernel_abi!`): the `#[repr(C)]` structs, and a table of the launch
//! entries' function pointers (`<Family>Kernels`) taken from the emulated card's linked
//! host build or from the cncc-built library. A header holds nothing but
//! `typedef struct X { ... } X;` and `BANG_EXPORT int name(...);`, in the C types of
//! [`rust_of_c`]; anything else stops the build with the header's name.
//! tests/kernel_abi.rs includes this file to test it.

use std::fmt::Write as _;

/// A parameter or struct member: C type tokens, name, array length.
pub struct Decl {
    pub ty: Vec<String>,
    pub name: String,
    pub len: Option<String>,
}

pub struct Entry {
    pub name: String,
    pub params: Vec<Decl>,
}

pub struct CStruct {
    pub name: String,
    pub fields: Vec<Decl>,
}

#[derive(Default)]
pub struct Header {
    pub entries: Vec<Entry>,
    pub structs: Vec<CStruct>,
}

/// Identifiers/numbers and single punctuation characters, without comments, string
/// literals and preprocessor directives (continuation lines included).
pub fn tokens(src: &str) -> Vec<String> {
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

    /// `BANG_EXPORT int name(type name, ...)`, the cursor on BANG_EXPORT.
    fn prototype(&mut self) -> Result<Entry, String> {
        self.expect("BANG_EXPORT")?;
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

/// A header: `typedef struct X { ... } X;` and `BANG_EXPORT int ...(...);`, nothing else.
pub fn parse_header(src: &str) -> Result<Header, String> {
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
                let fields = body
                    .split(|t| t == ";")
                    .filter(|f| !f.is_empty())
                    .map(decl)
                    .collect::<Result<_, _>>()?;
                c.expect(&name)?;
                c.expect(";")?;
                header.structs.push(CStruct { name, fields });
            }
            "BANG_EXPORT" => {
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
    for at in (0..toks.len()).filter(|&i| toks[i] == "BANG_EXPORT") {
        let mut c = Cursor { toks: &toks, at };
        out.push(c.prototype()?);
        c.expect("{")?;
    }
    Ok(out)
}

/// The Rust name of a header's struct: its C name without the `Bang` prefix.
pub fn rust_struct_name(c: &str) -> Result<&str, String> {
    c.strip_prefix("Bang")
        .filter(|n| !n.is_empty())
        .ok_or(format!("struct {c}: its name must start with Bang"))
}

/// The Rust type of a C declaration; `structs` are the header's own.
pub fn rust_of_c(d: &Decl, structs: &[CStruct]) -> Result<String, String> {
    let scalar = |t: &[String]| -> Result<String, String> {
        match t {
            [t] => Ok(match t.as_str() {
                "int32_t" => "i32",
                "uint32_t" => "u32",
                "int64_t" => "i64",
                "uint64_t" => "u64",
                "float" => "f32",
                // float16 crosses as its bits.
                "half" => "u16",
                "cnrtQueue_t" => "crate::mlu::QueuePtr",
                s if structs.iter().any(|st| st.name == s) => rust_struct_name(s)?,
                s => return Err(format!("no Rust type for C `{s}`")),
            }
            .to_owned()),
            _ => Err(format!("unsupported C type `{}`", t.join(" "))),
        }
    };
    let ty = match d.ty.as_slice() {
        [inner @ .., star] if star == "*" => match inner {
            [c, rest @ ..] if c == "const" => format!("*const {}", scalar(rest)?),
            _ => format!("*mut {}", scalar(inner)?),
        },
        t => scalar(t)?,
    };
    Ok(match &d.len {
        Some(n) => format!("[{ty}; {n}]"),
        None => ty,
    })
}

/// `sparse_conv` -> `SparseConv`.
fn camel(family: &str) -> String {
    family.split('_').map(|w| w[..1].to_uppercase() + &w[1..]).collect()
}

/// The Rust side of `family`'s header `src` (see the module doc).
pub fn generate(family: &str, src: &str) -> Result<String, String> {
    let h = parse_header(src)?;
    if h.entries.is_empty() {
        return Err("no launch entry".into());
    }
    let table = format!("{}Kernels", camel(family));
    let mut out = format!(
        "// Generated by build.rs (build_support/abi.rs) from kernels/{family}/{family}.h.\n"
    );
    for s in &h.structs {
        let name = rust_struct_name(&s.name)?;
        writeln!(out, "/// `{}` of kernels/{family}/{family}.h.", s.name).unwrap();
        out += "#[repr(C)]\n#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]\n";
        writeln!(out, "pub struct {name} {{").unwrap();
        for f in &s.fields {
            writeln!(out, "    pub {}: {},", f.name, rust_of_c(f, &h.structs)?).unwrap();
        }
        out += "}\n";
    }
    let mut sigs = Vec::new();
    for e in &h.entries {
        let params: Vec<String> = e
            .params
            .iter()
            .map(|p| Ok(format!("{}: {}", p.name, rust_of_c(p, &h.structs)?)))
            .collect::<Result<_, String>>()?;
        if e.params.first().map(|p| p.ty.as_slice()) != Some(&["cnrtQueue_t".to_owned()]) {
            return Err(format!("{}: the first parameter must be the cnrtQueue_t", e.name));
        }
        sigs.push((e.name.as_str(), params.join(", ")));
    }
    writeln!(out, "/// The launch entries of kernels/{family}/{family}.h: each enqueues on `queue` and returns 0").unwrap();
    out += "/// or a runtime error code.\n#[derive(Clone, Copy)]\n";
    writeln!(out, "pub struct {table} {{").unwrap();
    for (name, params) in &sigs {
        writeln!(out, "    pub {name}: unsafe extern \"C\" fn({params}) -> i32,").unwrap();
    }
    out += "}\n\nmod linked {\n    #[allow(unused_imports)]\n    use super::*;\n    unsafe extern \"C\" {\n";
    for (name, params) in &sigs {
        writeln!(out, "        pub fn {name}({params}) -> i32;").unwrap();
    }
    out += "    }\n}\n\n";
    writeln!(out, "impl crate::mlu::KernelTable for {table} {{").unwrap();
    out += "    fn linked() -> Self {\n";
    writeln!(
        out,
        "        {table} {{ {} }}",
        sigs.iter().map(|(n, _)| format!("{n}: linked::{n}")).collect::<Vec<_>>().join(", ")
    )
    .unwrap();
    out += "    }\n\n    fn load(lib: &libloading::Library) -> crate::error::Result<Self> {\n";
    writeln!(out, "        Ok({table} {{").unwrap();
    for (name, params) in &sigs {
        writeln!(
            out,
            "            // SAFETY: the signature read from the header the cncc-built .mlu includes.\n            {name}: unsafe {{ crate::mlu::symbol::<unsafe extern \"C\" fn({params}) -> i32>(lib, crate::mlu::KERNEL_LIBRARY, \"{name}\\0\") }}?,"
        )
        .unwrap();
    }
    out += "        })\n    }\n}\n";
    Ok(out)
}

/// Every launch entry a family's .mlu `mlu` writes out must be declared in its header
/// `header` with the same parameter names (the C++ compiler holds the types to it, not the
/// names).
pub fn check_definitions(mlu: &str, header: &str) -> Result<(), String> {
    let declared = parse_header(header)?.entries;
    let names = |e: &Entry| e.params.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    for def in mlu_definitions(mlu)? {
        match declared.iter().find(|e| e.name == def.name) {
            Some(d) if names(d) == names(&def) => {}
            Some(d) => {
                return Err(format!(
                    "{}: parameters {:?} in the .mlu, {:?} in the header",
                    def.name,
                    names(&def),
                    names(d)
                ));
            }
            None => {
                return Err(format!(
                    "{}: defined in the .mlu, not declared in the header",
                    def.name
                ));
            }
        }
    }
    Ok(())
}

/// Every entry name of the headers `srcs`, for the library's load-time check.
pub fn entry_names(srcs: &[String]) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for src in srcs {
        names.extend(parse_header(src)?.entries.into_iter().map(|e| e.name));
    }
    Ok(names)
}
