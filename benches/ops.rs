//! CPU benchmarks of the operators (IndiceConv's: benches/indice_conv.rs) at the seed network
//! scales (docs/CONTRACT.md §N.6), run as `scripts/bench.sh` (or `cargo bench --bench ops` with
//! ORT_DYLIB_PATH set). One run measures, per operator: the kernel on persistent pools of 1 and 2
//! threads, the same node through onnxruntime sessions (custom-op library, 1 and 2 intra-op
//! threads), a 2-thread streaming copy of 512 MiB (the bandwidth reference) and the row's floor
//! (its input bytes read and output bytes written as sequential streams), all timed in turn from
//! cold caches; then a straightforward single-threaded implementation (benches/naive.rs) and the
//! peak memory the kernel allocates beyond its outputs. Everything is reported as ratios measured
//! in this run; nothing is asserted about speed. With `--profile` it only runs each kernel once,
//! for scripts/profile.sh to count its instructions and cache misses.

#[path = "ops/cases.rs"]
mod cases;
#[path = "naive.rs"]
mod naive;
#[path = "../models/onnx_builder.rs"]
mod onnx_builder;
#[path = "../tests/common/rng.rs"]
mod rng;

use cases::*;
use half::f16;
use onnx_builder::{Dim, Elem, Graph, attr_float, attr_int, attr_ints, attr_string};
use onnxruntime_ep_mlu::ops::{self, LineAlignedOutputs};
use onnxruntime_ep_mlu::parallel::{Parallel, Serial, for_each_chunk_mut, for_each_part_mut};
use onnxruntime_ep_mlu::schema::{AttrValue, Attrs};
use onnxruntime_ep_mlu::tensor::{Inputs, OwnedData, Tensor};
use rng::Rng;
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Counts live heap bytes and their peak, to report the kernels' extra memory.
struct Counting;
static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let now = LIVE.fetch_add(l.size(), Relaxed) + l.size();
        PEAK.fetch_max(now, Relaxed);
        // SAFETY: same layout contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size(), Relaxed);
        // SAFETY: `p` was allocated by System.alloc with `l`.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Timed runs of each variant at least, and until this much time has gone into a case.
const REPEATS: usize = 7;
const CASE_BUDGET: Duration = Duration::from_millis(2500);

fn time(f: &mut dyn FnMut()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

fn best_of_two(mut f: impl FnMut(), flush: impl Fn()) -> Duration {
    flush();
    let first = time(&mut f);
    flush();
    first.min(time(&mut f))
}

fn best(mut f: impl FnMut()) -> Duration {
    f();
    (0..REPEATS).map(|_| time(&mut f)).min().unwrap_or_default()
}

/// The best time of each variant, the variants run in turn (after one warm-up each), so
/// that the machine's slow phases (it is shared) hit all of them alike: their ratios are
/// then far steadier than those of separately timed blocks. `flush` runs, untimed, before
/// every timed run, so that each variant starts with the same (cold) caches whatever ran
/// before it. Also returns the number of rounds.
fn best_interleaved(
    variants: &mut [&mut dyn FnMut()],
    flush: &mut dyn FnMut(),
) -> (Vec<Duration>, usize) {
    variants.iter_mut().for_each(|f| f());
    let mut bests = vec![Duration::MAX; variants.len()];
    let start = Instant::now();
    let mut rounds = 0;
    while rounds < REPEATS || (start.elapsed() < CASE_BUDGET && rounds < 200) {
        for (b, f) in bests.iter_mut().zip(variants.iter_mut()) {
            flush();
            *b = (*b).min(time(*f));
        }
        rounds += 1;
    }
    (bests, rounds)
}

/// Reads a buffer twice the size of the last-level cache (32 MiB here), which evicts
/// whatever a previous run left cached.
struct Flush(Vec<u64>);

impl Flush {
    fn new() -> Self {
        Flush((0..(64u64 << 20) / 8).collect())
    }

    fn run(&self) {
        std::hint::black_box(self.0.iter().fold(0u64, |a, &x| a.wrapping_add(x)));
    }
}

/// A persistent pool of `n` threads: the direct kernel calls get what onnxruntime's
/// intra-op pool gives its kernels, so the "ORT overhead" column compares like with like.
struct Pool(rayon::ThreadPool);

impl Pool {
    fn new(n: usize) -> Self {
        Pool(rayon::ThreadPoolBuilder::new().num_threads(n).build().expect("thread pool"))
    }
}

impl Parallel for Pool {
    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        use rayon::prelude::*;
        // One task per item (with_max_len(1)): the kernels size their tasks themselves.
        self.0.install(|| (0..tasks).into_par_iter().with_max_len(1).for_each(f));
    }
}

