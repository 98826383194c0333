//! One `MLUExecutionProvider` instance (per session): its card backends, partitioning
//! (`GetCapability`: which backend takes each node, or why none does), the queues its
//! kernels launch on, and the session's counts of those decisions.

use super::EP_NAME;
use super::factory::Factory;
use super::traffic;
use crate::error::{Error, Result};
use crate::ffi::ep_abi::{OrtEp, OrtEpGraphSupportInfo, OrtKernelRegistry};
use crate::ffi::graph::{Graph, Node, SupportInfo};
use crate::ffi::{INFO, Logger, WARNING, cstring, guard, version};
use crate::mlu::{Device, Queue, Traffic};
use crate::ops;
use crate::ops::device::{Backend, CardBackends, Ran};
use crate::schema::{self, Attrs};
use ort_sys::{OrtGraph, OrtStatusPtr};
use serde_json::json;
use std::ffi::{CString, c_char};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One provider's counts of its decisions: nodes claimed per backend and declined (at
/// `GetCapability`, each decline with its reason), node runs per backend, run-time declines
/// and run-time CPU fallbacks. Logged and written
/// to the traffic report when the session ends.
#[derive(Default, Debug)]
pub struct Counts {
    claimed: PerBackend,
    runs: PerBackend,
    /// Run-time declines by a backend whose node then ran on a later one.
    passed_over: PerBackend,
    fallbacks: AtomicUsize,
    /// The nodes declined at `GetCapability`: op, node and reason of each.
    declines: Mutex<Vec<serde_json::Value>>,
}

/// One counter per card backend, in [`Backend::ALL`]'s order.
type PerBackend = [AtomicUsize; Backend::COUNT];

fn count(counters: &PerBackend, b: Backend) {
    counters[b.index()].fetch_add(1, Ordering::Relaxed);
}

/// The counters keyed by the backends' names.
fn per_backend(counters: &PerBackend) -> serde_json::Value {
    let map = Backend::ALL
        .iter()
        .map(|b| (b.name().to_owned(), json!(counters[b.index()].load(Ordering::Relaxed))));
    serde_json::Value::Object(map.collect())
}

