//! Work two threads share out (a one-shot evaluation's renders and
//! verdicts): chunks taken in turn, results put back in item order. Only
//! for speed; nothing here decides a meaning.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::ScopedJoinHandle;

/// Triggers of one rule a one-shot render splits between two threads.
pub(super) const SPLIT_MIN: usize = 64;

/// Items two threads share out: each takes the next [`CHUNK`] until none
/// are left, so the slower one (colder caches, descheduled) takes fewer
/// and neither waits long for the other.
pub(super) struct Chunks<'a, I> {
    items: &'a [I],
    next: AtomicUsize,
}

/// Items a thread takes at a time from [`Chunks`].
const CHUNK: usize = 8;

impl<'a, I> Chunks<'a, I> {
    pub(super) fn new(items: &'a [I]) -> Self {
        Chunks {
            items,
            next: AtomicUsize::new(0),
        }
    }

    /// Maps chunks until none are left: each with the index of its first
    /// item.
    pub(super) fn run<R>(&self, mut f: impl FnMut(&I) -> R) -> Done<R> {
        let mut done = Vec::new();
        loop {
            let start = self.next.fetch_add(CHUNK, Ordering::Relaxed);
            if start >= self.items.len() {
                return done;
            }
            let end = (start + CHUNK).min(self.items.len());
            done.push((start, self.items[start..end].iter().map(&mut f).collect()));
        }
    }
}

/// The chunks one thread did: each chunk's first index and its results.
pub(super) type Done<R> = Vec<(usize, Vec<R>)>;

/// The chunks a second thread did: none when it could not start (this
/// thread then took every chunk); its panic goes on as this thread's.
pub(super) fn joined<R>(other: std::io::Result<ScopedJoinHandle<'_, Done<R>>>) -> Done<R> {
    match other {
        Ok(handle) => handle
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        Err(_) => Vec::new(),
    }
}

/// Two threads' results from [`Chunks::run`], in item order.
pub(super) fn merge_chunks<R>(mut a: Done<R>, b: Done<R>) -> Vec<R> {
    a.extend(b);
    a.sort_unstable_by_key(|(start, _)| *start);
    // Sized at once: collecting a flat_map would grow it by doubling.
    let mut out = Vec::with_capacity(a.iter().map(|(_, r)| r.len()).sum());
    for (_, r) in a {
        out.extend(r);
    }
    out
}