/// The bandwidth reference: a 512 MiB streaming copy, cut in two halves run as two tasks.
/// 512 MiB runs from and to memory (smaller copies measured slower here: 64 MiB gave
/// 24-27 GB/s where 512 MiB gave 37, so the larger is the stricter reference).
struct StreamCopy {
    src: Vec<u8>,
    dst: Vec<u8>,
}

impl StreamCopy {
    const LEN: usize = 512 << 20;

    fn new() -> Self {
        StreamCopy { src: vec![1u8; Self::LEN], dst: vec![0u8; Self::LEN] }
    }

    fn run(&mut self, par: &dyn Parallel) {
        let (src, half) = (&self.src, Self::LEN / 2);
        for_each_chunk_mut(par, &mut self.dst, half, |t, d| {
            d.copy_from_slice(&src[t * half..][..d.len()])
        });
    }

    /// Bytes read plus bytes written per second, for a copy that took `t`.
    fn bandwidth(t: Duration) -> f64 {
        2.0 * Self::LEN as f64 / t.as_secs_f64()
    }
}

/// The memory floor of one case: the case's input bytes read and its output bytes written
/// as sequential streams (outputs of 4 MiB or more with non-temporal stores, as the kernels
/// write them), cut in two halves run as two tasks, reads and writes interleaved in slices
/// so that both are in flight together. No kernel that reads every input and writes every
/// output once can beat it on this machine; with no output it measures the read-only
/// bandwidth.
struct StreamFloor {
    src: Vec<f32>,
    dst: Vec<f32>,
}

impl StreamFloor {
    /// Slices per task: reads and writes alternate at this granularity.
    const SLICES: usize = 64;

    fn new(read_bytes: usize, write_bytes: usize) -> Self {
        StreamFloor { src: vec![1.0; read_bytes / 4], dst: vec![0.0; write_bytes / 4] }
    }

    fn run(&mut self, par: &dyn Parallel) {
        use onnxruntime_ep_mlu::cache::{copy_out, stream_fence, worth_streaming};
        let (src, stream) = (&self.src, worth_streaming(size_of_val(&self.dst[..])));
        let halves = |len: usize| [0, len / 2, len];
        let (reads, writes) = (halves(src.len()), halves(self.dst.len()));
        let fill = [2f32; 1024];
        let write = |w: &mut [f32]| {
            w.chunks_mut(fill.len()).for_each(|w| copy_out(w, &fill[..w.len()], stream))
        };
        // Two tasks, each with its half of the reads and of the writes (either may be empty).
        for_each_part_mut(par, &mut self.dst, &writes, |t, out| {
            let input = &src[reads[t]..reads[t + 1]];
            let (rs, wlen) = (input.len().div_ceil(Self::SLICES).max(1), out.len());
            let ws = wlen.div_ceil(Self::SLICES).max(1);
            let mut acc = [0f32; 16];
            for k in 0..Self::SLICES {
                for c in
                    input.get(k * rs..((k + 1) * rs).min(input.len())).unwrap_or(&[]).chunks(16)
                {
                    acc.iter_mut().zip(c).for_each(|(a, &x)| *a += x);
                }
                write(out.get_mut(k * ws..((k + 1) * ws).min(wlen)).unwrap_or(&mut []));
            }
            stream_fence();
            std::hint::black_box(acc);
        });
    }

    /// Bytes read plus bytes written per second, for a run that took `t`.
    fn bandwidth(&self, t: Duration) -> f64 {
        4.0 * (self.src.len() + self.dst.len()) as f64 / t.as_secs_f64()
    }
}

/// The limit of a random row access pattern, as two primitives over a case's [`Access`]:
/// - gather: each sequential row is the sum of its `fan` table rows (a gather when `fan` is
///   1; ThreeInterpolate's forward pattern);
/// - scatter-add: each sequential row is added to its `fan` table rows (DynamicScatter's,
///   VoxelPooling's, ThreeInterpolateBackward's pattern).
///
/// Two tasks split the sequential rows (gather) or the table rows (scatter-add: each task
/// owns a contiguous half of the table, scans every index and adds to its rows, so no
/// atomics; the kernels split their owners differently, by voxel or cell), and one task on
/// one thread. Bytes are counted as the kernels' are (each byte the access needs, once):
/// every table row touched read (and, scatter-add, written) once, every sequential row
/// written (gather) or read (scatter-add), the indices read. A table row gathered again
/// comes from the cache; counting it again would credit the primitive with bytes the
/// kernel's figure does not count (3-5x for ThreeInterpolate's table).
struct RandomRows {
    access: Access,
    table: Vec<f32>,
    rows: Vec<f32>,
    /// Distinct table rows the indices touch.
    touched: usize,
}

