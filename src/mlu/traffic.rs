//! What crosses a card's boundaries, counted by the device runtime: copies between host and
//! card and within the card, memsets, launches and queue synchronisations (counted here, on
//! any card), and the GDRAM bytes kernels read and write (counted by the emulated card only;
//! on a real card the runtime cannot see them, and they stay unknown).

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a card's counters since it was opened (all cards of one process share the
/// emulator's GDRAM counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    pub host_to_card: u64,
    pub card_to_host: u64,
    pub card_to_card: u64,
    pub memset: u64,
    pub launches: u64,
    pub syncs: u64,
    /// GDRAM bytes kernels read / wrote (`None`: not observable on this card).
    pub gdram_read: Option<u64>,
    pub gdram_written: Option<u64>,
}

impl Traffic {
    /// What happened between `earlier` and this snapshot.
    pub fn since(&self, earlier: &Traffic) -> Traffic {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let o = |a: Option<u64>, b: Option<u64>| Some(a?.saturating_sub(b?));
        Traffic {
            host_to_card: d(self.host_to_card, earlier.host_to_card),
            card_to_host: d(self.card_to_host, earlier.card_to_host),
            card_to_card: d(self.card_to_card, earlier.card_to_card),
            memset: d(self.memset, earlier.memset),
            launches: d(self.launches, earlier.launches),
            syncs: d(self.syncs, earlier.syncs),
            gdram_read: o(self.gdram_read, earlier.gdram_read),
            gdram_written: o(self.gdram_written, earlier.gdram_written),
        }
    }
}

/// The host-side counters of one card.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) host_to_card: AtomicU64,
    pub(super) card_to_host: AtomicU64,
    pub(super) card_to_card: AtomicU64,
    pub(super) memset: AtomicU64,
    pub(super) launches: AtomicU64,
    pub(super) syncs: AtomicU64,
}

impl Counters {
    pub(super) fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self, gdram: Option<(u64, u64)>) -> Traffic {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Traffic {
            host_to_card: l(&self.host_to_card),
            card_to_host: l(&self.card_to_host),
            card_to_card: l(&self.card_to_card),
            memset: l(&self.memset),
            launches: l(&self.launches),
            syncs: l(&self.syncs),
            gdram_read: gdram.map(|g| g.0),
            gdram_written: gdram.map(|g| g.1),
        }
    }
}
