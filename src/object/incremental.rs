//! Collection under a time budget: [`ObjectManager::collect_garbage_for`].

use std::time::{Duration, Instant};

use super::{CollectStats, ObjectManager};

/// Objects destroyed between two looks at the clock.
const BATCH: usize = if cfg!(miri) { 4 } else { 32 };

impl ObjectManager {
    /// Destroys dead objects for about `budget`, leaving the rest queued for
    /// the next call.
    ///
    /// It works in batches of 32 objects (through
    /// [`collect_garbage_budgeted`](Self::collect_garbage_budgeted)) and reads
    /// the clock after each, so it overruns its budget by at most one batch of
    /// `Drop`s. It always runs at least one batch, so repeated calls make
    /// progress even with a zero budget. Nothing is lost between calls:
    /// objects not destroyed stay on the dead lists. Cascades that outlast
    /// the budget also stay queued.
    ///
    /// # Panics
    ///
    /// A panic in a `Drop` impl propagates, as in
    /// [`collect_garbage`](Self::collect_garbage); the manager stays consistent.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Particle { pos: [f32; 2] }
    ///
    /// let mut mm = ObjectManager::new();
    /// for _ in 0..100 {
    ///     drop(mm.create(Particle { pos: [0.0; 2] }));
    /// }
    /// let mut freed = 0;
    /// while mm.dead_count() > 0 {
    ///     freed += mm.collect_garbage_for(Duration::from_micros(50)).objects;
    /// }
    /// assert_eq!(freed, 100);
    /// ```
    pub fn collect_garbage_for(&mut self, budget: Duration) -> CollectStats {
        let start = Instant::now();
        let mut stats = CollectStats::default();
        loop {
            let batch = self.collect_garbage_budgeted(BATCH);
            stats.objects += batch.objects;
            stats.bytes = stats.bytes.saturating_add(batch.bytes);
            stats.rounds += batch.rounds;
            // Fewer than a batch means every dead list was found empty.
            if batch.objects < BATCH || start.elapsed() >= budget {
                return stats;
            }
        }
    }
}
