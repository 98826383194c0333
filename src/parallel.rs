//! Work splitting. Kernels describe their work as `tasks` independent pieces; a [`Parallel`]
//! runs them. Inside ONNX Runtime the pieces go to the session's intra-op thread pool
//! (`KernelContext_ParallelFor`, see src/ffi/kernel.rs); tests and benches use [`Threads`].
//! Kernels must not let results depend on how tasks are scheduled.

use std::sync::atomic::{AtomicUsize, Ordering};

pub trait Parallel: Sync {
    /// Runs `f(t)` for every `t` in `0..tasks`, possibly concurrently, and returns when all
    /// have finished.
    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync));
}

/// Runs every task on the calling thread, in order.
pub struct Serial;

impl Parallel for Serial {
    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        (0..tasks).for_each(f);
    }
}

/// Runs tasks on `n` scoped threads (the caller is one of them), handing them out one by
/// one so uneven tasks balance.
pub struct Threads(pub usize);

impl Threads {
    /// As many threads as the machine has cores.
    pub fn all() -> Self {
        Threads(std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

impl Parallel for Threads {
    fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        let workers = self.0.max(1).min(tasks);
        if workers <= 1 {
            return Serial.run(tasks, f);
        }
        let next = AtomicUsize::new(0);
        let work = || {
            loop {
                let t = next.fetch_add(1, Ordering::Relaxed);
                if t >= tasks {
                    break;
                }
                f(t);
            }
        };
        std::thread::scope(|s| {
            for _ in 1..workers {
                s.spawn(work);
            }
            work();
        });
    }
}

/// A mutable slice shared by tasks that write disjoint parts of it.
struct SharedMut<T>(*mut T, usize);
// SAFETY: the pointer is only used through `chunk`, whose callers guarantee that
// concurrently used ranges are disjoint; T: Send makes handing elements across threads sound.
unsafe impl<T: Send> Sync for SharedMut<T> {}

impl<T> SharedMut<T> {
    /// # Safety
    /// `start..end` must lie inside the slice and no other live reference may overlap it.
    // Handing out `&mut` from `&self` is the point: tasks share `self`, each owning a range.
    #[allow(clippy::mut_from_ref)]
    unsafe fn chunk(&self, start: usize, end: usize) -> &mut [T] {
        debug_assert!(start <= end && end <= self.1);
        // SAFETY: guaranteed by the caller (in bounds, not aliased).
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), end - start) }
    }
}

/// Splits `data` into consecutive chunks of `chunk_len` elements (the last may be shorter)
/// and calls `f(chunk_index, chunk)` for each, in parallel.
pub fn for_each_chunk_mut<T: Send>(
    par: &dyn Parallel,
    data: &mut [T],
    chunk_len: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let len = data.len();
    if len == 0 {
        return;
    }
    let chunk_len = chunk_len.max(1);
    let tasks = len.div_ceil(chunk_len);
    let shared = SharedMut(data.as_mut_ptr(), len);
    par.run(tasks, &|t| {
        let start = t * chunk_len;
        let end = (start + chunk_len).min(len);
        // SAFETY: task t owns elements [t*chunk_len, min((t+1)*chunk_len, len)), which are
        // in bounds and disjoint from every other task's range; `data` is borrowed mutably
        // for the whole call, so nothing else aliases it.
        f(t, unsafe { shared.chunk(start, end) });
    });
}

/// Splits `data` at the given increasing boundaries (`bounds[0] == 0`, last == len) and
/// calls `f(part_index, part)` for each part, in parallel.
pub fn for_each_part_mut<T: Send>(
    par: &dyn Parallel,
    data: &mut [T],
    bounds: &[usize],
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    assert!(
        bounds.first() == Some(&0)
            && bounds.last() == Some(&data.len())
            && bounds.windows(2).all(|w| w[0] <= w[1]),
        "part bounds must be increasing from 0 to the slice length"
    );
    let shared = SharedMut(data.as_mut_ptr(), data.len());
    par.run(bounds.len() - 1, &|t| {
        // SAFETY: bounds are increasing from 0 to len (checked above), so part t is in
        // bounds and disjoint from every other part; `data` is mutably borrowed throughout.
        f(t, unsafe { shared.chunk(bounds[t], bounds[t + 1]) });
    });
}

/// Cuts a run of weighted items into at most `parts` consecutive pieces (at least one) of
/// about equal weight. Returns the piece boundaries as item indices, increasing from 0 to the
/// item count (empty pieces dropped): a piece ends after the item whose cumulative weight
/// first reaches k / parts of the total. A function of the weights alone, like [`pieces`].
/// Exact while items * parts < 2^64 (sums are in u128, and more parts than items are
/// pointless, so `parts` is first cut to the item count).
pub fn balanced_cuts(weights: impl Iterator<Item = u64> + Clone, parts: usize) -> Vec<usize> {
    let (total, n) = weights.clone().fold((0u128, 0usize), |(t, n), w| (t + u128::from(w), n + 1));
    let parts = parts.clamp(1, n.max(1));
    let (mut cuts, mut done, mut items) = (vec![0], 0u128, 0);
    for (i, w) in weights.enumerate() {
        done += u128::from(w);
        items = i + 1;
        if cuts.len() < parts
            && done.saturating_mul(parts as u128) >= total.saturating_mul(cuts.len() as u128)
        {
            cuts.push(items);
        }
    }
    cuts.push(items);
    cuts.dedup();
    cuts
}

/// Number of pieces to cut `work` units into so that each piece has at least `grain` units
/// (at least one piece). Independent of the thread count, so results that depend on the
/// split stay the same whatever the pool size.
pub fn pieces(work: usize, grain: usize) -> usize {
    work.div_ceil(grain.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balanced_cuts_split_the_weight_evenly() {
        assert_eq!(balanced_cuts([1u64, 1, 1, 1].into_iter(), 2), [0, 2, 4]);
        assert_eq!(balanced_cuts([5u64, 0, 0, 1, 1, 1].into_iter(), 2), [0, 1, 6]);
        // More parts than items, zero weights, one part, no items.
        assert_eq!(balanced_cuts([0u64, 0, 0].into_iter(), 5), [0, 1, 2, 3]);
        assert_eq!(balanced_cuts([3u64, 4].into_iter(), 1), [0, 2]);
        // No parts still makes one piece; extreme weights and part counts do not overflow.
        assert_eq!(balanced_cuts([3u64, 4].into_iter(), 0), [0, 2]);
        assert_eq!(balanced_cuts([u64::MAX, u64::MAX].into_iter(), usize::MAX), [0, 1, 2]);
        assert_eq!(balanced_cuts([u64::MAX; 4].into_iter(), 2), [0, 2, 4]);
        assert_eq!(balanced_cuts(std::iter::empty::<u64>(), 3), [0]);
    }

    #[test]
    fn chunks_cover_everything_once() {
        let mut v = vec![0u32; 1001];
        for_each_chunk_mut(&Threads(3), &mut v, 64, |t, c| {
            for (i, x) in c.iter_mut().enumerate() {
                *x += (t * 64 + i) as u32;
            }
        });
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u32));
    }

    #[test]
    fn parts_follow_bounds() {
        let mut v = vec![0usize; 10];
        for_each_part_mut(&Threads(2), &mut v, &[0, 3, 3, 10], |t, c| {
            c.iter_mut().for_each(|x| *x = t)
        });
        assert_eq!(v, [0, 0, 0, 2, 2, 2, 2, 2, 2, 2]);
    }
}