impl Counts {
    pub fn ran(&self, ran: &Ran) {
        match ran {
            Ran::Card(b, declined) => {
                for (d, _) in declined {
                    count(&self.passed_over, *d);
                }
                count(&self.runs, *b);
            }
            Ran::Host(_) => {
                self.fallbacks.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn json(&self) -> serde_json::Value {
        let declines = self.declines.lock().unwrap_or_else(|e| e.into_inner());
        json!({
            "claimed": per_backend(&self.claimed),
            "declined": declines.len(),
            "card_runs": per_backend(&self.runs),
            "run_time_declines": per_backend(&self.passed_over),
            "cpu_fallbacks": self.fallbacks.load(Ordering::Relaxed),
            "declines": *declines,
        })
    }
}

/// `base` comes first so ONNX Runtime's `OrtEp*` casts back.
#[repr(C)]
pub struct Ep {
    base: OrtEp,
    name: CString,
    factory: *const Factory,
    device: Arc<Device>,
    card: u32,
    logger: Logger,
    queues: Mutex<Vec<Queue>>,
    backends: CardBackends,
    counts: Counts,
    /// The card's traffic counters when the EP was created (the session line's span).
    created: Traffic,
}

// SAFETY: the raw pointer is the factory, which outlives the EP
// and are only read; the queues are behind a mutex.
unsafe impl Send for Ep {}
// SAFETY: as above.
unsafe impl Sync for Ep {}

fn this<'a>(ep: *const OrtEp) -> &'a Ep {
    // SAFETY: every OrtEp we hand out is the first field of a boxed Ep that lives until
    // the factory's ReleaseEp.
    unsafe { &*(ep as *const Ep) }
}

impl Ep {
    pub fn new(
        factory: *const Factory,
        device: Arc<Device>,
        card: u32,
        logger: Logger,
        backends: CardBackends,
    ) -> Box<Self> {
        let base = OrtEp {
            ort_version_supported: version(),
            GetName: Some(get_name),
            GetCapability: Some(get_capability),
            Compile: None,
            ReleaseNodeComputeInfos: None,
            GetPreferredDataLayout: None,
            ShouldConvertDataLayoutForOp: None,
            SetDynamicOptions: None,
            OnRunStart: None,
            OnRunEnd: None,
            CreateAllocator: None,
            CreateSyncStreamForDevice: None,
            GetCompiledModelCompatibilityInfo: None,
            GetKernelRegistry: Some(get_kernel_registry),
            IsConcurrentRunSupported: Some(is_concurrent_run_supported),
        };
        let created = device.traffic();
        let ep = Box::new(Ep {
            base,
            name: cstring(EP_NAME),
            factory,
            device,
            card,
            logger,
            queues: Mutex::new(Vec::new()),
            backends,
            counts: Counts::default(),
            created,
        });
        let order: Vec<&str> = ep.backends.order.iter().map(|b| b.name()).collect();
        logger.log(
            INFO,
            &format!(
                "{EP_NAME} card backends, in order: {}; MLU-OPS: {}",
                order.join(", "),
                ep.backends.mluops_state()
            ),
        );
        let d = &ep.device.info;
        logger.log(
            INFO,
            &format!(
                "{EP_NAME} created on card {card}: {} ({}), {} clusters x {} cores",
                d.arch,
                if d.emulated {
                    "emulated on the host, no MLU hardware"
                } else {
                    "Cambricon runtime"
                },
                d.clusters,
                d.cores_per_cluster
            ),
        );
        ep
    }

    pub fn into_raw(self: Box<Self>) -> *mut OrtEp {
        Box::into_raw(self).cast()
    }

    /// # Safety
    /// `p` came from [`Ep::into_raw`] and is released once.
    pub unsafe fn release(p: *mut OrtEp) {
        // SAFETY: caller contract.
        let ep = unsafe { Box::from_raw(p as *mut Ep) };
        ep.report();
    }

    /// The session's counts and host<->card bytes, to the log and the traffic report.
    fn report(&self) {
        let mut line = self.counts.json();
        line["session"] = json!(format!("{:p}", self as *const Ep));
        line["mluops"] = json!(self.backends.mluops_state());
        line["traffic"] = traffic::traffic_json(&self.device.traffic().since(&self.created));
        self.logger.log(INFO, &format!("{EP_NAME} session summary: {line}"));
        if traffic::enabled() {
            traffic::append(&line);
        }
    }

    pub fn backends(&self) -> &CardBackends {
        &self.backends
    }

    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    pub fn logger(&self) -> Logger {
        self.logger
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    pub fn card(&self) -> u32 {
        self.card
    }

    /// A queue for one kernel call: an idle one, or a new one.
    pub fn queue(&self) -> Result<Queue> {
        let idle = self.queues.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match idle {
            Some(q) => Ok(q),
            None => self.device.queue(),
        }
    }

    /// Returns a synchronised queue to the idle list.
    pub fn recycle(&self, q: Queue) {
        self.queues.lock().unwrap_or_else(|e| e.into_inner()).push(q);
    }

    /// The backend that takes `node`, or why none does.
    fn choice(&self, node: Node<'_>, op_type: &str) -> Result<(Backend, Vec<String>)> {
        let entry = ops::entry(op_type)
            .ok_or_else(|| Error::declined("not an operator of this library"))?;
        let card = (entry.create_card)(
            &Attrs::new(ops::schema(op_type), &node.attributes()),
            &self.backends,
        )
        .map_err(|e| {
            Error::declined(format!("invalid attributes ({e}); the CPU kernel reports the error"))
        })?;
        let shapes = node
            .input_shapes()
            .map_err(|m| Error::declined(format!("its input shapes cannot be read: {m}")))?;
        card.static_choice(&self.device.info, Some(&shapes))
    }
}

unsafe extern "system" fn get_name(ep: *const OrtEp) -> *const c_char {
    this(ep).name.as_ptr()
}

fn capability(ep: &Ep, graph: Graph<'_>, info: SupportInfo<'_>) -> Result<()> {
    for node in graph.nodes()? {
        if node.domain()? != schema::DOMAIN {
            continue;
        }
        let op_type = node.op_type()?;
        let name = node.name()?;
        let choice = if info.has_kernel(node)? {
            ep.choice(node, &op_type)
        } else {
            Err(Error::declined("no card kernel is registered for it"))
        };
        match choice {
            Ok((backend, passed_over)) => {
                info.claim(node)?;
                count(&ep.counts.claimed, backend);
                let after = if passed_over.is_empty() {
                    String::new()
                } else {
                    format!(" (passed over: {})", passed_over.join("; "))
                };
                ep.logger.log(
                    INFO,
                    &format!(
                        "{EP_NAME}: mluops.{op_type} node '{name}' runs on MLU card {} with backend {}{after}",
                        ep.card,
                        backend.name()
                    ),
                );
            }
            Err(why) => {
                let decline = json!({"op": op_type, "node": name, "why": why.to_string()});
                ep.counts.declines.lock().unwrap_or_else(|e| e.into_inner()).push(decline);
                ep.logger.log(
                    WARNING,
                    &format!(
                        "{EP_NAME} declines mluops.{op_type} node '{name}' (it runs on CPU): {why}"
                    ),
                );
            }
        }
    }
    Ok(())
}

unsafe extern "system" fn get_capability(
    ep: *mut OrtEp,
    graph: *const OrtGraph,
    info: *mut OrtEpGraphSupportInfo,
) -> OrtStatusPtr {
    let ep = this(ep);
    // SAFETY: ORT's graph and support info, live for this call.
    let (graph, info) = unsafe { (Graph::from_raw(graph), SupportInfo::from_raw(info)) };
    guard("MLUExecutionProvider GetCapability", || {
        capability(ep, graph, info)
            .map_err(|m| Error::Runtime(format!("{EP_NAME} GetCapability: {m}")))
    })
}

unsafe extern "system" fn get_kernel_registry(
    ep: *mut OrtEp,
    out: *mut *const OrtKernelRegistry,
) -> OrtStatusPtr {
    let ep = this(ep);
    guard("MLUExecutionProvider GetKernelRegistry", || {
        // SAFETY: the factory outlives the EPs it creates.
        let r = unsafe { &*ep.factory }
            .registry()
            .map_err(|e| Error::Runtime(format!("{EP_NAME}: kernel registry: {e}")))?;
        // SAFETY: ORT's out pointer.
        unsafe { *out = r };
        Ok(())
    })
}

unsafe extern "system" fn is_concurrent_run_supported(
    _: *mut OrtEp,
    out: *mut bool,
) -> OrtStatusPtr {
    guard("MLUExecutionProvider IsConcurrentRunSupported", || {
        // SAFETY: ORT's out pointer. Every kernel call takes its own queue.
        unsafe { *out = true };
        Ok(())
    })
}