impl RandomRows {
    fn new(access: Access) -> Self {
        let rows = vec![1.0; access.idx.len() / access.fan * access.row];
        let mut seen = vec![false; access.table];
        access.idx.iter().for_each(|&j| seen[j as usize] = true);
        let touched = seen.iter().filter(|&&s| s).count();
        RandomRows { table: vec![0.5; access.table * access.row], rows, access, touched }
    }

    fn gather(&mut self, par: &dyn Parallel) {
        let (a, table) = (&self.access, &self.table);
        let half = (self.rows.len() / a.row).div_ceil(2) * a.row;
        for_each_chunk_mut(par, &mut self.rows, half.max(a.row), |t, out| {
            let first = t * half / a.row;
            for (i, dst) in out.chunks_exact_mut(a.row).enumerate() {
                dst.fill(0.0);
                for &j in &a.idx[(first + i) * a.fan..][..a.fan] {
                    dst.iter_mut()
                        .zip(&table[j as usize * a.row..][..a.row])
                        .for_each(|(d, s)| *d += s);
                }
            }
        });
    }

    /// `owners` tasks (the pool's threads: one task on one thread scans the indices once).
    fn scatter_add(&mut self, par: &dyn Parallel, owners: usize) {
        let (a, rows) = (&self.access, &self.rows);
        let bounds: Vec<usize> = (0..=owners).map(|t| a.table * t / owners * a.row).collect();
        for_each_part_mut(par, &mut self.table, &bounds, |t, part| {
            let first = a.table * t / owners;
            let owned = first..first + part.len() / a.row;
            for (k, &j) in a.idx.iter().enumerate().filter(|(_, j)| owned.contains(&(**j as usize)))
            {
                let src = &rows[k / a.fan * a.row..][..a.row];
                part[(j as usize - first) * a.row..][..a.row]
                    .iter_mut()
                    .zip(src)
                    .for_each(|(d, s)| *d += s);
            }
        });
    }

    fn gather_bandwidth(&self, t: Duration) -> f64 {
        (4 * (self.touched * self.access.row + self.access.idx.len() + self.rows.len())) as f64
            / t.as_secs_f64()
    }

    fn scatter_bandwidth(&self, t: Duration) -> f64 {
        (4 * (2 * self.touched * self.access.row + self.access.idx.len() + self.rows.len())) as f64
            / t.as_secs_f64()
    }
}

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn floats(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit()).collect()
    }
}

