//! The per-node traffic report: with `MLU_EP_TRAFFIC=<path>` set, every run of a claimed
//! node appends one JSON line to `<path>` with what crossed the card's boundaries during
//! it (`crate::mlu::Traffic`) and the least the operator must read and write (its inputs'
//! and outputs' bytes). The counters are per card: nodes that run at the same time on one
//! card share them, so the report is exact for one node at a time (`models/run_zoo.py
//! --traffic` runs sessions that way).

use crate::mlu::Traffic;
use std::io::Write;
use std::sync::Mutex;

/// The report file, when `MLU_EP_TRAFFIC` names one.
pub fn enabled() -> bool {
    std::env::var_os("MLU_EP_TRAFFIC").is_some()
}

/// Appends one node run's line; a report that cannot be written is logged, never an error
/// of the node.
pub fn record(op: &str, node: &str, t: &Traffic, minimum: usize) {
    static FILE: Mutex<()> = Mutex::new(());
    let Some(path) = std::env::var_os("MLU_EP_TRAFFIC") else { return };
    let json = |v: Option<u64>| v.map_or_else(|| "null".to_string(), |v| v.to_string());
    let line = format!(
        "{{\"op\":\"{op}\",\"node\":{node:?},\"h2d\":{},\"d2h\":{},\"d2d\":{},\"memset\":{},\"gdram_read\":{},\
         \"gdram_write\":{},\"launches\":{},\"syncs\":{},\"minimum\":{minimum}}}\n",
        t.host_to_card,
        t.card_to_host,
        t.card_to_card,
        t.memset,
        json(t.gdram_read),
        json(t.gdram_written),
        t.launches,
        t.syncs,
    );
    let _one_writer = FILE.lock().unwrap_or_else(|e| e.into_inner());
    let written = std::fs::OpenOptions::new().create(true).append(true).open(&path).and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        log::warn!("MLU_EP_TRAFFIC={}: {e}", path.to_string_lossy());
    }
}
