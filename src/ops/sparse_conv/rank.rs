//! The bitmap rank of kernels/sparse_conv (its mark and rank kernels), one launch sequence
//! for its three users: GetIndicePairs' output sites and DynamicScatter's voxels (their BANG
//! paths), and IndiceConv's distinct destinations per offset (before its MLU-OPS call).

use super::STREAM_TILE;
use super::abi::SparseConvKernels;
use crate::error::Result;
use crate::mlu::TASK_UNION1;
use crate::ops::device::{self, CardRun, DeviceOutputs};

/// The rank kernel's scratch for bitmaps of `words` int32, reused by each bitmap a node
/// ranks: the words' ranks and one total per core of the cluster the kernel runs on.
pub(crate) struct BitmapRank {
    kernels: SparseConvKernels,
    words: i32,
    tile: i32,
    /// Per word of the bitmap ranked last: the set bits before it.
    pub word_rank: *mut i32,
    core_totals: *mut i32,
    /// One cluster: the rank kernel's UNION1 barrier reaches the cores of one cluster only.
    tasks: u32,
}

impl BitmapRank {
    /// The scratch, from the node's workspace (`words` was checked against int32 before).
    pub fn new(card: &CardRun<'_>, outputs: &mut dyn DeviceOutputs, words: usize) -> Result<Self> {
        let tasks = card.device.info.cores_per_cluster;
        Ok(BitmapRank {
            kernels: card.device.kernels()?,
            words: device::bounded("words", words)?,
            tile: device::bounded("tile", STREAM_TILE)?,
            word_rank: outputs.workspace(words * 4)?.cast(),
            core_totals: outputs.workspace(tasks as usize * 4)?.cast(),
            tasks,
        })
    }

    /// Enqueues on the node's queue the marking in `bitmap` of the `count` linear indices at
    /// `src` (`mark_tasks` UNION1 tasks), then the bitmap's rank: [`Self::word_rank`] and,
    /// in `total`, its set bits.
    ///
    /// # Safety
    /// `src` holds `count` int32 in card memory, each below 32 x `words`; `bitmap` holds
    /// `words` zeroed int32 and `total` one; the node's driver synchronises the queue before
    /// they and the workspace are freed.
    pub unsafe fn mark_and_rank(
        &self,
        card: &CardRun<'_>,
        mark_tasks: u32,
        count: i32,
        src: *const i32,
        bitmap: *mut i32,
        total: *mut i32,
    ) -> Result<()> {
        let (k, words, tile) = (&self.kernels, self.words, self.tile);
        // SAFETY: the buffers as the caller guarantees; the launch only enqueues.
        card.queue.launch("bang_get_indice_pairs_mark", |q| unsafe {
            (k.bang_get_indice_pairs_mark)(
                q,
                mark_tasks,
                TASK_UNION1,
                count,
                words,
                tile,
                src,
                bitmap,
            )
        })?;
        // SAFETY: as above; word_rank and core_totals are this scratch's, of their sizes.
        card.queue.launch("bang_get_indice_pairs_rank", |q| unsafe {
            (k.bang_get_indice_pairs_rank)(
                q,
                self.tasks,
                TASK_UNION1,
                words,
                tile,
                bitmap,
                self.word_rank,
                self.core_totals,
                total,
            )
        })
    }
}