fn attrs(list: &[(&str, AttrValue)]) -> HashMap<String, AttrValue> {
    list.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

/// The naive implementation's leading outputs (all of them, or the first ones).
type Naive = Box<dyn Fn() -> Vec<OwnedData>>;
/// Builds one case from the shared generator.
type CaseBuilder = Box<dyn Fn(&mut Rng) -> Case>;

/// One benchmark case: a configured node, its inputs, and how to check against naive.
struct Case {
    op: &'static str,
    shapes: String,
    attrs: HashMap<String, AttrValue>,
    inputs: Vec<(&'static str, Tensor)>,
    /// Minimal traffic: every input byte the operator needs read once, every output written
    /// once.
    bytes: usize,
    /// Input bytes the operator never needs (the features of points outside the grid).
    unread: usize,
    naive: Naive,
    /// The contract's accuracy class: exact (bit-identical) or accumulating.
    exact: bool,
    /// The random row access the operator cannot avoid, where it is one ([`RandomRows`]).
    access: Option<Access>,
}

/// A case's random row access: `fan` rows of a table of `table` rows of `row` floats for
/// each of its sequential rows, at the case's own indices (`idx`, `fan` per sequential row).
struct Access {
    idx: Vec<u32>,
    fan: usize,
    row: usize,
    table: usize,
}

fn bytes_of(t: &Tensor) -> usize {
    let n: usize = t.shape.iter().product();
    n * match t.data {
        OwnedData::F16(_) => 2,
        OwnedData::I64(_) => 8,
        _ => 4,
    }
}

/// A float tensor's values as float32 (float16 widened).
fn widened(d: &OwnedData) -> Vec<f32> {
    match d {
        OwnedData::F16(v) => v.iter().map(|h| h.to_f32()).collect(),
        OwnedData::F32(v) => v.clone(),
        _ => panic!("expected a float tensor"),
    }
}

fn f32s(t: &Tensor) -> &[f32] {
    t.data.f32().expect("float32 tensor")
}
fn i32s(t: &Tensor) -> &[i32] {
    t.data.i32().expect("int32 tensor")
}

/// Largest |a-b| relative to the largest |b|: a loose agreement check of the naive loops
/// (the tests check the contract's accuracy classes properly).
fn agree(a: &[f32], b: &[f32]) -> Result<(), String> {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
    let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    if a.len() == b.len() && worst <= 1e-3 * scale {
        Ok(())
    } else {
        Err(format!("differs by {worst} (scale {scale})"))
    }
}

/// The kernel's outputs against the naive ones: bit-identical for an exact operator (and
/// for every index output), `agree` otherwise.
fn check(out: &[Tensor], want: &[OwnedData], exact: bool) -> Result<(), String> {
    for (k, (got, want)) in out.iter().zip(want).enumerate() {
        match (&got.data, want) {
            (OwnedData::F32(a), OwnedData::F32(b)) if exact => {
                if a.iter().map(|v| v.to_bits()).ne(b.iter().map(|v| v.to_bits())) {
                    return Err(format!("output {k} not bit-identical"));
                }
            }
            (OwnedData::F32(a), OwnedData::F32(b)) => {
                agree(a, b).map_err(|e| format!("output {k} {e}"))?
            }
            (a @ OwnedData::F16(_), b @ OwnedData::F16(_)) => {
                agree(&widened(a), &widened(b)).map_err(|e| format!("output {k} {e}"))?
            }
            (OwnedData::I32(a), OwnedData::I32(b)) if a == b => {}
            _ => return Err(format!("output {k} differs")),
        }
    }
    Ok(())
}

fn elem(t: &Tensor) -> Elem {
    match t.data {
        OwnedData::F32(_) => Elem::FLOAT,
        OwnedData::F16(_) => Elem::FLOAT16,
        OwnedData::I32(_) => Elem::INT32,
        OwnedData::I64(_) => Elem::INT64,
    }
}

fn attribute(name: &str, v: &AttrValue) -> onnx_protobuf::AttributeProto {
    match v {
        AttrValue::Int(i) => attr_int(name, *i),
        AttrValue::Ints(v) => attr_ints(name, v),
        AttrValue::Float(f) => attr_float(name, *f),
        AttrValue::String(s) => attr_string(name, s),
    }
}

fn ort_tensor(t: &Tensor) -> ort::Result<ort::value::DynTensor> {
    let shape: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
    Ok(match &t.data {
        OwnedData::F32(v) => ort::value::Tensor::from_array((shape, v.clone()))?.upcast(),
        OwnedData::F16(v) => ort::value::Tensor::from_array((shape, v.clone()))?.upcast(),
        OwnedData::I32(v) => ort::value::Tensor::from_array((shape, v.clone()))?.upcast(),
        OwnedData::I64(v) => ort::value::Tensor::from_array((shape, v.clone()))?.upcast(),
    })
}

/// The case as a one-node model in an onnxruntime session with `threads` intra-op threads
/// (ONNX Runtime's persistent pool, which the kernels share), with its feeds.
struct OrtRun {
    session: ort::session::Session,
    feeds: Vec<(&'static str, ort::value::DynTensor)>,
}

impl OrtRun {
    fn new(
        env: &ort::environment::Environment,
        case: &Case,
        lib: &str,
        threads: usize,
    ) -> ort::Result<Self> {
        let schema = ops::schema(case.op);
        let mut g = Graph::new("bench");
        for (name, t) in &case.inputs {
            let dims: Vec<Dim> = t.shape.iter().map(|&d| Dim::Fixed(d as i64)).collect();
            g.input(name, elem(t), Some(&dims));
        }
        let names: Vec<&str> = case.inputs.iter().map(|(n, _)| *n).collect();
        let outputs: Vec<&str> = schema.outputs.iter().map(|o| o.name.as_str()).collect();
        g.node(
            "bench",
            case.op,
            "mluops",
            &names,
            &outputs,
            case.attrs.iter().map(|(k, v)| attribute(k, v)).collect(),
        );
        // Every benchmarked output type is fixed (int32) or follows the first float input's T.
        let float = case
            .inputs
            .iter()
            .map(|(_, t)| elem(t))
            .find(|&e| e == Elem::FLOAT16)
            .unwrap_or(Elem::FLOAT);
        for o in &schema.outputs {
            let elem = if o.type_str == "tensor(int32)" { Elem::INT32 } else { float };
            g.output(&o.name, elem, None);
        }
        let session = ort::session::Session::builder(env)?
            .with_intra_threads(threads)?
            // An idle pool thread that spins would take a core from the variant timed next
            // (the bench's pool threads sleep when idle, too).
            .with_intra_op_spinning(false)?
            .with_operator_library(lib)?
            .commit_from_memory(&g.bytes())?;
        let feeds = case
            .inputs
            .iter()
            .map(|(n, t)| Ok((*n, ort_tensor(t)?)))
            .collect::<ort::Result<_>>()?;
        Ok(OrtRun { session, feeds })
    }

    fn run(&mut self) -> ort::Result<()> {
        let inputs: Vec<(&str, &ort::value::DynTensor)> =
            self.feeds.iter().map(|(n, t)| (*n, t)).collect();
        self.session.run(inputs).map(drop)
    }
}

/// The kernel called directly. Output buffers are reused across runs (as ONNX Runtime's
/// arena does), so the times are the kernel's, not the first-touch page faults of fresh
/// allocations, and start on a cache line as ONNX Runtime's do.
struct Kernel {
    kernel: Box<dyn ops::Kernel>,
    names: Vec<String>,
    host: std::cell::RefCell<LineAlignedOutputs>,
}

impl Kernel {
    fn new(case: &Case) -> Self {
        let entry = ops::entry(case.op).expect("operator");
        let kernel = (entry.create)(&Attrs::new(ops::schema(case.op), &case.attrs))
            .expect("valid attributes");
        Kernel { kernel, names: ops::schema(case.op).input_names(), host: Default::default() }
    }

    fn run(&self, case: &Case, par: &dyn Parallel) {
        let refs = case.inputs.iter().map(|(_, t)| Some(t.view())).collect();
        let inputs = Inputs::new(self.names.clone(), refs).expect("valid inputs");
        self.kernel.compute(&inputs, &mut *self.host.borrow_mut(), par).expect("valid inputs");
    }

    fn outputs(&self) -> Vec<Tensor> {
        std::mem::take(&mut *self.host.borrow_mut()).into_tensors()
    }
}

/// The fixed cost of a session run, from cold caches like the table's runs: medians of 200
/// runs each, the variants in turn, `flush` before every run:
/// - onnxruntime alone: a one-node model of the built-in Identity on one float;
/// - a custom node: DynamicScatterBackward on one point and one channel in a session;
/// - the same node's kernel called directly.
///
/// All in one thread (sessions with one intra-op thread), so no pool wake-up is counted.
fn session_run_cost(
    env: &ort::environment::Environment,
    lib: &str,
    flush: &Flush,
) -> ort::Result<[Duration; 3]> {
    let mut g = Graph::new("identity");
    g.input("x", Elem::FLOAT, Some(&[Dim::Fixed(1)]));
    g.node("identity", "Identity", "", &["x"], &["y"], Vec::new());
    g.output("y", Elem::FLOAT, None);
    let mut identity = ort::session::Session::builder(env)?
        .with_intra_threads(1)?
        .commit_from_memory(&g.bytes())?;
    let x = ort_tensor(&Tensor::f32([1], vec![1.0]))?;
    let case = dynamic_scatter_backward(&mut Rng(1), [1, 1, 1]);
    let mut node = OrtRun::new(env, &case, lib, 1)?;
    let kernel = Kernel::new(&case);
    let mut runs = [Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..200 {
        flush.run();
        let t = Instant::now();
        identity.run(vec![("x", &x)]).map(drop)?;
        runs[0].push(t.elapsed());
        flush.run();
        let t = Instant::now();
        node.run()?;
        runs[1].push(t.elapsed());
        flush.run();
        runs[2].push(time(&mut || kernel.run(&case, &Serial)));
    }
    Ok(runs.map(|mut r| {
        r.sort();
        r[r.len() / 2]
    }))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The cases, in the table's order (each built from the one generator in turn).
fn cases() -> Vec<CaseBuilder> {
    vec![
        Box::new(|r| dynamic_scatter_backward(r, [17176, 13743, 128])),
        Box::new(|r| three_interpolate(r, [16, 128, 4096, 1024], false, true)),
        Box::new(|r| three_interpolate(r, [16, 1024, 4096, 128], false, true)),
        Box::new(|r| three_interpolate(r, [16, 512, 2048, 128], false, true)),
        Box::new(|r| three_interpolate(r, [16, 512, 2048, 128], true, true)),
        Box::new(|r| get_indice_pairs(r, true)),
        Box::new(|r| get_indice_pairs(r, false)),
        Box::new(|r| voxel_pooling_forward(r, 2, Geometry::Uniform)),
        Box::new(|r| voxel_pooling_forward(r, 1, Geometry::Uniform)),
        Box::new(|r| voxel_pooling_forward(r, 2, Geometry::Frustum)),
        Box::new(|r| psroipool_backward(r, 320, 7, 8, [2, 14, 14, 392], 1.0)),
        Box::new(|r| psroipool_backward(r, 493, 3, 21, [8, 14, 14, 189], 0.0625)),
        // The forward partners, at the same scales.
        Box::new(|r| dynamic_scatter(r, [17176, 13743, 128], "max")),
        Box::new(|r| dynamic_scatter(r, [17176, 13743, 128], "mean")),
        Box::new(|r| three_interpolate(r, [16, 128, 4096, 1024], false, false)),
        Box::new(|r| three_interpolate(r, [16, 512, 2048, 128], false, false)),
        Box::new(|r| three_interpolate(r, [16, 512, 2048, 128], true, false)),
        Box::new(|r| psroipool(r, 320, 7, 8, [2, 14, 14, 392], 1.0)),
        Box::new(|r| psroipool(r, 493, 3, 21, [8, 14, 14, 189], 0.0625)),
    ]
}

/// `--profile`: each case's kernel once on the calling thread, after a warm-up run (which
/// allocates and touches the outputs) and a cache flush, inside [`profiled_run`], for
/// scripts/profile.sh to count under callgrind. Prints one line per case: op, shapes,
/// minimal traffic in bytes, output elements.
fn profile(filter: Option<&str>) {
    let flush = Flush::new();
    let mut rng = Rng(2026);
    for build in cases() {
        let case = build(&mut rng);
        if filter.is_some_and(|f| !case.op.contains(f)) {
            continue;
        }
        let k = Kernel::new(&case);
        k.run(&case, &Serial);
        flush.run();
        profiled_run(&k, &case);
        let elements: usize = k.outputs().iter().map(|t| t.shape.iter().product::<usize>()).sum();
        println!("profiled\t{}\t{}\t{}\t{elements}", case.op, case.shapes, case.bytes);
    }
}

/// The one call callgrind counts (`--toggle-collect`) and dumps after (`--dump-after`).
#[inline(never)]
fn profiled_run(k: &Kernel, case: &Case) {
    k.run(case, &Serial);
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` only builds and starts the
    // binary, which then has nothing to time in an unoptimised build.
    if !std::env::args().any(|a| a == "--bench") {
        println!("benches/ops.rs: run with `cargo bench --bench ops` (or scripts/bench.sh)");
        return;
    }
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    if std::env::args().any(|a| a == "--profile") {
        return profile(filter.as_deref());
    }
    let lib = std::env::var("MLU_EP_LIB").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/target/release/libonnxruntime_ep_mlu.so").into()
    });
    // ORT_DYLIB_PATH: the onnxruntime 1.31.1 C library (scripts/setup.sh exports it).
    let env = std::env::var("ORT_DYLIB_PATH")
        .map_err(|_| "ORT_DYLIB_PATH is not set".to_string())
        .and_then(|p| ort::init_from(&p).map_err(|e| e.to_string()))
        .and_then(|b| b.with_name("bench").build().map_err(|e| e.to_string()));
    // One thread runs on the caller, as onnxruntime runs a session with one intra-op thread
    // (handing every call to a one-thread pool and back would add a wake-up to each).
    let (pool1, pool2) = (Serial, Pool::new(2));
    let mut copy = StreamCopy::new();
    let bw1 = StreamCopy::bandwidth(best(|| copy.run(&pool1)));
    let bw2 = StreamCopy::bandwidth(best(|| copy.run(&pool2)));
    let mut read = StreamFloor::new(StreamCopy::LEN, 0);
    let (r1, r2) = (best(|| read.run(&pool1)), best(|| read.run(&pool2)));
    let (read1, read2) = (read.bandwidth(r1), read.bandwidth(r2));
    drop(read);
    println!(
        "copy bandwidth (read + write, 512 MiB): 1 thread {:.1} GB/s, 2 threads {:.1} GB/s; each row's \"copy GB/s\" is the same 2-thread copy timed in turn with that row",
        bw1 / 1e9,
        bw2 / 1e9
    );
    println!(
        "read-only stream (512 MiB): 1 thread {:.1} GB/s, 2 threads {:.1} GB/s",
        read1 / 1e9,
        read2 / 1e9
    );
    println!(
        "floor: each row's inputs read and outputs written as sequential streams by 2 threads (non-temporal stores from 4 MiB), timed in turn with that row; % of floor = floor time / kernel 2T time"
    );
    println!(
        "ORT columns: {lib} registered in onnxruntime sessions (ORT_DYLIB_PATH) with 1 and 2 intra-op threads"
    );
    println!(
        "kernel columns: the kernel called directly, on the calling thread (1T) or a persistent pool of 2 threads (2T)"
    );
    println!(
        "gather / scatter-add: the random row access the operator cannot avoid (its own indices, row size and count; RandomRows), timed in turn with that row at 1 and 2 threads; both count each byte the access needs once (a table row gathered again is not counted again); kernel % = the kernel's GB/s (MB moved / time) / the primitive's"
    );
    let flush = Flush::new();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    match env
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|env| session_run_cost(env, &lib, &flush).map_err(|e| e.to_string()))
    {
        Ok([identity, node, direct]) => println!(
            "fixed cost of a session run, from cold caches (medians of 200, 1 thread): onnxruntime alone (an Identity node) {:.0} us; a custom node (DynamicScatterBackward, 1 point x 1 channel) {:.0} us in a session, {:.0} us called directly",
            us(identity),
            us(node),
            us(direct)
        ),
        Err(e) => println!("fixed cost of a session run: not measured ({e})"),
    }
    println!(
        "times: the best run of each variant, the variants timed in turn, each after reading 64 MiB (cold caches; >= {REPEATS} rounds, about {} s per case)\n",
        CASE_BUDGET.as_secs_f64()
    );

    let mut rng = Rng(2026);
    println!(
        "| operator | shapes | MB moved | kernel 2T ms | GB/s | copy GB/s | % of copy bw | floor ms | % of floor | kernel 1T ms | 1->2 speedup (kernel) | gather GB/s 1T / 2T | kernel % of gather 1T / 2T | scatter-add GB/s 1T / 2T | kernel % of scatter-add 1T / 2T | ORT 1T / 2T ms | 1->2 speedup (ORT) | ORT overhead (2T) | naive ms | vs naive | extra MB | naive agrees | rounds |"
    );
    println!(
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    // Each case is compared with the same copy on the 2-thread pool, timed in turn with the
    // case's variants, so both see the same state of the machine.
    for build in cases() {
        let case = build(&mut rng);
        if filter.as_deref().is_some_and(|f| !case.op.contains(f)) {
            continue;
        }
        let k = Kernel::new(&case);
        let read_bytes: usize =
            case.inputs.iter().map(|(_, t)| bytes_of(t)).sum::<usize>() - case.unread;
        let mut floor = StreamFloor::new(read_bytes, case.bytes - read_bytes);
        let sessions = |threads| {
            env.as_ref()
                .map_err(Clone::clone)
                .and_then(|env| OrtRun::new(env, &case, &lib, threads).map_err(|e| e.to_string()))
        };
        let (mut ort1, mut ort2) = (sessions(1), sessions(2));
        let failure = std::cell::RefCell::new(None::<String>);
        let in_ort = |run: &mut Result<OrtRun, String>| {
            let result = match run {
                Ok(r) => r.run().map_err(|e| e.to_string()),
                Err(e) => Err(e.clone()),
            };
            if let Err(e) = result {
                *failure.borrow_mut() = Some(e);
            }
        };
        let mut random = case.access.as_ref().map(|a| {
            RandomRows::new(Access { idx: a.idx.clone(), fan: a.fan, row: a.row, table: a.table })
        });
        let times = {
            let (mut k1, mut k2) = (|| k.run(&case, &pool1), || k.run(&case, &pool2));
            let (mut o1, mut o2) = (|| in_ort(&mut ort1), || in_ort(&mut ort2));
            let mut c2 = || copy.run(&pool2);
            let mut f2 = || floor.run(&pool2);
            let mut variants: Vec<&mut dyn FnMut()> =
                vec![&mut k1, &mut k2, &mut o1, &mut o2, &mut c2, &mut f2];
            // The random row primitives, each timed with the others in turn.
            let random = random.as_mut().map(std::cell::RefCell::new);
            let mut prims: Vec<Box<dyn FnMut()>> = Vec::new();
            if let Some(r) = &random {
                prims.push(Box::new(|| r.borrow_mut().gather(&pool1)));
                prims.push(Box::new(|| r.borrow_mut().gather(&pool2)));
                prims.push(Box::new(|| r.borrow_mut().scatter_add(&pool1, 1)));
                prims.push(Box::new(|| r.borrow_mut().scatter_add(&pool2, 2)));
            }
            variants.extend(prims.iter_mut().map(|p| &mut **p as &mut dyn FnMut()));
            best_interleaved(&mut variants, &mut || flush.run())
        };
        drop(floor);
        let (times, rounds) = times;
        let [t1, t2, o1, o2, tc, tf] = times[..6] else { unreachable!("six variants") };
        let limits = match (&random, &times[6..]) {
            (Some(r), &[g1, g2, s1, s2]) => {
                let (kb1, kb2) =
                    (case.bytes as f64 / t1.as_secs_f64(), case.bytes as f64 / t2.as_secs_f64());
                let (g1, g2) = (r.gather_bandwidth(g1), r.gather_bandwidth(g2));
                let (s1, s2) = (r.scatter_bandwidth(s1), r.scatter_bandwidth(s2));
                format!(
                    "{:.1} / {:.1} | {:.0}% / {:.0}% | {:.1} / {:.1} | {:.0}% / {:.0}%",
                    g1 / 1e9,
                    g2 / 1e9,
                    kb1 / g1 * 100.0,
                    kb2 / g2 * 100.0,
                    s1 / 1e9,
                    s2 / 1e9,
                    kb1 / s1 * 100.0,
                    kb2 / s2 * 100.0
                )
            }
            _ => "- | - | - | -".to_string(),
        };
        drop(random);
        let bw = StreamCopy::bandwidth(tc);
        // Extra memory: the peak during one run beyond inputs and outputs (both already live).
        let before = LIVE.load(Relaxed);
        PEAK.store(before, Relaxed);
        k.run(&case, &pool2);
        let extra = PEAK.load(Relaxed) - before;
        let out = k.outputs();
        // The naive loop: best of two runs, each from cold caches like the kernel's.
        let mut want = Vec::new();
        let tn = best_of_two(|| want = (case.naive)(), || flush.run());
        let agrees = check(&out, &want, case.exact);
        let gbs = case.bytes as f64 / t2.as_secs_f64();
        let failure = failure.into_inner();
        let ort_ok = failure.is_none();
        let (ort_ms, overhead, speedup) = if ort_ok {
            (
                format!("{:.2} / {:.2}", ms(o1), ms(o2)),
                format!("{:+.1}%", (o2.as_secs_f64() / t2.as_secs_f64() - 1.0) * 100.0),
                format!("{:.2}x", o1.as_secs_f64() / o2.as_secs_f64()),
            )
        } else {
            (format!("error: {}", failure.unwrap_or_default()), "-".into(), "-".into())
        };
        println!(
            "| {} | {} | {:.1} | {:.2} | {:.1} | {:.1} | {:.0}% | {:.2} | {:.0}% | {:.2} | {:.2}x | {} | {} | {} | {} | {:.1} | {:.1}x | {:.1} | {} | {} |",
            case.op,
            case.shapes,
            case.bytes as f64 / 1e6,
            ms(t2),
            gbs / 1e9,
            bw / 1e9,
            gbs / bw * 100.0,
            ms(tf),
            tf.as_secs_f64() / t2.as_secs_f64() * 100.0,
            ms(t1),
            t1.as_secs_f64() / t2.as_secs_f64(),
            limits,
            ort_ms,
            speedup,
            overhead,
            ms(tn),
            tn.as_secs_f64() / t2.as_secs_f64(),
            extra as f64 / 1e6,
            match agrees {
                Ok(()) => "yes".to_string(),
                Err(e) => format!("NO: {e}"),
            },
            rounds
        );
    }
}
