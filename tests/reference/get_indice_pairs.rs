//! GetIndicePairs' attributes, contract rules and reference (brute force, i128, BTreeMaps),
//! shared by its suite (tests/get_indice_pairs.rs) and its fuzz target (fuzz/fuzz_targets/).

use onnxruntime_ep_mlu::schema::AttrValue;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// A node's attributes; `None` = not set (the schema default applies).
#[derive(Debug, Clone, Default)]
pub struct Attrs {
    pub batch_size: Option<i64>,
    pub spatial_shape: Option<Vec<i64>>,
    pub kernel_size: Option<Vec<i64>>,
    pub stride: Option<Vec<i64>>,
    pub padding: Option<Vec<i64>>,
    pub dilation: Option<Vec<i64>>,
    pub output_padding: Option<Vec<i64>>,
    pub subm: Option<i64>,
    pub transpose: Option<i64>,
    pub inverse: Option<i64>,
}

impl Attrs {
    pub fn new(batch: i64, spatial: [i64; 3], kernel: [i64; 3]) -> Self {
        Attrs {
            batch_size: Some(batch),
            spatial_shape: Some(spatial.to_vec()),
            kernel_size: Some(kernel.to_vec()),
            ..Attrs::default()
        }
    }
    pub fn stride(mut self, v: [i64; 3]) -> Self {
        self.stride = Some(v.to_vec());
        self
    }
    pub fn padding(mut self, v: [i64; 3]) -> Self {
        self.padding = Some(v.to_vec());
        self
    }
    pub fn dilation(mut self, v: [i64; 3]) -> Self {
        self.dilation = Some(v.to_vec());
        self
    }
    pub fn output_padding(mut self, v: [i64; 3]) -> Self {
        self.output_padding = Some(v.to_vec());
        self
    }
    pub fn subm(mut self) -> Self {
        self.subm = Some(1);
        self
    }
    pub fn transpose(mut self) -> Self {
        self.transpose = Some(1);
        self
    }

    pub fn map(&self) -> HashMap<String, AttrValue> {
        let mut m = HashMap::new();
        let ints = [
            ("spatial_shape", &self.spatial_shape),
            ("kernel_size", &self.kernel_size),
            ("stride", &self.stride),
            ("padding", &self.padding),
            ("dilation", &self.dilation),
            ("output_padding", &self.output_padding),
        ];
        for (name, v) in ints {
            if let Some(v) = v {
                m.insert(name.to_owned(), AttrValue::Ints(v.clone()));
            }
        }
        let scalars = [
            ("batch_size", self.batch_size),
            ("subm", self.subm),
            ("transpose", self.transpose),
            ("inverse", self.inverse),
        ];
        for (name, v) in scalars {
            if let Some(v) = v {
                m.insert(name.to_owned(), AttrValue::Int(v));
            }
        }
        m
    }
}

/// A valid configuration, every value resolved.
#[derive(Debug, Clone)]
pub struct Conv {
    pub batch: i64,
    pub spatial: [i128; 3],
    pub kernel: [i128; 3],
    pub stride: [i128; 3],
    pub padding: [i128; 3],
    pub dilation: [i128; 3],
    pub output_padding: [i128; 3],
    pub subm: bool,
    pub transpose: bool,
}

impl Conv {
    pub fn out_size(&self, a: usize) -> i128 {
        let (i, k, s, p, d, op) = (
            self.spatial[a],
            self.kernel[a],
            self.stride[a],
            self.padding[a],
            self.dilation[a],
            self.output_padding[a],
        );
        if self.subm {
            i
        } else if self.transpose {
            (i - 1) * s - 2 * p + d * (k - 1) + op + 1
        } else {
            // Floor division (the kernel's documented reading of the contract formula).
            (i + 2 * p - d * (k - 1) - 1).div_euclid(s) + 1
        }
    }
    pub fn volume(&self) -> usize {
        self.kernel.iter().map(|&k| k as usize).product()
    }
}

pub fn three(v: &Option<Vec<i64>>, default: Option<[i64; 3]>) -> Result<[i128; 3], String> {
    match v {
        None => default.map(|d| d.map(i128::from)).ok_or_else(|| "missing".to_owned()),
        Some(v) if v.len() == 3 => Ok([v[0].into(), v[1].into(), v[2].into()]),
        Some(v) => Err(format!("{} values", v.len())),
    }
}

