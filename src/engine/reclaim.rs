//! Freeing what an incremental evaluation discards, off its path.
//!
//! A revision's change replaces the lists, vars and expansions its family
//! kept: thousands of small allocations, about a tenth of the change's
//! cost to free. Nothing waits for that memory, so it is handed to one
//! background thread and freed there; the evaluation returns sooner. The
//! queue is bounded: when it is full (or no thread could be started) the
//! caller frees the values itself, so memory never grows behind a slow
//! freer.

use std::sync::OnceLock;
use std::sync::mpsc::{SyncSender, TrySendError, sync_channel};

/// Batches waiting to be freed at most; past it the evaluation frees its
/// own.
const QUEUE: usize = 64;

/// Values no longer needed, collected during an evaluation.
#[derive(Default)]
pub(super) struct Discarded(Vec<Box<dyn Send>>);

impl Discarded {
    /// Keeps `value` to be freed later.
    pub fn push<T: Send + 'static>(&mut self, value: T) {
        self.0.push(Box::new(value));
    }

    /// `map.retain(keep)`, with what it removes kept to be freed later.
    pub fn retain<K, V, S>(
        &mut self,
        map: &mut std::collections::HashMap<K, V, S>,
        mut keep: impl FnMut(&K, &V) -> bool,
    ) where
        K: Send + 'static,
        V: Send + 'static,
    {
        self.0.extend(
            map.extract_if(|k, v| !keep(k, v))
                .map(|e| -> Box<dyn Send> { Box::new(e) }),
        );
    }

    /// Frees the values on the background thread, or here when it cannot
    /// take them.
    pub fn free_later(self) {
        if self.0.is_empty() {
            return;
        }
        let Some(tx) = freer() else { return };
        match tx.try_send(self) {
            Ok(()) => {}
            Err(TrySendError::Full(d) | TrySendError::Disconnected(d)) => drop(d),
        }
    }
}

/// The background thread's queue, started on first use; `None` when the
/// thread could not be started.
fn freer() -> Option<&'static SyncSender<Discarded>> {
    static TX: OnceLock<Option<SyncSender<Discarded>>> = OnceLock::new();
    TX.get_or_init(|| {
        let (tx, rx) = sync_channel::<Discarded>(QUEUE);
        std::thread::Builder::new()
            .name("rbac-rules-free".into())
            .spawn(move || rx.into_iter().for_each(drop))
            .ok()
            .map(|_| tx)
    })
    .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    #[test]
    fn discarded_values_are_freed() {
        let held = Arc::new(());
        let mut map: std::collections::HashMap<u32, Arc<()>> =
            (0..10).map(|i| (i, Arc::clone(&held))).collect();
        let mut d = Discarded::default();
        d.retain(&mut map, |k, _| k % 2 == 0);
        d.push(Arc::clone(&held));
        assert_eq!(map.len(), 5);
        // Held here, by the map's ten (five now discarded) and the pushed one.
        assert_eq!(Arc::strong_count(&held), 12);
        d.free_later();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&held) > 6 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        // The map's five, and this one.
        assert_eq!(Arc::strong_count(&held), 6);
    }
}