/// The attribute rules of the contract; Err names the broken rule.
pub fn resolve(a: &Attrs) -> Result<Conv, String> {
    let batch = a.batch_size.ok_or("batch_size missing")?;
    if batch <= 0 {
        return Err("batch_size <= 0".into());
    }
    let spatial = three(&a.spatial_shape, None)?;
    let kernel = three(&a.kernel_size, None)?;
    let stride = three(&a.stride, Some([1; 3]))?;
    let padding = three(&a.padding, Some([0; 3]))?;
    let dilation = three(&a.dilation, Some([1; 3]))?;
    let output_padding = three(&a.output_padding, Some([0; 3]))?;
    if spatial.iter().chain(&kernel).chain(&stride).chain(&dilation).any(|&v| v <= 0) {
        return Err("non-positive spatial, kernel, stride or dilation".into());
    }
    if kernel.iter().product::<i128>() > 4096 {
        return Err("K > 4096".into());
    }
    if padding.iter().chain(&output_padding).any(|&v| v < 0) {
        return Err("negative padding or output_padding".into());
    }
    let flag = |v: Option<i64>| match v.unwrap_or(0) {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err("flag not 0/1".to_owned()),
    };
    let subm = flag(a.subm)?;
    let transpose = flag(a.transpose)?;
    if a.inverse.unwrap_or(0) != 0 {
        return Err("inverse != 0".into());
    }
    if (0..3).any(|i| stride[i] > 1 && dilation[i] > 1) {
        return Err("stride > 1 with dilation > 1".into());
    }
    if subm && transpose {
        return Err("subm with transpose".into());
    }
    if transpose && dilation.iter().any(|&d| d > 1) {
        return Err("transpose with dilation".into());
    }
    let conv =
        Conv { batch, spatial, kernel, stride, padding, dilation, output_padding, subm, transpose };
    for i in 0..3 {
        if subm {
            let plain = Conv { subm: false, ..conv.clone() };
            if stride[i] != 1 || plain.out_size(i) != spatial[i] {
                return Err("subm output size differs".into());
            }
        }
        let out = conv.out_size(i);
        if out <= 0 {
            return Err("non-positive output size".into());
        }
        // Decision of the kernel: output coordinates are int32.
        if out > i128::from(i32::MAX) {
            return Err("output size beyond int32".into());
        }
    }
    Ok(conv)
}

/// What the contract says a node and input must do.
#[derive(Debug)]
pub enum Expect {
    /// Building the node fails.
    Attribute,
    /// Running fails.
    Run,
    Valid(Box<Conv>),
}

pub fn expect(a: &Attrs, shape: &[usize], data: &[i32]) -> Expect {
    let Ok(c) = resolve(a) else { return Expect::Attribute };
    if shape.len() != 2 || shape[1] != 4 {
        return Expect::Run;
    }
    let l = shape[0];
    if (c.volume() as u128) * 2 * (l as u128) > i32::MAX as u128 {
        return Expect::Run;
    }
    let mut seen = HashSet::new();
    for row in data.chunks(4) {
        if !(0..c.batch).contains(&i64::from(row[0])) {
            return Expect::Run;
        }
        if (0..3).any(|i| !(0..c.spatial[i]).contains(&i128::from(row[i + 1]))) {
            return Expect::Run;
        }
        if c.subm && !seen.insert(row.to_vec()) {
            return Expect::Run;
        }
    }
    Expect::Valid(Box::new(c))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rulebook {
    /// [K, 2, L]
    pub pairs: Vec<i32>,
    /// [num_act_out, 4]
    pub out: Vec<i32>,
    pub num: Vec<i32>,
}

/// The output coordinate of input coordinate `i` on axis `a` through tap `kk`.
pub fn target(c: &Conv, a: usize, i: i32, kk: i128) -> Option<i128> {
    let (s, p, d) = (c.stride[a], c.padding[a], c.dilation[a]);
    let i = i128::from(i);
    let o = if c.transpose {
        i * s - p + kk * d
    } else {
        let n = i + p - kk * d;
        if n % s != 0 {
            return None;
        }
        n / s
    };
    (0 <= o && o < c.out_size(a)).then_some(o)
}

pub type Site = (i32, i128, i128, i128);

pub fn reference(c: &Conv, rows: &[[i32; 4]]) -> Rulebook {
    let l = rows.len();
    let kk = c.kernel;
    let offsets: Vec<[i128; 3]> = (0..kk[0])
        .flat_map(|z| (0..kk[1]).flat_map(move |y| (0..kk[2]).map(move |x| [z, y, x])))
        .collect();
    let k = offsets.len();
    let site = |r: &[i32; 4], off: &[i128; 3]| -> Option<Site> {
        Some((
            r[0],
            target(c, 0, r[1], off[0])?,
            target(c, 1, r[2], off[1])?,
            target(c, 2, r[3], off[2])?,
        ))
    };
    let (out_rows, out): (BTreeMap<Site, usize>, Vec<i32>) = if c.subm {
        let m = rows
            .iter()
            .enumerate()
            .map(|(i, r)| ((r[0], r[1].into(), r[2].into(), r[3].into()), i))
            .collect();
        (m, rows.iter().flatten().copied().collect())
    } else {
        let all: BTreeSet<Site> =
            rows.iter().flat_map(|r| offsets.iter().filter_map(|o| site(r, o))).collect();
        let out = all.iter().flat_map(|s| [s.0, s.1 as i32, s.2 as i32, s.3 as i32]).collect();
        (all.into_iter().enumerate().map(|(i, s)| (s, i)).collect(), out)
    };
    let mut pairs = vec![-1; k * 2 * l];
    let mut num = vec![0; k];
    for (ki, off) in offsets.iter().enumerate() {
        let mut j = 0;
        for (r, row) in rows.iter().enumerate() {
            if let Some(&o) = site(row, off).and_then(|s| out_rows.get(&s)) {
                pairs[ki * 2 * l + j] = r as i32;
                pairs[ki * 2 * l + l + j] = o as i32;
                j += 1;
            }
        }
        num[ki] = j as i32;
    }
    Rulebook { pairs, out, num }
}
